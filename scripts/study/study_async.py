#!/usr/bin/env python
"""Asynchronous RL study arm: GRPO-ds and STARE-O1 at staleness eta = 0 and 1 on the tiny CPU task.

Every arm runs for each seed from ONE shared SFT checkpoint with the same data order (data.seed=0)
and the same sampling seeds per seed index, via `scripts/train_tir.py`, with the settings of the
entropy study (docs/study/README.md): 60 steps, lr 5e-5, 16 prompts x 8 samples, held-out
evaluation on 128 problems every 10 steps. The eta=1 arms train with decoupled PPO's truncated
behaviour weight (algo.off_policy.mode=tis, cap 2); `--arms` adds the eta=1 arms without it.
Resumable: a finished arm/seed (summary.json) is skipped.

At eta=0 the loop is the synchronous one bit for bit, so `--eta0-from DIR` takes the eta=0 arms
from the entropy study's runs (DIR/grpo_ds_s<seed>, DIR/stare_o1_s<seed>, from
scripts/study/study_entropy.py --study baselines) instead of training them again: only after checking
that each run's config.yaml equals this study's settings key by key and that its SFT weights are
byte-identical to the ones here (copy DIR/sft_base/sft/model to <out>/sft_base/sft/model first).

Writes <docs>/async.png (entropy per arm, mean and min-max over seeds; smoothed train accuracy;
held-out accuracy) and <docs>/async.json (per-arm aggregates and per-seed curves); prints a
markdown table.

    OMP_NUM_THREADS=1 python scripts/study/study_async.py --seeds 0 1 2 --jobs 2 --out runs/study_async
"""

from __future__ import annotations

import json
from pathlib import Path

from harness import arm_settings, check_borrowed, ensure_sft, mean, mean_sd, read_run, run_arms, run_dir, study_parser

STUDY_SET = ["data.arithmetic_eval_size=128", "learner.warmup_steps=0"]  # as the entropy study
SFT_SET = ["sft.num_traces=600", "sft.tool_fraction=0.5"]
ASYNC = ["trainer.max_staleness=1", "algo.off_policy.mode=tis", "algo.off_policy.cap=2.0"]
ARMS = {
    "grpo_ds_eta0": (["algo.name=grpo_ds"], "GRPO-ds, eta=0"),
    "grpo_ds_eta1": (["algo.name=grpo_ds", *ASYNC], "GRPO-ds, eta=1 (TIS 2)"),
    "stare_eta0": (["algo.name=stare", "algo.stare.variant=O1"], "STARE-O1, eta=0"),
    "stare_eta1": (["algo.name=stare", "algo.stare.variant=O1", *ASYNC], "STARE-O1, eta=1 (TIS 2)"),
    # optional: staleness without the behaviour weight
    "grpo_ds_eta1_raw": (["algo.name=grpo_ds", "trainer.max_staleness=1"], "GRPO-ds, eta=1, no correction"),
    "stare_eta1_raw": (
        ["algo.name=stare", "algo.stare.variant=O1", "trainer.max_staleness=1"],
        "STARE-O1, eta=1, no correction",
    ),
}
DEFAULT_ARMS = ["grpo_ds_eta0", "grpo_ds_eta1", "stare_eta0", "stare_eta1"]
ENTROPY_STUDY_NAMES = {"grpo_ds_eta0": "grpo_ds", "stare_eta0": "stare_o1"}  # scripts/study/study_entropy.py's arms
# Settings a borrowed run may differ in: where it lives, and the SGLang client's settings (unused:
# both studies generate with the HF backend, which is checked).
BORROW_IGNORED = ("trainer.run_dir", "model.path", "rollout.sglang.")


def arm_overrides(name: str, steps: int, lr: float) -> list[str]:
    """The KEY=VALUE settings of one arm beyond the harness's (run dir, SFT weights, seeds)."""
    common = [f"trainer.steps={steps}", f"learner.lr={lr}", "trainer.eval_every=10", "algo.stare.target_entropy=0.3"]
    return [*common, *STUDY_SET, *ARMS[name][0]]


def arm_metrics(rd: Path) -> dict:
    rows, evals, summary = read_run(rd)
    H = [r["entropy/batch"] for r in rows]
    half = rows[len(rows) // 2 :]
    lag = [r.get("async/lag_mean") for r in rows if r.get("async/lag_mean") is not None]
    return {
        "entropy": H,
        "acc_train": [r.get("acc/train") for r in rows],
        "eval": evals,
        "H_second_half": sum(r["entropy/batch"] for r in half) / max(len(half), 1),
        "acc_train_second_half": sum(r.get("acc/train", 0.0) for r in half) / max(len(half), 1),
        "acc_after_rl": summary.get("acc_after_rl"),
        "acc_before_rl": summary.get("acc_before_rl"),
        "lag_mean": sum(lag) / len(lag) if lag else 0.0,
        "gate_frac": sum(float(r.get("stare/gate_on", 0.0)) for r in rows) / max(len(rows), 1),
        "k3_lag1": mean([r.get("offpolicy/lag1/k3") for r in rows]),
        "capped_frac": mean([r.get("offpolicy/capped_frac") for r in rows]),
        "rl_s": summary.get("seconds", {}).get("rl"),
    }


def report(results: dict, docs: Path, meta: dict) -> None:
    keys = ["H_second_half", "acc_train_second_half", "acc_after_rl", "lag_mean", "gate_frac", "k3_lag1", "capped_frac"]
    agg = {name: {k: mean_sd([s[k] for s in r]) for k in keys} for name, r in results.items()}
    # Paired by seed (same prompts, same sampling seeds): eta=1 minus eta=0 of the same algorithm.
    for name, r in results.items():
        ref = results.get(name.split("_eta")[0] + "_eta0")
        if ref is None or name.endswith("_eta0"):
            continue
        by_seed = {s["seed"]: s for s in ref}
        for k in ("H_second_half", "acc_after_rl"):
            diffs = [s[k] - by_seed[s["seed"]][k] for s in r if s["seed"] in by_seed and s[k] is not None]
            agg[name][f"{k}_vs_eta0"] = mean_sd(diffs)
    (docs / "async.json").write_text(json.dumps({"meta": meta, "agg": agg, "per_seed": results}, indent=1))

    def fmt(pair, p="{:.3f}"):
        m, sd = pair if pair else (None, None)
        return "-" if m is None else p.format(m) + ("" if sd is None else " ± " + p.replace("+", "").format(sd))

    print(
        "| arm | seeds | H steps 31-60 | vs eta=0 (paired) | train acc 31-60 | held-out acc after RL | vs eta=0 "
        "| lag | gate on |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, a in agg.items():
        seeds = ",".join(str(s["seed"]) for s in results[name])
        print(
            f"| {ARMS[name][1]} | {seeds} | {fmt(a['H_second_half'])} | {fmt(a.get('H_second_half_vs_eta0'), '{:+.3f}')} | "
            f"{fmt(a['acc_train_second_half'])} | {fmt(a['acc_after_rl'])} | "
            f"{fmt(a.get('acc_after_rl_vs_eta0'), '{:+.3f}')} | {fmt(a['lag_mean'], '{:.2f}')} | "
            f"{fmt(a['gate_frac'], '{:.2f}')} |"
        )
    plot(results, docs / "async.png")


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    colors = {"grpo_ds": "tab:blue", "stare": "tab:red"}
    for name, runs in results.items():
        algo, eta = name.split("_eta")
        style = "-" if eta == "0" else ("--" if eta == "1" else ":")
        color = colors[algo]
        n = min(len(s["entropy"]) for s in runs)
        steps = list(range(1, n + 1))
        for ax, key in ((axes[0], "entropy"), (axes[1], "acc_train")):
            curves = [[v if v is not None else float("nan") for v in s[key][:n]] for s in runs]
            if key == "acc_train":  # moving average over 5 steps
                curves = [
                    [sum(c[max(0, i - 4) : i + 1]) / len(c[max(0, i - 4) : i + 1]) for i in range(n)] for c in curves
                ]
            mean = [sum(c[i] for c in curves) / len(curves) for i in range(n)]
            ax.plot(steps, mean, style, color=color, label=ARMS[name][1])
            if key == "entropy":
                ax.fill_between(steps, [min(c[i] for c in curves) for i in range(n)],
                                [max(c[i] for c in curves) for i in range(n)], color=color, alpha=0.1)  # fmt: skip
        ev = {}
        for s in runs:
            for step, acc in s["eval"]:
                ev.setdefault(step, []).append(acc)
        xs = sorted(ev)
        axes[2].plot(xs, [sum(ev[x]) / len(ev[x]) for x in xs], style, marker="o", color=color, label=ARMS[name][1])
    axes[0].axhline(0.3, color="gray", lw=0.8, ls=":")
    for ax, title in zip(
        axes, ("policy entropy (recompute, batch mean)", "train accuracy (5-step mean)", "held-out accuracy")
    ):
        ax.set_title(title)
        ax.set_xlabel("step")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    p = study_parser(__doc__, seeds=[0, 1, 2], steps=60, lr=5e-5, out="runs/study_async", jobs=2, threads=1)
    p.add_argument("--arms", nargs="+", default=DEFAULT_ARMS, choices=sorted(ARMS))
    p.add_argument(
        "--eta0-from",
        type=Path,
        default=None,
        metavar="DIR",
        help="take the eta=0 arms from the entropy study's runs in DIR (checked to have identical settings)",
    )
    args = p.parse_args(argv)
    out, docs = Path(args.out), Path(args.docs)
    out.mkdir(parents=True, exist_ok=True)

    def where(name: str, seed: int) -> Path:
        if args.eta0_from is not None and name in ENTROPY_STUDY_NAMES:
            return run_dir(args.eta0_from, ENTROPY_STUDY_NAMES[name], seed)
        return run_dir(out, name, seed)

    def overrides(name: str, seed: int) -> list[str]:
        return arm_overrides(name, args.steps, args.lr)

    sft = str(out / "sft_base" / "sft" / "model")
    if not args.report_only:
        sft = ensure_sft(out, [*STUDY_SET[1:], *SFT_SET], args.threads)
        run_arms(args.arms, args.seeds, out, overrides, sft, args.jobs, args.threads, where=where)
    results = {}
    for name in args.arms:
        runs = []
        for seed in args.seeds:
            rd = where(name, seed)
            if not (rd / "summary.json").is_file():
                continue
            if rd.parent != out:
                settings = arm_settings(out / rd.name, sft, seed, overrides(name, seed))
                check_borrowed(rd, settings, BORROW_IGNORED)
            runs.append({**arm_metrics(rd), "seed": seed, "borrowed": rd.parent != out})
        if runs:
            results[name] = runs
    docs.mkdir(parents=True, exist_ok=True)
    meta = {"seeds": args.seeds, "steps": args.steps, "lr": args.lr, "arms": args.arms}
    meta["eta0_from_entropy_study"] = args.eta0_from is not None
    report(results, docs, meta)


if __name__ == "__main__":
    main()
