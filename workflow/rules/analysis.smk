rule analysis:
    input:
        env=rules.env_capture.output.json,
        csv=rules.ncu.output.csv,
        status=rules.ncu.output.status,
        **stage_inputs("scripts/analyze_profile.py"),
    output:
        json="results/analysis/{variant}/bottlenecks.json",
        md=report("results/analysis/{variant}/bottlenecks.md", caption="../report/bottlenecks.rst", category="3. Bottlenecks", subcategory="{variant}"),
    log:
        "results/logs/analysis/{variant}.log",
    conda:
        "../../envs/runtime.yaml"
    params:
        cfg=config_json("profile"),
    shell:
        logged("python3 {input.script} --entry {wildcards.variant} --env {input.env} --csv {input.csv}"
               " --status {input.status} --config-json {params.cfg:q} --json {output.json}"
               " --md {output.md}")
