"""One evolution candidate's GPU work in a process of its own, so a kernel that faults ends this
process and not the search: `--step build` compiles a Triton candidate by launching it, `gate` and
`final` run the config's gate and final parity tiers, `measure` times it against SDPA's default
with the bench stage's run(). Writes one JSON record to --out; the search reads it back."""
import json
from pathlib import Path

from evo_sdpa.candidates import StageConfig, build_into, measure_step, parity_step
from evo_sdpa.cli import config_arg, parser, setup_logging
from evo_sdpa.errors import run_stage
from evo_sdpa.io import CEILINGS, read_env, read_json, write_json
from evo_sdpa.variants import load_variant

TIERS = {"gate": "gate_tier", "final": "final_tier"}


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--step", required=True, choices=["build", "gate", "measure", "final"])
    p.add_argument("--variant", required=True)
    p.add_argument("--variant-dir", required=True, help="the candidate's variant folder")
    p.add_argument("--tunables", required=True, type=json.loads, help="the candidate's tunable values (JSON)")
    p.add_argument("--build", required=True, help="the candidate's build verdict (written by --step build)")
    p.add_argument("--env", required=True)
    p.add_argument("--compute-capability", required=True)
    config_arg(p)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    log = setup_logging()
    stage = StageConfig(args.compute_capability, args.config_json)
    variant = load_variant(Path(args.variant_dir))
    if args.step == "build":
        result = build_into(variant, args.tunables, Path(args.build).parent, stage)
    elif args.step in TIERS:
        result = parity_step(variant, read_json(args.build), stage, TIERS[args.step])
    else:
        result = measure_step(variant, read_json(args.build), stage, read_env(args.env, CEILINGS)["ceilings"], log)
    log.info("%s %s: %s %s", args.step, args.variant_dir, result["status"], "; ".join(result.get("reasons") or []))
    write_json(args.out, result)


if __name__ == "__main__":
    run_stage(main)
