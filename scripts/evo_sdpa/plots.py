"""The summary's plots beside the speedup bars: a roofline with the measured ceilings, latency
distributions of each variant against SDPA, and the evolution curve. Each plot is written whole
(a temporary file, then a rename); with no data it says why on the canvas instead of inventing."""
from __future__ import annotations

import os
from pathlib import Path

from .io import read_json


def _figure(size=(9, 5), rows: int = 0, cols: int = 0):
    """(pyplot, figure, axes): one axes, or with rows and cols a grid of them (always 2-D)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if rows and cols:
        fig, axes = plt.subplots(rows, cols, figsize=size, squeeze=False)
        return plt, fig, axes
    fig, ax = plt.subplots(figsize=size)
    return plt, fig, ax


def _save(plt, fig, path: str) -> None:
    fig.tight_layout()
    partial = f"{path}.partial.png"
    fig.savefig(partial, dpi=110)
    plt.close(fig)
    os.replace(partial, path)


def _empty(ax, text: str) -> None:
    ax.axis("off")
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True)


def roofline_points(leaderboard: dict) -> list[dict]:
    """(name, arithmetic intensity, achieved TFLOP/s) on the profile shape, SDPA first."""
    entries = [("sdpa (default)", leaderboard["sdpa"].get("roofline"))]
    entries += [(e["name"], e.get("roofline")) for e in leaderboard["variants"]]
    return [{"name": name, "intensity": roof["arithmetic_intensity_flop_per_byte"], "tflops": roof["achieved_tflops"]}
            for name, roof in entries
            if roof and roof.get("arithmetic_intensity_flop_per_byte") and roof.get("achieved_tflops")]


def plot_roofline(leaderboard: dict, path: str) -> None:
    plt, fig, ax = _figure()
    ceilings = leaderboard.get("ceilings") or {}
    dtype = leaderboard["profile"].get("dtype", "fp16")
    compute = ((ceilings.get("matmul_tflops") or {}).get(dtype))
    copy_gbps = ceilings.get("copy_gbps")
    points = roofline_points(leaderboard)
    if not (compute and copy_gbps):
        _empty(ax, f"No roofline on {leaderboard['device']}: the environment record has no measured ceilings "
                   "(they are measured on a CUDA device).")
        return _save(plt, fig, path)
    ridge = compute * 1e12 / (copy_gbps * 1e9)
    # Two decades either side of the ridge and of every point, with the ridge itself on the line.
    low = min([ridge] + [p["intensity"] for p in points]) / 100
    high = max([ridge] + [p["intensity"] for p in points]) * 100
    xs = sorted({ridge, *(low * (high / low) ** (i / 199) for i in range(200))})
    ax.plot(xs, [min(compute, x * copy_gbps / 1000) for x in xs], color="black",
            label=f"measured ceilings: {copy_gbps:.0f} GB/s copy, {compute:.0f} TFLOP/s {dtype} matmul")
    for p in points:
        ax.scatter(p["intensity"], p["tflops"], label=p["name"], zorder=3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per DRAM byte, ncu)")
    ax.set_ylabel("achieved TFLOP/s (ncu, dominant kernel)")
    shape = leaderboard["profile"]["shape"]
    ax.set_title(f"Roofline on {leaderboard['device']}, profile shape B{shape['B']} H{shape['H']} "
                 f"S{shape['S']} D{shape['D']}" + ("" if points else " (no variant was profiled)"))
    ax.legend(fontsize=7)
    _save(plt, fig, path)


def latency_boxes(leaderboard: dict) -> list[dict]:
    """Box-style latency summaries from the stored statistics (the bench keeps percentiles, not
    samples): box p50 +/- IQR/2, whiskers to p90 and p99."""
    boxes = []
    for entry in leaderboard["variants"]:
        for r in entry["speedups"]:
            for who in ("sdpa", "variant"):
                p50, iqr = r[f"{who}_p50_us"], r.get(f"{who}_iqr_us") or 0.0
                boxes.append({"panel": f"{r['shape']} {r['dtype']}", "label": "SDPA" if who == "sdpa" else entry["name"],
                              "med": p50, "q1": p50 - iqr / 2, "q3": p50 + iqr / 2,
                              "whislo": p50 - iqr / 2, "whishi": r.get(f"{who}_p99_us") or r[f"{who}_p90_us"],
                              "p90": r[f"{who}_p90_us"], "sdpa": who == "sdpa"})
    return boxes


def plot_latency(leaderboard: dict, path: str) -> None:
    """One panel per (shape, dtype): each variant's box beside the SDPA run it was timed against."""
    boxes = latency_boxes(leaderboard)
    panels: dict[str, list[dict]] = {}
    for box in boxes:
        panels.setdefault(box["panel"], []).append(box)
    if not panels:
        plt, fig, ax = _figure()
        _empty(ax, f"No latency measured on {leaderboard['device']}.")
        return _save(plt, fig, path)
    cols = min(4, len(panels))
    rows = -(-len(panels) // cols)
    plt, fig, axes = _figure((3.2 * cols, 2.8 * rows + 0.6), rows, cols)
    for ax, (title, group) in zip(axes.flat, panels.items()):
        stats = [{k: b[k] for k in ("label", "med", "q1", "q3", "whislo", "whishi")} for b in group]
        art = ax.bxp(stats, showfliers=False, patch_artist=True)
        for patch, box in zip(art["boxes"], group):
            patch.set_facecolor("lightgray" if box["sdpa"] else "tab:blue")
        ax.scatter(range(1, len(group) + 1), [b["p90"] for b in group], marker="_", color="red", zorder=3)
        ax.set_title(title, fontsize=8)
        ax.tick_params(axis="x", labelsize=7, rotation=30)
        ax.tick_params(axis="y", labelsize=7)
        ax.set_ylabel("µs", fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"Latency on {leaderboard['device']}: each variant (blue) beside SDPA (gray) timed in the same "
                 "process\n(stored percentiles: box p50 ± IQR/2, whisker to p99, red p90)", fontsize=9)
    _save(plt, fig, path)


def evolution_curves(curve_pattern: str, variants: list[str]) -> dict[str, dict]:
    """Each variant's evolution curve where a search has run (`curve_pattern` holds {variant})."""
    curves = {}
    for name in variants:
        path = Path(curve_pattern.format(variant=name))
        if path.exists():
            curves[name] = read_json(path)
    return curves


def plot_evolution(curves: dict[str, dict], path: str) -> None:
    plt, fig, ax = _figure()
    drawn = {n: c for n, c in curves.items() if c.get("generations")}
    if not drawn:
        _empty(ax, "No evolution ran (results/evolve/<variant>/curve.json holds none).")
        return _save(plt, fig, path)
    for name, c in drawn.items():
        gens = c["generations"]
        ax.plot([g["generation"] for g in gens], [g["best_fitness"] for g in gens], marker="o", label=name)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=0.8, label="SDPA")
    ax.set_xlabel("generation")
    ax.set_ylabel("best fitness (geomean p50 speedup vs SDPA)")
    ax.set_title("Evolution")
    ax.legend(fontsize=8)
    _save(plt, fig, path)
