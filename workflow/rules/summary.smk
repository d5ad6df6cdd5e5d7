rule final_summary:
    input:
        unpack(lambda wildcards: summary_inputs()),
        **stage_inputs("scripts/summarize.py"),
    # update(): Snakemake keeps the previous summary until this job succeeds, and restores it
    # if the job fails (a damaged result then costs one line, not the last good summary).
    output:
        md=update("results/final/final_summary.md"),
        leaderboard=update("results/final/leaderboard.json"),
        plot=update("results/final/speedup.png"),
    log:
        "results/logs/final_summary.log",
    conda:
        "../../envs/runtime.yaml"
    params:
        variants=SELECTED,
        cfg=config_json("gates", "bench_suite", "shape_suites", "profile"),
    shell:
        "python3 {input.script} --results results --variants {params.variants}"
        " --config-json {params.cfg:q} --md {output.md} --leaderboard {output.leaderboard}"
        " --plot {output.plot} > {log} 2>&1 || (tail -n 1 {log} >&2; exit 1)"


rule gates:
    input:
        leaderboard=rules.final_summary.output.leaderboard,
        **stage_inputs("scripts/check_gates.py"),
    output:
        "results/final/gates.json",
    log:
        "results/logs/gates.log",
    conda:
        "../../envs/runtime.yaml"
    params:
        cfg=config_json("gates"),
    shell:
        "python3 {input.script} --leaderboard {input.leaderboard} --config-json {params.cfg:q}"
        " --out {output} 2> {log} || (tail -n 1 {log} >&2; exit 1)"
