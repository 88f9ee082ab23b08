"""Rebuild the article's table of results with fastpipe on this machine.

Each row of the article (toy_workload.md, "The article's results") is measured here with
fastpipe's cache points, and both columns are given as fractions of their own device bound,
so an A10G and a simulated or different device can be set side by side.

Usage:
    python benchmarks/reproduce_article.py [--device sim:290] [--num-workers 2] [--steps 10] [--out benchmarks/results]

Writes article_reproduction.{json,md,png} to --out and prints the Markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from fastpipe import MeasureOptions
from fastpipe.devices import parse_device
from fastpipe.diagnosis.ladder._points import measure_points
from fastpipe.workloads._workload import load_workload

# The article's published numbers (NVIDIA A10G, 4 vCPUs, PyTorch 2.6), reference data from toy_workload.md.
ARTICLE_DEVICE_BOUND = 3.45
# (row label, article steps/s, toy variant, cache point, extra toy options)
ROWS = [
    ("baseline (nothing cached)", 0.89, "toy:naive", "baseline", {}),
    ("one batch cached on the device (device bound)", 3.45, "toy:naive", "device", {}),
    ("one batch cached on the host (adds H2D copy)", 3.33, "toy:naive", "host", {}),
    ("one processed sample cached (adds collate + copy)", 3.23, "toy:naive", "sample", {}),
    ("raw sample cached, transforms rerun", 1.72, "toy:naive", "raw", {}),
    ("optimized transforms: raw sample cached", 3.23, "toy:uint8-host", "raw", {}),
    ("optimized transforms: baseline", 1.28, "toy:uint8-host", "baseline", {}),
    ("+ raw image shrunk 1024 -> 256: baseline", 3.23, "toy:uint8-host", "baseline", {"raw_size": 256}),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="default: cuda if present, else sim:290")
    parser.add_argument("--num-workers", type=int, default=None)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    device = parse_device(args.device)
    options = {} if args.num_workers is None else {"num_workers": args.num_workers}

    # group rows by (variant, options) so each workload is built once and its points measured together
    groups: dict[tuple[str, str], list[int]] = {}
    for i, (_, _, spec, _, extra) in enumerate(ROWS):
        groups.setdefault((spec, json.dumps(extra, sort_keys=True)), []).append(i)
    measured: dict[int, float] = {}
    started = time.perf_counter()
    for (spec, extra_json), rows in groups.items():
        workload = load_workload(spec, device, **options, **json.loads(extra_json))
        order = ["device", "host", "sample", "raw", "baseline"]
        points = sorted({ROWS[i][3] for i in rows}, key=order.index)
        print(f"measuring {spec} {extra_json} at {points} ...", file=sys.stderr, flush=True)
        results = measure_points(workload, device, points, options=MeasureOptions(steps=args.steps, warmup=args.warmup))
        for i in rows:
            measured[i] = results[ROWS[i][3]].steps_per_s
            # as it goes, so a run cut short (gpu_check's time caps) keeps what it measured
            print(f"  {ROWS[i][0]}: {measured[i]:.3f} steps/s", file=sys.stderr, flush=True)
    bound = measured[1]
    table = []
    for i, (label, article, spec, point, extra) in enumerate(ROWS):
        table.append(
            {
                "experiment": label,
                "variant": spec + ("" if not extra else f" {extra}"),
                "cache_point": point,
                "article_steps_per_s": article,
                "article_fraction_of_bound": article / ARTICLE_DEVICE_BOUND,
                "steps_per_s": measured[i],
                "fraction_of_bound": measured[i] / bound,
            }
        )
    result = {
        "device": device.spec,
        "device_bound_steps_per_s": bound,
        "num_workers": options.get("num_workers", "default"),
        "steps": args.steps,
        "warmup": args.warmup,
        "elapsed_s": time.perf_counter() - started,
        "rows": table,
    }

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "article_reproduction.json").write_text(json.dumps(result, indent=2))
    lines = [
        f"Article (A10G) vs fastpipe on {device.spec}, each as a fraction of its own device bound "
        f"(ours: {bound:.3f} steps/s; {args.steps} steps after {args.warmup} warm-up per point)",
        "",
        "| experiment | article steps/s | article % of bound | fastpipe steps/s | fastpipe % of bound |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in table:
        lines.append(
            f"| {row['experiment']} | {row['article_steps_per_s']:.2f} | {row['article_fraction_of_bound']:.0%} | "
            f"{row['steps_per_s']:.2f} | {row['fraction_of_bound']:.0%} |"
        )
    markdown = "\n".join(lines) + "\n"
    (args.out / "article_reproduction.md").write_text(markdown)
    print(markdown)
    try:
        _plot(table, device.spec, args.out / "article_reproduction.png")
    except ImportError:
        print("matplotlib missing: no PNG written (pip install 'fastpipe[plot]')", file=sys.stderr)
    print(f"wrote {args.out}/article_reproduction.{{json,md,png}} in {result['elapsed_s']:.0f} s")
    return 0


def _plot(table: list[dict], device: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    labels = [row["experiment"] for row in table][::-1]
    y = np.arange(len(labels))
    fig, ax = plt.subplots(figsize=(9, 5))
    ax.barh(y + 0.2, [100 * r["article_fraction_of_bound"] for r in table][::-1], height=0.4, label="article (A10G)", color="#999999")
    ax.barh(y - 0.2, [100 * r["fraction_of_bound"] for r in table][::-1], height=0.4, label=f"fastpipe ({device})", color="#2c7fb8")
    ax.set_yticks(y, labels, fontsize=8)
    ax.axvline(100, color="black", linestyle="--", linewidth=1)
    ax.set_xlabel("% of the device bound")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
