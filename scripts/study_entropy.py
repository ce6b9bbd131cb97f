#!/usr/bin/env python
"""Entropy-dynamics study of STARE vs GRPO-ds on the tiny CPU setup (issue 8).

Runs each arm (GRPO-ds, STARE-O1, STARE-C2, open-loop W=1.01, open-loop W=2.0, STARE-O1 at
extra target entropies) for each seed, all from ONE shared SFT checkpoint with the same data
order (data.seed=0) and the same sampling seed per seed index, via `scripts/train_tir.py`.
Resumable: an arm/seed whose run dir already holds summary.json is skipped.

Writes <docs>/entropy.png (entropy per arm, mean and min-max spread over seeds, target band
shaded; training accuracy and held-out accuracy), <docs>/table.md and <docs>/table.json.

Example (reduced study):
    OMP_NUM_THREADS=2 python scripts/study_entropy.py --seeds 0 --steps 25 --lr 2e-4
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "scripts" / "train_tir.py"


def arm_specs(target: float, extra_targets: list[float]) -> dict[str, dict]:
    """name -> {'overrides': [...], 'target': float, 'label': str}."""
    arms = {
        "grpo_ds": {"overrides": ["algo.name=grpo_ds", f"algo.stare.target_entropy={target}"],
                    "label": "GRPO-ds"},
        "stare_o1": {"overrides": ["algo.name=stare", "algo.stare.variant=O1",
                                   f"algo.stare.target_entropy={target}"],
                     "label": f"STARE-O1 (H*={target})"},
        "stare_c2": {"overrides": ["algo.name=stare", "algo.stare.variant=C2",
                                   f"algo.stare.target_entropy={target}"],
                     "label": f"STARE-C2 (H*={target})"},
        "open_w1.01": {"overrides": ["algo.name=stare", "algo.stare.variant=O1",
                                     "algo.stare.open_loop=true", "algo.stare.w=1.01",
                                     f"algo.stare.target_entropy={target}"],
                       "label": "open-loop W=1.01"},
        "open_w2.0": {"overrides": ["algo.name=stare", "algo.stare.variant=O1",
                                    "algo.stare.open_loop=true", "algo.stare.w=2.0",
                                    f"algo.stare.target_entropy={target}"],
                      "label": "open-loop W=2.0"},
    }
    for t in extra_targets:
        if t == target:
            continue
        arms[f"stare_o1_t{t}"] = {"overrides": ["algo.name=stare", "algo.stare.variant=O1",
                                                f"algo.stare.target_entropy={t}"],
                                  "label": f"STARE-O1 (H*={t})", "target": t}
    for a in arms.values():
        a.setdefault("target", target)
    return arms


def run(cmd: list[str], log: Path) -> int:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as fh:
        return subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT).returncode


def ensure_sft(args) -> str:
    """Path of the shared SFT checkpoint: --sft, or one built once under <out>/sft_base."""
    if args.sft:
        return args.sft
    base = Path(args.out) / "sft_base"
    model = base / "sft" / "model"
    if not (model / "config.json").is_file():
        print(f"[study] building shared SFT checkpoint in {base}", flush=True)
        cmd = [sys.executable, str(TRAIN), f"trainer.run_dir={base}", "trainer.steps=1",
               "trainer.eval_every=0", "data.arithmetic_eval_size=8", *args.set, *args.sft_set]
        rc = run(cmd, Path(args.out) / "sft_base.log")
        if rc != 0 or not (model / "config.json").is_file():
            raise SystemExit(f"SFT failed (rc={rc}); see {Path(args.out) / 'sft_base.log'}")
    return str(model)


def load_rows(run_dir: Path) -> tuple[list[dict], list[dict]]:
    rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines() if l.strip()]
    steps = {}
    for r in rows:
        if "entropy/batch" in r:
            steps[r["step"]] = r  # last write wins (resume)
    evals = [r for r in rows if "eval/acc" in r]
    return [steps[k] for k in sorted(steps)], evals


def arm_metrics(run_dir: Path, target: float, tail: int) -> dict:
    rows, evals = load_rows(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    H = [r["entropy/batch"] for r in rows]
    gate_logged = any("stare/gate_on" in r for r in rows)
    gate = [float(r.get("stare/gate_on", 0.0) or 0.0) for r in rows]
    # GRPO-ds has no gate: use the step where H first falls below H* (where the gate would engage).
    first = (next((i for i, g in enumerate(gate) if g > 0), None) if gate_logged
             else next((i for i, h in enumerate(H) if h < target), None))
    dev = None if first is None else sum(abs(h - target) for h in H[first:]) / len(H[first:])
    last = rows[-tail:] if rows else []

    def mean(key):
        vals = [r[key] for r in last if r.get(key) is not None]
        return sum(vals) / len(vals) if vals else None

    return {
        "steps": len(rows), "H_first": H[0] if H else None, "H_final": H[-1] if H else None,
        "H_min": min(H) if H else None, "H_max": max(H) if H else None,
        "first_gate_step": None if first is None else rows[first]["step"],
        "mean_abs_dev_after_gate": dev, "frac_gated": sum(gate) / len(gate) if gate and gate_logged else None,
        "acc_before_rl": summary.get("acc_before_rl"), "acc_after_rl": summary.get("acc_after_rl"),
        "reward_final": mean("reward/mean"), "acc_train_final": mean("acc/train"),
        "tool_calls": mean("rollout/tool_calls"), "response_len": mean("rollout/response_len"),
        "entropy": H, "gate": gate, "step": [r["step"] for r in rows],
        "acc_train": [r.get("acc/train") for r in rows],
        "eval": [(r["step"], r["eval/acc"]) for r in evals],
    }


def aggregate(per_seed: list[dict]) -> dict:
    keys = ["H_first", "H_final", "H_min", "H_max", "mean_abs_dev_after_gate", "frac_gated",
            "acc_before_rl", "acc_after_rl", "reward_final", "acc_train_final", "tool_calls",
            "response_len", "first_gate_step"]
    out = {}
    for k in keys:
        vals = [m[k] for m in per_seed if m.get(k) is not None]
        out[k] = sum(vals) / len(vals) if vals else None
        out[k + "_sd"] = ((sum((v - out[k]) ** 2 for v in vals) / (len(vals) - 1)) ** 0.5
                          if len(vals) > 1 else None)
    out["n_seeds"] = len(per_seed)
    return out


def fmt(v, p="{:.3f}", sd=None):
    if v is None:
        return "n/a"
    s = p.format(v)
    return s + (" ± " + p.format(sd) if sd is not None else "")


def write_table(arms: dict, results: dict, docs: Path, meta: dict) -> None:
    lines = [f"# Entropy study table\n", f"Settings: `{json.dumps(meta)}`\n",
             "Means over seeds (± sample s.d. when >1 seed). Final entropy = last RL step's batch "
             f"entropy; rates/lengths = mean over the last {meta['tail']} steps; "
             "|H-H*| = mean over steps from the first gated step on (n/a: gate never engaged; for "
             "GRPO-ds, which has no gate, from the first step with H < H*); "
             "held-out acc = eval/acc after RL.\n",
             "| arm | H* | seeds | H step1 | H final | H min | mean abs(H-H*) after gate | frac gated "
             "| held-out acc (before -> after) | train acc (final) | tool calls | response len |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, spec in arms.items():
        if name not in results:
            continue
        a = results[name]["agg"]
        lines.append(
            f"| {spec['label']} | {spec['target']} | {a['n_seeds']} | {fmt(a['H_first'])} | "
            f"{fmt(a['H_final'], sd=a['H_final_sd'])} | {fmt(a['H_min'])} | "
            f"{fmt(a['mean_abs_dev_after_gate'])} | {fmt(a['frac_gated'], '{:.2f}')} | "
            f"{fmt(a['acc_before_rl'], '{:.2f}')} -> {fmt(a['acc_after_rl'], '{:.2f}', a['acc_after_rl_sd'])} | "
            f"{fmt(a['acc_train_final'], '{:.2f}')} | {fmt(a['tool_calls'], '{:.2f}')} | "
            f"{fmt(a['response_len'], '{:.1f}')} |")
    (docs / "table.md").write_text("\n".join(lines) + "\n")
    slim = {n: {"label": arms[n]["label"], "target": arms[n]["target"], "agg": r["agg"],
                "per_seed": r["per_seed"]} for n, r in results.items()}
    (docs / "table.json").write_text(json.dumps({"meta": meta, "arms": slim}, indent=1) + "\n")


def plot(arms: dict, results: dict, docs: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5))
    targets = sorted({arms[n]["target"] for n in results})
    for t in targets:
        ax1.axhspan(t * 0.9, t * 1.1, color="grey", alpha=0.12)
        ax1.axhline(t, color="grey", lw=0.6, ls=":")
    for name, r in results.items():
        seeds = r["per_seed"]
        n = min(len(m["entropy"]) for m in seeds)
        if n == 0:
            continue
        H = np.array([m["entropy"][:n] for m in seeds])
        x = np.array(seeds[0]["step"][:n])
        line, = ax1.plot(x, H.mean(0), label=arms[name]["label"])
        if len(seeds) > 1:
            ax1.fill_between(x, H.min(0), H.max(0), color=line.get_color(), alpha=0.2)
        A = np.array([[np.nan if v is None else v for v in m["acc_train"][:n]] for m in seeds])
        ax2.plot(x, np.nanmean(A, 0), color=line.get_color(), alpha=0.6, label=arms[name]["label"])
        if len(seeds) > 1:
            ax2.fill_between(x, np.nanmin(A, 0), np.nanmax(A, 0), color=line.get_color(), alpha=0.15)
        ev = [e for e in seeds[0]["eval"]]
        if ev:
            steps = [s for s, _ in ev]
            vals = np.array([[v for _, v in m["eval"][:len(ev)]] for m in seeds
                             if len(m["eval"]) >= len(ev)])
            ax2.plot(steps, vals.mean(0), "o--", color=line.get_color(), ms=4)
    ax1.set(xlabel="RL step", ylabel="batch entropy (nats/token)", yscale="log",
            title="Policy entropy (mean, min-max over seeds; shaded: H* ±10%)")
    ax2.set(xlabel="RL step", ylabel="accuracy",
            title="Train accuracy (lines) and held-out eval/acc (dots)")
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(docs / "entropy.png", dpi=110)
    plt.close(fig)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1],
                   help="RL seeds (trainer.seed); every arm runs each seed (default: 0 1)")
    p.add_argument("--steps", type=int, default=30, help="RL steps per arm and seed (default: 30)")
    p.add_argument("--lr", type=float, default=2e-4,
                   help="RL learning rate (learner.lr); the tiny_cpu default 1e-3 collapses entropy "
                        "in one step, so the study uses a lower one (default: 2e-4)")
    p.add_argument("--target", type=float, default=0.3,
                   help="target entropy H* for STARE-O1/C2 and the open-loop arms (default: 0.3)")
    p.add_argument("--targets", type=float, nargs="*", default=[0.2, 0.3, 0.4],
                   help="target entropies for the STARE-O1 target sweep (default: 0.2 0.3 0.4; "
                        "the one equal to --target reuses the stare_o1 arm)")
    p.add_argument("--arms", nargs="*", default=None,
                   help="subset of arm names to run (default: all): grpo_ds stare_o1 stare_c2 "
                        "open_w1.01 open_w2.0 stare_o1_t<T>")
    p.add_argument("--out", default="runs/study",
                   help="directory for run dirs, logs and the shared SFT checkpoint (not committed; "
                        "default: runs/study)")
    p.add_argument("--docs", default="docs/study",
                   help="where entropy.png, table.md and table.json go (default: docs/study)")
    p.add_argument("--sft", default=None,
                   help="existing SFT checkpoint (HF dir) to start every arm from; default: build "
                        "one once under <out>/sft_base with the tiny_cpu SFT settings")
    p.add_argument("--eval-every", type=int, default=10,
                   help="trainer.eval_every for each arm (0: only before/after RL; default: 10)")
    p.add_argument("--tail", type=int, default=5,
                   help="steps at the end averaged for reward/tool-call/length columns (default: 5)")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="extra config overrides passed to every train_tir.py call (incl. SFT)")
    p.add_argument("--sft-set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="extra overrides for the shared SFT run only")
    p.add_argument("--report-only", action="store_true",
                   help="do not launch runs; only build the table and plot from finished runs")
    args = p.parse_args(argv)

    out, docs = Path(args.out), Path(args.docs)
    out.mkdir(parents=True, exist_ok=True)
    docs.mkdir(parents=True, exist_ok=True)
    arms = arm_specs(args.target, args.targets)
    if args.arms:
        unknown = set(args.arms) - set(arms)
        if unknown:
            raise SystemExit(f"unknown arms {sorted(unknown)}; known: {sorted(arms)}")
        arms = {k: v for k, v in arms.items() if k in args.arms}

    if not args.report_only:
        sft = ensure_sft(args)
        for name, spec in arms.items():
            for seed in args.seeds:
                rd = out / f"{name}_s{seed}"
                if (rd / "summary.json").is_file():
                    print(f"[study] skip {rd} (done)", flush=True)
                    continue
                cmd = [sys.executable, str(TRAIN), f"trainer.run_dir={rd}", f"model.path={sft}",
                       "sft.enabled=false", f"trainer.seed={seed}", "data.seed=0",
                       f"trainer.steps={args.steps}", f"learner.lr={args.lr}",
                       f"trainer.eval_every={args.eval_every}", *args.set, *spec["overrides"]]
                if (rd / "checkpoints" / "latest").is_file():
                    cmd.append("--resume")
                t0 = time.time()
                rc = run(cmd, out / f"{name}_s{seed}.log")
                print(f"[study] {name} seed={seed} rc={rc} {time.time() - t0:.0f}s", flush=True)

    results = {}
    for name, spec in arms.items():
        per_seed = []
        for seed in args.seeds:
            rd = out / f"{name}_s{seed}"
            if (rd / "summary.json").is_file():
                per_seed.append(arm_metrics(rd, spec["target"], args.tail))
        if per_seed:
            results[name] = {"per_seed": per_seed, "agg": aggregate(per_seed)}
    meta = {"seeds": args.seeds, "steps": args.steps, "lr": args.lr, "target": args.target,
            "targets": args.targets, "eval_every": args.eval_every, "tail": args.tail,
            "set": args.set}
    write_table(arms, results, docs, meta)
    if results:
        plot(arms, results, docs)
    print(f"[study] wrote {docs / 'table.md'} ({len(results)} arms)", flush=True)


if __name__ == "__main__":
    main()
