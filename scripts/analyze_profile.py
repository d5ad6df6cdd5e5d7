"""Stage: ranked bottlenecks (metric, lever) and roofline position from one Nsight Compute profile."""
from evo_sdpa.bottlenecks import analyze, render_markdown
from evo_sdpa.cli import config_arg, parser, setup_logging
from evo_sdpa.errors import run_stage
from evo_sdpa.gating import root_cause, skipped_for
from evo_sdpa.io import DEVICE_CEILINGS, read_env, read_record, write_json, write_text
from evo_sdpa.ncu import read_raw_csv
from evo_sdpa.shapes import Shape


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--entry", required=True)
    p.add_argument("--env", required=True)
    p.add_argument("--csv", required=True)
    p.add_argument("--status", required=True)
    config_arg(p)
    p.add_argument("--json", required=True)
    p.add_argument("--md", required=True)
    args = p.parse_args()
    log = setup_logging()
    status = read_record(args.status)
    title = f"Bottlenecks: {args.entry}"
    if status["status"] != "measured":
        result = skipped_for("not analysed", root_cause("ncu", status), entry=args.entry)
        markdown = f"# {title}\n\n{result['reasons'][0]}.\n"
    else:
        profile_cfg = args.config_json["profile"]
        shape = Shape.from_dict(profile_cfg["shape"])
        env = read_env(args.env, DEVICE_CEILINGS)
        result = analyze(read_raw_csv(args.csv), flops=shape.flops, ceilings=env.get("ceilings"),
                         min_bytes=shape.min_bytes(profile_cfg["dtype"]), dtype=profile_cfg["dtype"])
        result.update(entry=args.entry, status="analysed", reasons=[], shape=shape.to_dict(),
                      dtype=profile_cfg["dtype"], device=env["device"]["name"] if env["device"] else None)
        markdown = render_markdown(result, title)
    log.info("analysis %s: %s", args.entry, result["status"])
    write_json(args.json, result)
    write_text(args.md, markdown)


if __name__ == "__main__":
    run_stage(main)
