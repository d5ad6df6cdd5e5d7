rule ncu:
    input:
        unpack(get_profile_inputs),
        **stage_inputs("scripts/run_ncu.py", "scripts/ncu_target.py"),
    output:
        csv="results/nsight/{variant}/report.csv",
        status="results/nsight/{variant}/status.json",
    log:
        "results/logs/ncu/{variant}.log",
    conda:
        "../../envs/cuda.yaml"
    params:
        # A variant's build verdict and bench record, which decide whether and what it profiles.
        chain=lambda wildcards, input: (
            "" if wildcards.variant == SDPA_ENTRY else f"--build {input.build} --bench {input.bench}"),
        device=DEVICE_ID,
        enabled=config["stages"]["ncu"],
        cfg=config_json("profile"),
    resources:
        **gpu_request(),
    # A profile that could not be taken here is a verdict (exit 0, an empty report.csv): its
    # one `evo-sdpa:` line is repeated on the console, not left in status.json alone.
    shell:
        logged("python3 {input.script} --entry {wildcards.variant} {params.chain} --enabled {params.enabled}"
               " --config-json {params.cfg:q} --csv {output.csv} --status {output.status}", notices=True)
