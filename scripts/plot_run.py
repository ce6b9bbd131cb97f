#!/usr/bin/env python
"""Plot the training curves of one or more runs (overlaid) into a PNG.

python scripts/plot_run.py runs/tiny_cpu runs/other --out curves.png
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", help="run directories holding metrics.jsonl")
    parser.add_argument(
        "--out", default=None, help="output PNG (default: <first run dir>/plots/curves.png, or curves.png for several)"
    )
    parser.add_argument("--band", type=float, default=0.05, help="half-width of the shaded target-entropy band")
    args = parser.parse_args()

    from stare_tir.tracking import plot_runs

    for d in args.run_dirs:
        if not (Path(d) / "metrics.jsonl").exists():
            parser.error(f"{d}: no metrics.jsonl there (is it a run directory?)")
    default = Path(args.run_dirs[0]) / "plots" / "curves.png" if len(args.run_dirs) == 1 else Path("curves.png")
    print(plot_runs(args.run_dirs, args.out or default, band=args.band))


if __name__ == "__main__":
    main()
