rule bench:
    input:
        env=rules.env_capture.output.json,
        build=rules.build_variant.output.verdict,
        sanitizer=rules.sanitizer.output.verdict,
        parity=rules.parity.output.json,
        sources=get_variant_sources,
        **stage_inputs("scripts/run_bench.py"),
    output:
        json=report("results/bench/{variant}.json", caption="../report/bench.rst", category="7. Bench", subcategory="{variant}"),
    log:
        "results/logs/bench/{variant}.log",
    conda:
        "../../envs/runtime.yaml"
    params:
        device=DEVICE_ID,
        cfg=config_json("shape_suites", "bench_suite", "dtypes", "timing", "tolerance"),
    resources:
        **timing_request(),
    shell:
        logged("python3 {input.script} --variant {wildcards.variant} --env {input.env}"
               " --build {input.build} --sanitizer {input.sanitizer} --parity {input.parity}"
               " --config-json {params.cfg:q} --out {output.json}")
