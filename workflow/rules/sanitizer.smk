rule sanitizer:
    input:
        build=rules.build_variant.output.verdict,
        sources=get_variant_sources,
        **stage_inputs("scripts/run_sanitizer.py", "scripts/sanitizer_target.py"),
    output:
        verdict="results/sanitizer/{variant}/verdict.json",
    log:
        "results/logs/sanitizer/{variant}.log",
    conda:
        "../../envs/cuda.yaml"
    params:
        device=DEVICE_ID,
        enabled=config["stages"]["sanitizer"],
        cfg=config_json("sanitizer"),
    resources:
        **gpu_request(),
    shell:
        logged("python3 {input.script} --variant {wildcards.variant} --build {input.build}"
               " --enabled {params.enabled} --config-json {params.cfg:q} --verdict {output.verdict}")
