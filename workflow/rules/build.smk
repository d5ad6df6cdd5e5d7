rule build_variant:
    input:
        sources=get_variant_sources,
        **stage_inputs("scripts/build_variant.py"),
    output:
        verdict="results/build/{variant}/verdict.json",
        resources="results/build/{variant}/resources.json",
        compiler_log="results/build/{variant}/compiler.log",
    log:
        "results/logs/build/{variant}.log",
    conda:
        "../../envs/cuda.yaml"
    params:
        cc=BUILD_CC,
        device=DEVICE_ID,
        cfg=config_json("build"),
    threads: build_threads
    resources:
        gpu=build_gpu_slots,
        quiet_host=build_quiet_shares,
    shell:
        logged("python3 {input.script} --variant {wildcards.variant} --compute-capability {params.cc}"
               " --config-json {params.cfg:q} --verdict {output.verdict} --resources {output.resources}"
               " --compiler-log {output.compiler_log} --jobs {threads}")
