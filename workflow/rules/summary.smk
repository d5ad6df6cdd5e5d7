# The summary job also appends this run's entry to results/history/<device>/ (a new file, never
# rewritten): the history is not an output, so no rerun ever deletes it; `history_entry` is the
# pointer to the entry this run wrote, which the gates read.
rule final_summary:
    input:
        unpack(lambda wildcards: summary_inputs()),
        **stage_inputs("scripts/summarize.py"),
    # update(): Snakemake keeps the previous summary until this job succeeds, and restores it
    # if the job fails (a damaged result then costs one line, not the last good summary); the
    # onerror handler below dates what it restored, so the next run makes it again.
    output:
        md=report(update("results/final/final_summary.md"), caption="../report/summary.rst", category="1. Summary"),
        leaderboard=update("results/final/leaderboard.json"),
        plot=report(update("results/final/speedup.png"), caption="../report/speedup.rst", category="2. Plots"),
        roofline=report(update("results/final/roofline.png"), caption="../report/roofline.rst", category="2. Plots"),
        latency=report(update("results/final/latency.png"), caption="../report/latency.rst", category="2. Plots"),
        evolution=report(update("results/final/evolution.png"), caption="../report/evolution.rst", category="2. Plots"),
        history_entry=update("results/final/history_entry.json"),
    log:
        "results/logs/final_summary.log",
    conda:
        "../../envs/runtime.yaml"
    params:
        variants=SELECTED,
        history=HISTORY,
        layout=lambda wildcards: results_layout(),
        cfg=config_json("gates", "bench_suite", "shape_suites", "profile"),
    shell:
        logged("python3 {input.script} --layout {params.layout:q} --history {params.history} --variants {params.variants}"
               " --config-json {params.cfg:q} --md {output.md} --leaderboard {output.leaderboard}"
               " --plot {output.plot} --roofline {output.roofline} --latency {output.latency}"
               " --evolution {output.evolution} --history-entry {output.history_entry}")


onerror:
    date_restored_summary("final_summary", rules.final_summary.output)


# Short CPU jobs on the submitting host: a cluster job restores no update() output (its own
# process keeps the backup and drops it), so the summary would lose its last good version there.
localrules:
    final_summary,
    gates,


rule gates:
    input:
        leaderboard=rules.final_summary.output.leaderboard,
        history_entry=rules.final_summary.output.history_entry,
        **stage_inputs("scripts/check_gates.py"),
    output:
        "results/final/gates.json",
    log:
        "results/logs/gates.log",
    conda:
        "../../envs/runtime.yaml"
    params:
        history=HISTORY,
        cfg=config_json("gates"),
    shell:
        logged("python3 {input.script} --leaderboard {input.leaderboard} --history-entry {input.history_entry}"
               " --history {params.history} --config-json {params.cfg:q} --out {output}", notices=True, stdout=False)


# The reproducibility bundle: everything the run measured and the code and config that measured
# it, with checksums, and rerun_bench.py to time one variant again from the bundle.
rule bundle:
    input:
        summary=rules.final_summary.output.md,
        leaderboard=rules.final_summary.output.leaderboard,
        **stage_inputs("scripts/make_bundle.py"),
    output:
        "results/final/bundle.tar.gz",
    log:
        "results/logs/bundle.log",
    conda:
        "../../envs/runtime.yaml"
    params:
        cc=BUILD_CC,
        cfg=config_json(*sorted(config)),
    shell:
        logged("python3 {input.script} --results results --leaderboard {input.leaderboard} --compute-capability {params.cc}"
               " --config-json {params.cfg:q} --out {output}")
