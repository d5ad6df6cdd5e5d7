"""Gate target: exit non-zero when a configured gate fails (for CI on a GPU host)."""
from evo_sdpa.cli import config_arg, parser
from evo_sdpa.errors import fail, run_stage
from evo_sdpa.gates import evaluate
from evo_sdpa.io import read_json, write_json


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--leaderboard", required=True)
    config_arg(p)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    failures = evaluate(read_json(args.leaderboard), args.config_json["gates"])
    if failures:
        fail("gate failed: " + "; ".join(failures))
    write_json(args.out, {"status": "pass", "gates": args.config_json["gates"]})


if __name__ == "__main__":
    run_stage(main)
