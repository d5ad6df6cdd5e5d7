"""Stage: time every SDPA backend on the baseline suite (CPU SDPA only, labelled, without a GPU)."""
import csv
import io

from evo_sdpa.baseline import cpu_cases, gpu_cases
from evo_sdpa.cli import config_arg, parser, setup_logging
from evo_sdpa.config import suite_shapes
from evo_sdpa.device import NO_DEVICE_REASON, cuda_available
from evo_sdpa.errors import run_stage
from evo_sdpa.io import read_json, write_json, write_text

CSV_FIELDS = ["dtype", "B", "H", "S", "D", "causal", "backend", "picked_backend", "device", "mode",
              "status", "p50_us", "p90_us", "p99_us", "min_us", "iqr_us", "rel_spread", "n",
              "ended_by", "tflops", "gbps", "cache", "reason"]


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--env", required=True)
    config_arg(p)
    p.add_argument("--json", required=True)
    p.add_argument("--csv", required=True)
    args = p.parse_args()
    log = setup_logging()
    cfg = args.config_json
    shapes = suite_shapes(cfg, cfg["baseline_suite"])
    env = read_json(args.env)
    if cuda_available():
        rows = gpu_cases(shapes, cfg["dtypes"], cfg["timing"], log)
        note = None
    else:
        rows = cpu_cases(shapes, cfg["dtypes"], cfg["timing"], cfg["cpu_baseline_max_gflop"], log)
        note = (f"GPU backends not run: {NO_DEVICE_REASON}; rows are torch's CPU SDPA, "
                "not comparable with GPU numbers")
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    write_text(args.csv, buffer.getvalue())
    write_json(args.json, {"device": env["device"]["name"] if env["device"] else "cpu",
                           "suite": cfg["baseline_suite"], "note": note, "rows": rows})


if __name__ == "__main__":
    run_stage(main)
