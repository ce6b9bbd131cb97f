#!/usr/bin/env python
"""Entropy-dynamics study of STARE and the STARE paper's baselines on the tiny CPU setup.

`--study stare` (default) runs STARE's arms (GRPO-ds, STARE-O1, STARE-C2, open-loop W=1.01 and W=2.0,
STARE-O1 at extra target entropies); `--study baselines` runs GRPO-ds, STARE-O1 and each baseline
method (DAPO, KL-Cov, Clip-Cov, the 80/20 rule, the entropy advantage, STAPO, SimpleTIR's void-turn
mask). Every arm runs for each seed, all from ONE shared SFT checkpoint with the same data order
(data.seed=0) and the same sampling seed per seed index, via `scripts/train_tir.py`.
Resumable: an arm/seed whose run dir already holds summary.json is skipped.

Writes <docs>/entropy.png (entropy per arm, mean and min-max spread over seeds, target band
shaded; training accuracy and held-out accuracy), <docs>/table.md and <docs>/table.json; for
`--study baselines` <docs>/baselines.png, <docs>/baselines_table.md and <docs>/baselines_table.json.

Example (reduced study):
    OMP_NUM_THREADS=2 python scripts/study/study_entropy.py --seeds 0 --steps 25 --lr 2e-4
"""

from __future__ import annotations

import json
from pathlib import Path

from entropy_figure import plot
from harness import ensure_sft, fmt, mean_sd, read_run, run_arms, run_dir, study_parser, write_report


def arm_specs(target: float, extra_targets: list[float]) -> dict[str, dict]:
    """name -> {'overrides': [...], 'target': float, 'label': str}."""
    arms = {
        "grpo_ds": {"overrides": ["algo.name=grpo_ds", f"algo.stare.target_entropy={target}"], "label": "GRPO-ds"},
        "stare_o1": {
            "overrides": ["algo.name=stare", "algo.stare.variant=O1", f"algo.stare.target_entropy={target}"],
            "label": f"STARE-O1 (H*={target})",
        },
        "stare_c2": {
            "overrides": ["algo.name=stare", "algo.stare.variant=C2", f"algo.stare.target_entropy={target}"],
            "label": f"STARE-C2 (H*={target})",
        },
        "open_w1.01": {
            "overrides": [
                "algo.name=stare",
                "algo.stare.variant=O1",
                "algo.stare.open_loop=true",
                "algo.stare.w=1.01",
                f"algo.stare.target_entropy={target}",
            ],
            "label": "open-loop W=1.01",
        },
        "open_w2.0": {
            "overrides": [
                "algo.name=stare",
                "algo.stare.variant=O1",
                "algo.stare.open_loop=true",
                "algo.stare.w=2.0",
                f"algo.stare.target_entropy={target}",
            ],
            "label": "open-loop W=2.0",
        },
    }
    # Not one of the default arms: the strongest in-spec setting of C2's M lever (see
    # scripts/study/study_mechanism.py: on this task M moves the entropy under Adam, W does not).
    arms["c2_adaptive"] = {
        "overrides": [
            "algo.name=stare",
            "algo.stare.variant=C2",
            "algo.stare.adaptive=true",
            "algo.stare.adapt_rate=0.05",
            "algo.stare.m_min=0.1",
            f"algo.stare.target_entropy={target}",
        ],
        "label": f"STARE-C2 adaptive, M->0.1 (H*={target})",
        "optional": True,
    }
    # The STARE paper's baselines, each GRPO-ds plus one method at its paper/code defaults
    # (stare_tir.train_config.algo_presets()); their study is `--study baselines`.
    baselines = {
        "dapo": (["algo.name=dapo"], "DAPO (overlong penalty, 3x over-sampling)"),
        "kl_cov": (["algo.name=kl_cov"], "KL-Cov (k=0.002)"),
        "clip_cov": (["algo.name=clip_cov"], "Clip-Cov (r=2e-4)"),
        "entropy_80_20": (["algo.name=entropy_80_20"], "80/20 rule (top 20% entropy)"),
        "entropy_adv": (["algo.name=entropy_adv"], "entropy advantage (0.4, 2)"),
        "stapo": (["algo.name=stapo"], "STAPO (p<0.01, H<q0.05)"),
        "simpletir": (["algo.name=grpo_ds", "algo.void_turns=mask"], "SimpleTIR void-turn mask"),
        # KL-Cov's penalty |log pi - log pi_old| has zero gradient at the first update (pi = pi_old):
        # a second pass over each batch is where it acts, so it is also run with two, against
        # GRPO-ds with two.
        "kl_cov_2ep": (["algo.name=kl_cov", "algo.ppo_epochs=2"], "KL-Cov, 2 passes per batch"),
        "grpo_ds_2ep": (["algo.name=grpo_ds", "algo.ppo_epochs=2"], "GRPO-ds, 2 passes per batch"),
        # With the authors' mini-batch counts: KL-Cov 256/32 = 8 (16 prompts here: 2 per mini-batch).
        "kl_cov_8mb": (["algo.name=kl_cov", "algo.ppo_mini_batch_size=2"], "KL-Cov, 8 mini-batches"),
        "grpo_ds_8mb": (["algo.name=grpo_ds", "algo.ppo_mini_batch_size=2"], "GRPO-ds, 8 mini-batches"),
        "steer": (["algo.name=steer"], "STEER (exponential, w_min 0.8)"),
        "justrl": (
            ["algo.name=justrl", "algo.dual_clip_c=10.0", "algo.ppo_mini_batch_size=4"],
            "JustRL (4 mini-batches)",
        ),
        "eapo": (["algo.name=eapo"], "EAPO ((H/H0)^1 on A > 0)"),
    }
    for name, (overrides, label) in baselines.items():
        arms[name] = {
            "overrides": [*overrides, f"algo.stare.target_entropy={target}"],
            "label": label,
            "study": "baselines",
        }
    for t in extra_targets:
        if t == target:
            continue
        arms[f"stare_o1_t{t}"] = {
            "overrides": ["algo.name=stare", "algo.stare.variant=O1", f"algo.stare.target_entropy={t}"],
            "label": f"STARE-O1 (H*={t})",
            "target": t,
        }
    for a in arms.values():
        a.setdefault("target", target)
    return arms


def arm_metrics(rd: Path, target: float, tail: int) -> dict:
    rows, evals, summary = read_run(rd)
    H = [r["entropy/batch"] for r in rows]
    gate_logged = any("stare/gate_on" in r for r in rows)
    gate = [float(r.get("stare/gate_on", 0.0) or 0.0) for r in rows]
    # GRPO-ds has no gate: use the step where H first falls below H* (where the gate would engage).
    first = (
        next((i for i, g in enumerate(gate) if g > 0), None)
        if gate_logged
        else next((i for i, h in enumerate(H) if h < target), None)
    )
    dev = None if first is None else sum(abs(h - target) for h in H[first:]) / len(H[first:])
    last = rows[-tail:] if rows else []

    def mean(key):
        vals = [r[key] for r in last if r.get(key) is not None]
        return sum(vals) / len(vals) if vals else None

    def gated_mean(key):
        vals = [r[key] for r in rows if r.get("stare/gate_on") and r.get(key) is not None]
        return sum(vals) / len(vals) if vals else None

    return {
        "steps": len(rows),
        "H_first": H[0] if H else None,
        "H_final": H[-1] if H else None,
        # Where the entropy settles: mean over the second half of the run (less noisy than one step).
        "H_second_half": sum(H[len(H) // 2 :]) / len(H[len(H) // 2 :]) if H else None,
        # How fast it falls: the mean over the first half (a method that delays the collapse shows here).
        "H_first_half": sum(H[: len(H) // 2]) / len(H[: len(H) // 2]) if len(H) > 1 else None,
        "H_min": min(H) if H else None,
        "H_max": max(H) if H else None,
        "first_gate_step": None if first is None else rows[first]["step"],
        "mean_abs_dev_after_gate": dev,
        "frac_gated": sum(gate) / len(gate) if gate and gate_logged else None,
        "acc_before_rl": summary.get("acc_before_rl"),
        "acc_after_rl": summary.get("acc_after_rl"),
        # Best held-out accuracy over every evaluation of the run (before RL included) and its step.
        "acc_best": summary.get("best_acc"),
        "acc_best_step": summary.get("best_acc_step"),
        "reward_final": mean("reward/mean"),
        "acc_train_final": mean("acc/train"),
        "tool_calls": mean("rollout/tool_calls"),
        "response_len": mean("rollout/response_len"),
        # Over gated steps only: how strongly STARE reweighted, and how many L+ tokens could raise
        # entropy at all (surprisal above their position's entropy).
        "mean_weight": gated_mean("stare/mean_weight"),
        # Share of loss tokens the algorithm selected or changed, mean over all steps.
        "selected_frac": (
            sum(r.get("algo/selected_frac") or 0.0 for r in rows) / len(rows)
            if rows and any("algo/selected_frac" in r for r in rows)
            else None
        ),
        "sampling_rounds": sum(r.get("batch/sampling_rounds", 0.0) for r in rows) / len(rows) if rows else None,
        "lplus_s_gt_h": gated_mean("stare/lplus_s_gt_h_frac"),
        "entropy": H,
        "gate": gate,
        "step": [r["step"] for r in rows],
        "acc_train": [r.get("acc/train") for r in rows],
        "eval": evals,
    }


def aggregate(per_seed: list[dict]) -> dict:
    keys = [
        "H_first",
        "H_final",
        "H_second_half",
        "H_first_half",
        "H_min",
        "H_max",
        "mean_abs_dev_after_gate",
        "frac_gated",
        "acc_before_rl",
        "acc_after_rl",
        "acc_best",
        "reward_final",
        "acc_train_final",
        "tool_calls",
        "response_len",
        "first_gate_step",
        "mean_weight",
        "lplus_s_gt_h",
        "selected_frac",
        "sampling_rounds",
    ]
    out = {}
    for k in keys:
        out[k], out[k + "_sd"] = mean_sd([m[k] for m in per_seed if m.get(k) is not None])
    out["n_seeds"] = len(per_seed)
    return out


PAIRED_KEYS = {"H_second_half": "dH_second_half", "H_first_half": "dH_first_half", "acc_after_rl": "dacc_after_rl"}


def add_paired_diffs(results: dict) -> None:
    """Each arm's second-half and first-half entropy and held-out accuracy after RL minus GRPO-ds's for
    the same seed (same prompts and sampling seeds, so the difference is paired), as mean and s.d.
    over the seeds both have, in the arm's agg (d<key>_vs_grpo_ds)."""
    ref = {m["seed"]: m for m in results["grpo_ds"]["per_seed"]} if "grpo_ds" in results else {}
    for name, r in results.items():
        for key, out in PAIRED_KEYS.items():
            diffs = [
                m[key] - ref[m["seed"]][key]
                for m in r["per_seed"]
                if m["seed"] in ref and m.get(key) is not None and ref[m["seed"]].get(key) is not None
            ]
            d, sd = mean_sd(diffs) if name != "grpo_ds" else (None, None)
            r["agg"][f"{out}_vs_grpo_ds"], r["agg"][f"{out}_vs_grpo_ds_sd"] = d, sd


def payload(arms: dict, results: dict, meta: dict) -> dict:
    """The numbers behind a table: per arm its label, target, aggregates and per-seed metrics."""
    slim = {
        n: {"label": arms[n]["label"], "target": arms[n]["target"], "agg": r["agg"], "per_seed": r["per_seed"]}
        for n, r in results.items()
    }
    return {"meta": meta, "arms": slim}


def write_table(arms: dict, results: dict, docs: Path, meta: dict, stem: str = "table") -> None:
    lines = [
        "# Entropy study table\n",
        f"Settings: `{json.dumps(meta)}`\n",
        "Means over seeds (± sample s.d. when >1 seed). Final entropy = last RL step's batch "
        "entropy; H 2nd half = mean batch entropy over the second half of the steps, and its "
        "difference to GRPO-ds of the same seed (same prompts and sampling seeds); "
        f"rates/lengths = mean over the last {meta['tail']} steps; "
        "|H-H*| = mean over steps from the first gated step on (n/a: gate never engaged; for "
        "GRPO-ds, which has no gate, from the first step with H < H*); "
        "held-out acc = eval/acc after RL.\n",
        "Mean weight and L+ s>H are over gated steps: the mean STARE weight of model tokens, and "
        "the share of L+ tokens whose surprisal exceeds their position's entropy (only those "
        "can raise entropy when reinforced).\n",
        "Selected = mean over steps of algo/selected_frac, the share of loss tokens the algorithm "
        "selected or changed; rounds = mean sampling rounds (barriers) per step.\n",
        "| arm | H* | seeds | H step1 | H final | H 2nd half | paired diff vs GRPO-ds | H min | mean abs(H-H*) after gate | frac gated "
        "| held-out acc (before -> after) | train acc (final) | tool calls | response len "
        "| mean weight | L+ s>H | selected | rounds |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, spec in arms.items():
        if name not in results:
            continue
        a = results[name]["agg"]
        d_mean, d_sd = a["dH_second_half_vs_grpo_ds"], a["dH_second_half_vs_grpo_ds_sd"]
        lines.append(
            f"| {spec['label']} | {spec['target']} | {a['n_seeds']} | {fmt(a['H_first'])} | "
            f"{fmt(a['H_final'], sd=a['H_final_sd'])} | "
            f"{fmt(a['H_second_half'], sd=a['H_second_half_sd'])} | {fmt(d_mean, '{:+.4f}', d_sd)} | "
            f"{fmt(a['H_min'])} | "
            f"{fmt(a['mean_abs_dev_after_gate'])} | {fmt(a['frac_gated'], '{:.2f}')} | "
            f"{fmt(a['acc_before_rl'], '{:.2f}')} -> {fmt(a['acc_after_rl'], '{:.2f}', a['acc_after_rl_sd'])} | "
            f"{fmt(a['acc_train_final'], '{:.2f}')} | {fmt(a['tool_calls'], '{:.2f}')} | "
            f"{fmt(a['response_len'], '{:.1f}')} | {fmt(a['mean_weight'], '{:.4f}')} | "
            f"{fmt(a['lplus_s_gt_h'], '{:.3f}')} | {fmt(a.get('selected_frac'), '{:.4f}')} | "
            f"{fmt(a.get('sampling_rounds'), '{:.2f}')} |"
        )
    write_report(docs, stem, lines, payload(arms, results, meta))


def paired(agg: dict, key: str, p: str = "{:+.4f}") -> str:
    """A paired difference to GRPO-ds (add_paired_diffs) as mean ± s.d."""
    return fmt(agg[f"{key}_vs_grpo_ds"], p, agg[f"{key}_vs_grpo_ds_sd"])


def write_baselines_table(arms: dict, results: dict, docs: Path, meta: dict, stem: str = "baselines_table") -> None:
    """The baselines study's table: per method the entropy at the first and last step and the held-out
    accuracy before/after RL and at its best, mean ± sample s.d. over the seeds it has, then every
    seed's own numbers (with 1-3 seeds a mean hides too much)."""
    lines = [
        "# Baselines study table\n",
        f"Settings: `{json.dumps(meta)}`\n",
        "Mean ± sample s.d. over the seeds in the `seeds` column (no ± with one seed). H = batch "
        "entropy of the sampled responses (nats/token); H step 1 is measured on the first batch, "
        "before any update; H last = step "
        f"{meta['steps']} (one noisy step); H 1st/2nd half = mean over the first/second half of the "
        "steps. Paired diff = the method's value minus GRPO-ds's for the same seed (same prompts and "
        "sampling seeds), mean ± s.d. over the seeds both have. Held-out accuracy: "
        "128 problems, one sample each (one problem = 0.008); best = the highest of the evaluations every "
        f"{meta['eval_every']} steps (before RL included). Selected = mean over steps of "
        "algo/selected_frac (share of loss tokens the method selected or changed); rounds = mean "
        "sampling rounds per step.\n",
        "| method | seeds | H step 1 | H 1st half | H 2nd half | H last | paired diff 1st half "
        "| paired diff 2nd half | held-out before | held-out after | held-out best | paired diff after "
        "| selected | rounds |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    per_seed_lines = [
        "\n## Per seed\n",
        "| method | seed | H step 1 | H 1st half | H 2nd half | H last | held-out before | after | best (step) "
        "| selected |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, spec in arms.items():
        if name not in results:
            continue
        a = results[name]["agg"]
        seeds = ",".join(str(m["seed"]) for m in results[name]["per_seed"])

        lines.append(
            f"| {spec['label']} | {a['n_seeds']} ({seeds}) | {fmt(a['H_first'], sd=a['H_first_sd'])} | "
            f"{fmt(a['H_first_half'], sd=a['H_first_half_sd'])} | "
            f"{fmt(a['H_second_half'], sd=a['H_second_half_sd'])} | {fmt(a['H_final'], sd=a['H_final_sd'])} | "
            f"{paired(a, 'dH_first_half')} | {paired(a, 'dH_second_half')} | "
            f"{fmt(a['acc_before_rl'], sd=a['acc_before_rl_sd'])} | "
            f"{fmt(a['acc_after_rl'], sd=a['acc_after_rl_sd'])} | {fmt(a['acc_best'], sd=a['acc_best_sd'])} | "
            f"{paired(a, 'dacc_after_rl', '{:+.3f}')} | "
            f"{fmt(a.get('selected_frac'), '{:.4f}')} | {fmt(a.get('sampling_rounds'), '{:.2f}')} |"
        )
        for m in results[name]["per_seed"]:
            per_seed_lines.append(
                f"| {spec['label']} | {m['seed']} | {fmt(m['H_first'])} | {fmt(m['H_first_half'])} | "
                f"{fmt(m['H_second_half'])} | {fmt(m['H_final'])} | {fmt(m['acc_before_rl'])} | {fmt(m['acc_after_rl'])} | "
                f"{fmt(m['acc_best'])} ({m['acc_best_step']}) | {fmt(m.get('selected_frac'), '{:.4f}')} |"
            )
    write_report(docs, stem, lines + per_seed_lines, payload(arms, results, meta))


def main(argv=None) -> None:
    p = study_parser(__doc__, seeds=[0, 1], steps=30, lr=2e-4, out="runs/study", jobs=1, threads=None)
    p.add_argument(
        "--target",
        type=float,
        default=0.3,
        help="target entropy H* for STARE-O1/C2 and the open-loop arms (default: 0.3)",
    )
    p.add_argument(
        "--targets",
        type=float,
        nargs="*",
        default=[0.2, 0.3, 0.4],
        help="target entropies for the STARE-O1 target sweep (default: 0.2 0.3 0.4; "
        "the one equal to --target reuses the stare_o1 arm)",
    )
    p.add_argument(
        "--study",
        choices=["stare", "baselines"],
        default="stare",
        help="stare: STARE's arms (table.md, entropy.png); baselines: GRPO-ds, STARE-O1 and the "
        "baseline methods (baselines_table.md, baselines.png) (default: stare)",
    )
    p.add_argument(
        "--arms",
        nargs="*",
        default=None,
        help="subset of arm names to run (default: the study's arms): grpo_ds stare_o1 "
        "stare_c2 open_w1.01 open_w2.0 stare_o1_t<T> c2_adaptive; baselines: dapo kl_cov clip_cov "
        "entropy_80_20 entropy_adv stapo simpletir kl_cov_2ep grpo_ds_2ep kl_cov_8mb grpo_ds_8mb steer justrl eapo",
    )
    p.add_argument(
        "--extra-arms",
        nargs="*",
        default=[],
        help="optional arms added to the default set: c2_adaptive (C2 with the adaptive "
        "schedule, a=0.05, M down to 0.1)",
    )
    p.add_argument(
        "--sft",
        default=None,
        help="existing SFT checkpoint (HF dir) to start every arm from; default: build "
        "one once under <out>/sft_base with the tiny_cpu SFT settings",
    )
    p.add_argument(
        "--eval-every",
        type=int,
        default=10,
        help="trainer.eval_every for each arm (0: only before/after RL; default: 10)",
    )
    p.add_argument(
        "--tail", type=int, default=5, help="steps at the end averaged for reward/tool-call/length columns (default: 5)"
    )
    p.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="extra config overrides passed to every train_tir.py call (incl. SFT)",
    )
    p.add_argument(
        "--sft-set", nargs="*", default=[], metavar="KEY=VALUE", help="extra overrides for the shared SFT run only"
    )
    args = p.parse_args(argv)

    out, docs = Path(args.out), Path(args.docs)
    out.mkdir(parents=True, exist_ok=True)
    docs.mkdir(parents=True, exist_ok=True)
    arms = arm_specs(args.target, args.targets)
    if args.study == "baselines":  # the reference arms, then the baselines
        arms = {k: v for k, v in arms.items() if k in ("grpo_ds", "stare_o1") or v.get("study") == "baselines"}
    else:
        arms = {k: v for k, v in arms.items() if v.get("study") != "baselines"}
    if args.arms:
        unknown = set(args.arms) - set(arms)
        if unknown:
            raise SystemExit(f"unknown arms {sorted(unknown)}; known: {sorted(arms)}")
        arms = {k: v for k, v in arms.items() if k in args.arms}
    else:
        arms = {k: v for k, v in arms.items() if not v.get("optional") or k in args.extra_arms}

    if not args.report_only:
        sft = args.sft or ensure_sft(out, [*args.set, *args.sft_set])
        common = [f"trainer.steps={args.steps}", f"learner.lr={args.lr}", f"trainer.eval_every={args.eval_every}"]
        run_arms(
            arms,
            args.seeds,
            out,
            lambda arm, seed: [*common, *args.set, *arms[arm]["overrides"]],
            sft,
            jobs=args.jobs,
            threads=args.threads,
        )

    results = {}
    for name, spec in arms.items():
        per_seed = []
        for seed in args.seeds:
            rd = run_dir(out, name, seed)
            if (rd / "summary.json").is_file():
                per_seed.append({**arm_metrics(rd, spec["target"], args.tail), "seed": seed})
        if per_seed:
            results[name] = {"per_seed": per_seed, "agg": aggregate(per_seed)}
    meta = {
        "seeds": args.seeds,
        "steps": args.steps,
        "lr": args.lr,
        "target": args.target,
        "targets": args.targets,
        "eval_every": args.eval_every,
        "tail": args.tail,
        "set": args.set,
    }
    add_paired_diffs(results)
    stem, figure = ("baselines_table", "baselines.png") if args.study == "baselines" else ("table", "entropy.png")
    meta["study"] = args.study
    (write_baselines_table if args.study == "baselines" else write_table)(arms, results, docs, meta, stem=stem)
    if results:
        plot(arms, results, docs, filename=figure, paired_heldout=args.study == "baselines")
    print(f"[study] wrote {docs / (stem + '.md')} ({len(results)} arms)", flush=True)


if __name__ == "__main__":
    main()
