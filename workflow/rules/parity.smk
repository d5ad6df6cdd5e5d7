rule parity:
    input:
        build=rules.build_variant.output.verdict,
        sources=get_variant_sources,
        **stage_inputs("scripts/run_parity.py"),
    output:
        json=report("results/parity/{variant}.json", caption="../report/parity.rst", category="6. Parity", subcategory="{variant}"),
    log:
        "results/logs/parity/{variant}.log",
    conda:
        "../../envs/runtime.yaml"
    params:
        device=DEVICE_ID,
        cfg=config_json("parity", "tolerance"),
    resources:
        **gpu_request(),
    shell:
        logged("python3 {input.script} --variant {wildcards.variant} --build {input.build}"
               " --config-json {params.cfg:q} --out {output.json}")
