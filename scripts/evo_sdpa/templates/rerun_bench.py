#!/usr/bin/env python3
"""Rerun one variant's bench from this bundle and compare with the recorded numbers.

    python3 rerun_bench.py VARIANT [--tolerance 0.05]

Checks the manifest's checksums, rebuilds the variant with the bundled build stage and config,
times it against SDPA with the bundled bench stage (the recorded sanitizer and parity verdicts
gate it, as in the pipeline), then compares each case's p50 speedup with results/bench/VARIANT.json.
Exit 0: within the tolerance; 1: a difference (one line per case); 2: could not rerun here."""
import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "scripts"))

from evo_sdpa.bundle import compare_bench, verify  # noqa: E402


def stage(argv: list[str]) -> None:
    proc = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        sys.exit(f"evo-sdpa: rerun: {argv[0]} failed: {last}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("variant")
    p.add_argument("--tolerance", type=float, default=0.05, help="relative difference of the p50 speedup allowed")
    args = p.parse_args()
    bad = verify(ROOT)
    if bad:
        sys.exit(f"evo-sdpa: rerun: {len(bad)} file(s) differ from MANIFEST.json (first: {bad[0]}); the bundle is damaged")
    manifest = json.loads((ROOT / "MANIFEST.json").read_text())
    cfg = json.loads((ROOT / "config.json").read_text())
    recorded = ROOT / "results" / "bench" / f"{args.variant}.json"
    if not recorded.exists():
        sys.exit(f"evo-sdpa: rerun: {args.variant} has no bench record in this bundle")
    out = ROOT / "rerun" / args.variant
    cc = manifest.get("compute_capability") or cfg["build"]["default_compute_capability"]
    stage(["scripts/build_variant.py", "--variant", args.variant, "--compute-capability", str(cc),
           "--config-json", json.dumps({"build": cfg["build"]}), "--verdict", str(out / "build.json"),
           "--resources", str(out / "resources.json"), "--compiler-log", str(out / "compiler.log")])
    stage(["scripts/run_bench.py", "--variant", args.variant, "--env", "results/env/environment.json",
           "--build", str(out / "build.json"), "--sanitizer", f"results/sanitizer/{args.variant}/verdict.json",
           "--parity", f"results/parity/{args.variant}.json", "--config-json", json.dumps(cfg),
           "--out", str(out / "bench.json")])
    rerun = json.loads((out / "bench.json").read_text())
    if rerun["status"] != "measured":
        print(f"evo-sdpa: rerun: {args.variant} {'; '.join(rerun.get('reasons', []))}", file=sys.stderr)
        sys.exit(2)
    lines = compare_bench(json.loads(recorded.read_text()), rerun, args.tolerance)
    card = (rerun.get("measured_at") or {}).get("card") or {}
    print(f"{args.variant}: rerun on {card.get('name')}, recorded on {manifest.get('device')}")
    for line in lines:
        print(f"  {line}")
    print("same within tolerance" if not lines else f"{len(lines)} case(s) differ")
    sys.exit(1 if lines else 0)


if __name__ == "__main__":
    main()
