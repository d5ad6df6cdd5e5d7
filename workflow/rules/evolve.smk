# The evolution beside the main line: a search over one variant's tunables (or, with a proposer
# command, its code), after the variant's own chain up to its bottleneck analysis. The job holds
# the GPU: candidates build on its threads, then are gated and timed one at a time. Without a GPU
# it exits 0 with best.json "skipped" and repeats its one `evo-sdpa:` line on the console.
rule evolve:
    input:
        unpack(get_evolve_inputs),
        **stage_inputs("scripts/evolve_variant.py", "scripts/evolve_candidate.py", "scripts/sanitizer_target.py"),
    output:
        best="results/evolve/{variant}/best.json",
        curve="results/evolve/{variant}/curve.json",
    log:
        "results/logs/evolve/{variant}.log",
    conda:
        "../../envs/cuda.yaml"
    params:
        cc=BUILD_CC,
        device=DEVICE_ID,
        cfg=config_json("evolve", "shape_suites", "timing", "tolerance", "parity", "sanitizer", "stages", "build"),
    threads: host_threads()
    resources:
        **timing_request(),
    shell:
        logged("python3 {input.script} --variant {wildcards.variant} --env {input.env} --analysis {input.analysis}"
               " --compute-capability {params.cc} --device {params.device:q} --jobs {threads}"
               " --config-json {params.cfg:q} --best {output.best} --curve {output.curve}", notices=True)
