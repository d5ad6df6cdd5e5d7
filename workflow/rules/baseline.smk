rule sdpa_baseline:
    input:
        env=rules.env_capture.output.json,
        **stage_inputs("scripts/run_baseline.py"),
    output:
        json="results/baseline/sdpa.json",
        csv=report("results/baseline/sdpa.csv", caption="../report/baseline.rst", category="4. Baseline"),
    log:
        "results/logs/sdpa_baseline.log",
    conda:
        "../../envs/runtime.yaml"
    params:
        device=DEVICE_ID,
        cfg=config_json("shape_suites", "baseline_suite", "dtypes", "timing", "cpu_baseline_max_gflop"),
    resources:
        **timing_request(),
    shell:
        logged("python3 {input.script} --env {input.env} --config-json {params.cfg:q}"
               " --json {output.json} --csv {output.csv}")
