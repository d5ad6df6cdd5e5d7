"""Stage: time every SDPA backend on the baseline suite (CPU SDPA only, labelled, without a GPU)."""
import csv
import io

from evo_sdpa.baseline import cpu_cases, gpu_cases
from evo_sdpa.cardlock import hold_card
from evo_sdpa.cli import config_arg, parser, setup_logging
from evo_sdpa.config import suite_shapes
from evo_sdpa.device import NO_DEVICE_REASON, cuda_available
from evo_sdpa.errors import run_stage
from evo_sdpa.io import write_json, write_text
from evo_sdpa.provenance import stamp

CSV_FIELDS = ["dtype", "B", "H", "S", "D", "causal", "backend", "picked_backend", "device", "mode",
              "status", "p50_us", "p90_us", "p99_us", "min_us", "iqr_us", "rel_spread", "n",
              "ended_by", "tflops", "gbps", "cache", "reason"]


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--env", required=True, help="the environment record (an input: it runs after it)")
    config_arg(p)
    p.add_argument("--json", required=True)
    p.add_argument("--csv", required=True)
    args = p.parse_args()
    log = setup_logging()
    hold_card("sdpa_baseline", log)
    cfg = args.config_json
    shapes = suite_shapes(cfg, cfg["baseline_suite"])
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
    result = stamp({"suite": cfg["baseline_suite"], "note": note, "rows": rows,
                    "rel_spread_bound": cfg["timing"]["rel_spread"]}, measured_on_card=True)
    result["device"] = result["measured_at"]["card"]["name"]  # this job's card, not env's
    write_json(args.json, result)


if __name__ == "__main__":
    run_stage(main)
