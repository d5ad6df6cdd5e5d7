rule env_capture:
    input:
        **stage_inputs("scripts/capture_env.py"),
    output:
        json="results/env/environment.json",
    log:
        "results/logs/env_capture.log",
    conda:
        "../../envs/cuda.yaml"
    params:
        device=DEVICE_ID,
    resources:
        gpu=1 if GPU else 0,
    shell:
        "python3 {input.script} --out {output.json} > {log} 2>&1 || (tail -n 1 {log} >&2; exit 1)"
