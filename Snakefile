# evo-sdpa: the kernel roadmap as a DAG. env -> baseline; build -> sanitizer -> parity -> bench
# -> ncu -> analysis per variant; final summary over all. README.md says how to run it.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"


wildcard_constraints:
    variant="[A-Za-z0-9_]+",


include: "workflow/rules/env.smk"
include: "workflow/rules/baseline.smk"
include: "workflow/rules/build.smk"
include: "workflow/rules/sanitizer.smk"
include: "workflow/rules/parity.smk"
include: "workflow/rules/bench.smk"
include: "workflow/rules/ncu.smk"
include: "workflow/rules/analysis.smk"
include: "workflow/rules/summary.smk"
include: "workflow/rules/evolve.smk"


rule all:
    default_target: True
    input:
        rules.final_summary.output,
