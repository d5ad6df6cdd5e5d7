# SDPA's own error on each parity case does not depend on the variant: one job per card measures
# it for every variant's parity job (cuDNN builds a plan for each new case shape, about 3 s a job).
rule sdpa_parity:
    input:
        **stage_inputs("scripts/run_sdpa_parity.py"),
    output:
        json="results/baseline/sdpa_parity.json",
    log:
        "results/logs/sdpa_parity.log",
    conda:
        "../../envs/runtime.yaml"
    params:
        device=DEVICE_ID,
        cfg=config_json("parity"),
    resources:
        **gpu_request(),
    shell:
        logged("python3 {input.script} --config-json {params.cfg:q} --out {output.json}")


rule parity:
    input:
        build=rules.build_variant.output.verdict,
        sdpa_errors=rules.sdpa_parity.output.json,
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
               " --sdpa-errors {input.sdpa_errors} --config-json {params.cfg:q} --out {output.json}")
