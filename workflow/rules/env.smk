rule env_capture:
    input:
        **stage_inputs("scripts/capture_env.py"),
    output:
        json=report("results/env/environment.json", caption="../report/environment.rst", category="5. Environment"),
    log:
        "results/logs/env_capture.log",
    conda:
        "../../envs/cuda.yaml"
    params:
        device=DEVICE_ID,
    resources:
        **gpu_request(),
    shell:
        logged("python3 {input.script} --out {output.json}")
