"""The STARE premise and STARE-O1 vs GRPO-ds on a real model (SmolLM2-135M-Instruct).

premise: one batch of this model's own rollouts (configs/smollm2_cpu.yaml, dynamic sampling as
in training), scored by the DeepSpeed learner, then one GRPO-ds update on it, and:
  - the four quadrants: share of model tokens with A > 0 / A < 0 and surprisal s = -log p above /
    below its position's entropy H (reinforcing a token raises H there only if s > H);
  - the share of L+ (STARE's top-P surprisal tokens of T+, the ones W acts on) with s > H;
  - per token, the entropy change the first-order term predicts for a policy-gradient step on
    that position's logits, dH = -A [p_y (log p_y + H) - sum_a p_a^2 (log p_a + H)] (the softmax's
    own sensitivity; the step size is one unknown scale), against the change measured by
    recomputing the same tokens after the update: correlation, sign agreement, means per quadrant.
arms: STARE-O1 and GRPO-ds runs (stare-train, configs/smollm2_cpu.yaml) from one SFT model, per
seed, through the studies' harness (same data order, the seed's sampling seed, SFT off).
sglang: a short RL run of this model against the real SGLang CPU server (`make sglang-cpu`):
the server serves the SFT model, stare-train rolls out on it and pushes the trained weights back
after every step (rollout.sglang.weight_sync, default distributed over gloo).
curves: the metrics of those runs as a table and a figure of batch entropy and accuracy per step,
each arm's mean over its seeds, with the per-seed paired differences (STARE-O1 - GRPO-ds).

The pre-registered experiment's exact commands and reading are in docs/study/real_model.md; in short:

    stare-sft --config configs/smollm2_cpu.yaml --output OUT/sft sft.tool_fraction=1.0
    python scripts/study/study_real_model.py premise --model OUT/sft --out docs/study/real_model_premise.json ...
    python scripts/study/study_real_model.py arms --sft OUT/sft --out OUT --seeds 0 1 --steps 14 --jobs 2 ...
    python scripts/study/study_real_model.py sglang --sft OUT/sft --out OUT/sglang --steps 3
    python scripts/study/study_real_model.py curves --study OUT --seeds 0 1 --target H* --out docs/study/real_model_arms
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

ARMS = {"stare": ["algo.name=stare"], "grpo_ds": ["algo.name=grpo_ds"]}


def first_order_terms(model, trajs, advantages) -> list:
    """Per response token: the first-order entropy change of a policy-gradient step A * grad log p_y
    on that position's logits alone (0 on observation tokens)."""
    import torch

    out = []
    with torch.no_grad():
        for t, a in zip(trajs, advantages):
            ids = torch.tensor([t.prompt_ids + t.response_ids])
            logits = model(ids).logits[0, len(t.prompt_ids) - 1 : -1].float()  # [R, V]
            logp = logits.log_softmax(-1)
            p = logp.exp()
            h = -(p * logp).sum(-1)  # [R]
            y = torch.tensor(t.response_ids)
            p_y, logp_y = p.gather(1, y[:, None])[:, 0], logp.gather(1, y[:, None])[:, 0]
            second = (p * p * (logp + h[:, None])).sum(-1)
            out.append(-a * (p_y * (logp_y + h) - second) * torch.tensor(t.loss_mask, dtype=torch.float32))
    return out


def premise(args: argparse.Namespace) -> None:
    import torch

    from stare_tir.algos.stare import stare_token_weights
    from stare_tir.config import read_config_layers, resolve_config
    from stare_tir.train_config import TrainConfig
    from stare_tir.trainer import build_run, close_run, collect_batch, group_advantages

    overrides = [f"trainer.prompts_per_step={args.prompts}", "sft.enabled=false", *args.overrides]
    cfg = resolve_config(TrainConfig, read_config_layers(str(args.config)), overrides)
    run = build_run(cfg, str(args.model), Path(tempfile.mkdtemp(prefix="study_real_model_")))
    try:
        batch, rolled, _ = collect_batch(run, 1, None)
        advantages, _ = group_advantages(batch, cfg.algo.advantage)
        old, ent = run.learner.compute_logprobs_entropy(batch)
        predicted = first_order_terms(run.learner.model, batch, advantages)
        run.learner.train_step(batch, advantages, None, old)
        _, ent_after = run.learner.compute_logprobs_entropy(batch)
    finally:
        close_run(run)
    mask = torch.cat([torch.tensor(t.loss_mask, dtype=torch.bool) for t in batch])
    s = torch.cat([-lp for lp in old])[mask]
    h = torch.cat(ent)[mask]
    a = torch.cat([torch.full((len(t.response_ids),), x) for t, x in zip(batch, advantages)])[mask]
    pred = torch.cat(predicted)[mask]
    meas = (torch.cat(ent_after) - torch.cat(ent))[mask]
    omega, _ = stare_token_weights(s, a, top_p=cfg.algo.stare.top_p, w=cfg.algo.stare.w)
    lplus = omega == cfg.algo.stare.w
    quads = {
        "A>0,s>H": (a > 0) & (s > h),
        "A>0,s<=H": (a > 0) & (s <= h),
        "A<0,s>H": (a < 0) & (s > h),
        "A<0,s<=H": (a < 0) & (s <= h),
    }
    moved = pred.abs() > pred.abs().median()  # sign agreement where the prediction is not ~0
    tool = torch.cat([torch.full((len(t.response_ids),), t.tool_calls > 0) for t in batch])[mask]
    result = {
        "trajectories": len(batch),
        "rolled": len(rolled),
        "model_tokens": int(mask.sum()),
        "batch_entropy": float(h.mean()),
        # the pre-registered H* is half of this (docs/study/real_model.md)
        "tool_response_entropy": float(h[tool].mean()) if tool.any() else None,
        "tplus_tokens": int((a > 0).sum()),
        "tool_use_frac": sum(t.tool_calls > 0 for t in batch) / max(len(batch), 1),
        "acc": sum(t.reward > 0 for t in batch) / max(len(batch), 1),
        "quadrant_share": {k: float(q.float().mean()) for k, q in quads.items()},
        "quadrant_measured_dH": {k: float(meas[q].mean()) if q.any() else None for k, q in quads.items()},
        "quadrant_predicted_dH_sign": {k: float(pred[q].sign().mean()) if q.any() else None for k, q in quads.items()},
        "lplus_tokens": int(lplus.sum()),
        "lplus_s_gt_h_frac": float((s[lplus] > h[lplus]).float().mean()) if lplus.any() else None,
        "tplus_s_gt_h_frac": float((s[a > 0] > h[a > 0]).float().mean()) if (a > 0).any() else None,
        "pred_vs_measured_pearson": float(torch.corrcoef(torch.stack([pred, meas]))[0, 1]),
        "sign_agreement_all": float((pred.sign() == meas.sign()).float().mean()),
        "sign_agreement_top_half": float((pred[moved].sign() == meas[moved].sign()).float().mean()),
        "measured_mean_dH": float(meas.mean()),
        "predicted_mean_dH_sign": float(pred.mean().sign()),
        "lr": cfg.learner.lr,
    }
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


def arms(args: argparse.Namespace) -> None:
    from harness import run_arms

    def overrides(arm: str, seed: int) -> list[str]:
        # the after-update entropy pass every step (entropy/update_change, compared between arms)
        return ["--config", str(args.config), f"trainer.steps={args.steps}", "trainer.eval_every=0",
                "trainer.diagnostics_every=1", *ARMS[arm], *args.overrides]  # fmt: skip

    run_arms(args.arms, args.seeds, Path(args.out), overrides, sft=args.sft, jobs=args.jobs)


def sglang(args: argparse.Namespace) -> None:
    import importlib.util
    import subprocess
    import time

    spec = importlib.util.spec_from_file_location("sglang_cpu_launch", ROOT / "tools" / "sglang_cpu" / "launch.py")
    launch = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = launch  # its dataclasses look their module up there
    spec.loader.exec_module(launch)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    server = launch.start_server(out / "server.log", Path(args.sft).resolve(), max_total_tokens=4096)
    print(f"real SGLang server on {args.sft} ready in {time.monotonic() - t0:.0f} s at {server.url}", flush=True)
    sync = [f"rollout.sglang.weight_sync={args.weight_sync}"]
    if args.weight_sync == "distributed":
        sync += ["rollout.sglang.dist_backend=gloo", "rollout.sglang.master_address=127.0.0.1"]
    cmd = [sys.executable, str(ROOT / "scripts" / "train_tir.py"), "--config", str(args.config), "--overwrite",
           f"trainer.run_dir={out / 'run'}", f"model.path={args.sft}", "sft.enabled=false",
           f"trainer.steps={args.steps}", "trainer.eval_every=0", "trainer.backend=sglang",
           f"rollout.sglang.urls={json.dumps([server.url])}", *sync, *args.overrides]  # fmt: skip
    try:
        t1 = time.monotonic()
        with open(out / "train.log", "w") as log:
            rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
        print(f"stare-train against the server: rc={rc} in {time.monotonic() - t1:.0f} s (log {out / 'train.log'})")
    finally:
        launch.stop(server)
    if rc != 0:
        raise SystemExit(rc)


KEYS = ("entropy/tool_responses", "entropy/batch", "entropy/update_change", "entropy/tool_token_frac",
        "stare/gate_on", "stare/lplus_s_gt_h_frac", "acc/train")  # fmt: skip
PRIMARY = "entropy/tool_responses"


def late_mean(rows: list[dict], key: str, window: int) -> float | None:
    """Mean of `key` over the run's last `window` steps (its plateau, the pre-registered window)."""
    from harness import mean

    return mean(r.get(key) for r in rows[-window:])


def verdict(per_seed: dict, target: float, window: int) -> dict:
    """The pre-registered reading (docs/study/real_model.md, written before the runs), applied to the
    runs' rows: per seed the late-window tool-response entropy of each arm, their paired difference
    D = STARE-O1 - GRPO-ds, whether STARE's gate opened, and the held-out accuracy difference."""
    from harness import mean

    seeds = sorted(per_seed)
    rows = {s: {arm: per_seed[s][arm][0] for arm in ("stare", "grpo_ds")} for s in seeds}
    late = {s: {arm: late_mean(rows[s][arm], PRIMARY, window) for arm in rows[s]} for s in seeds}
    diff = {s: late[s]["stare"] - late[s]["grpo_ds"] for s in seeds}
    gate = {s: sum(r.get("stare/gate_on") or 0 for r in rows[s]["stare"]) for s in seeds}
    acc = {s: per_seed[s]["stare"][1][-1][1] - per_seed[s]["grpo_ds"][1][-1][1] for s in seeds}
    mean_diff, mean_acc = mean(diff.values()), mean(acc.values())
    collapsed = all(late[s]["grpo_ds"] < 0.75 * target for s in seeds)
    held = all(late[s]["stare"] >= 0.75 * target and diff[s] > 0 for s in seeds)
    if collapsed and held and abs(mean_acc) <= 0.1:
        reading = (
            "supports: STARE-O1 held tool-response entropy near H* while GRPO-ds fell below it, accuracy within noise"
        )
    elif collapsed and held:
        reading = "entropy held, at an accuracy difference beyond noise"
    elif all(d <= 0 for d in diff.values()) or abs(mean_diff) < 0.02:
        reading = "does not support: STARE-O1's late entropy is not above GRPO-ds's (or within 0.02 of it)"
    elif not all(late[s]["grpo_ds"] < target for s in seeds):
        reading = "weak test: GRPO-ds did not fall below H* in every seed"
    else:
        reading = "inconclusive: the paired differences disagree in sign or STARE-O1 fell below 0.75 H*"
    return {
        "target_entropy": target,
        "window_steps": window,
        "late_tool_response_entropy": late,
        "paired_late_diff": diff,
        "paired_late_diff_mean": mean_diff,
        "stare_gate_open_steps": gate,
        "paired_final_eval_diff": acc,
        "paired_final_eval_diff_mean": mean_acc,
        "grpo_ds_collapsed": collapsed,
        "stare_held": held,
        "reading": reading,
    }


def curves(args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from harness import mean_sd, read_run, run_dir

    runs = {arm: {s: read_run(run_dir(Path(args.study), arm, s)) for s in args.seeds} for arm in args.arms}
    table: dict = {"seeds": args.seeds, "arms": {}, "paired": {}}
    fig = plt.figure(figsize=(15, 3.4))
    axes = fig.subplots(1, 4)
    for arm, per_seed in runs.items():
        color = "C0" if arm == "stare" else "C1"
        rows = {s: {r["step"]: r for r in steps} for s, (steps, _, _) in per_seed.items()}
        n_steps = min(len(r) for r in rows.values())
        mean_rows = [
            {"step": k, **{key: mean_sd(rows[s][k].get(key) for s in rows)[0] for key in KEYS}}
            for k in range(1, n_steps + 1)
        ]
        evals = {s: dict(ev) for s, (_, ev, _) in per_seed.items()}
        table["arms"][arm] = {
            "per_step_mean": mean_rows,
            "per_seed": {s: [{k: rows[s][st].get(k) for k in ("step", *KEYS)} for st in sorted(rows[s])] for s in rows},
            "eval": {s: sorted(ev.items()) for s, ev in evals.items()},
            "final_eval_mean_sd": mean_sd(max(ev.items())[1] for ev in evals.values()),
        }
        x = [r["step"] for r in mean_rows]
        for ax, key in zip(axes[:3], (PRIMARY, "stare/gate_on", "acc/train")):
            if key == "stare/gate_on" and arm != "stare":
                continue
            for s in rows:
                ax.plot(x, [rows[s][k].get(key) for k in x], alpha=0.3, color=color)
            ax.plot(x, [r[key] for r in mean_rows], marker="o", color=color, label=f"{arm} (mean of seeds)")
        for j, s in enumerate(evals):
            pts = sorted(evals[s].items())
            axes[3].plot([p[0] for p in pts], [p[1] for p in pts], marker="s", alpha=0.6, color=color,
                         label=arm if j == 0 else None)  # fmt: skip
    axes[0].axhline(args.target, color="k", linestyle="--", linewidth=1, label="H*")
    if {"stare", "grpo_ds"} <= set(runs):
        a, b = (table["arms"][k]["per_seed"] for k in ("stare", "grpo_ds"))
        for key in (PRIMARY, "entropy/batch", "entropy/update_change", "acc/train"):
            diffs = [
                [ra[key] - rb[key] for ra, rb in zip(a[s], b[s]) if ra.get(key) is not None and rb.get(key) is not None]
                for s in args.seeds
            ]
            table["paired"][key] = {
                "per_seed_per_step": diffs,
                "per_seed_mean_diff": [mean_sd(d)[0] for d in diffs],
                "mean_sd_over_seeds": mean_sd(mean_sd(d)[0] for d in diffs),
            }
        per_seed = {s: {arm: runs[arm][s] for arm in ("stare", "grpo_ds")} for s in args.seeds}
        table["verdict"] = verdict(per_seed, args.target, args.window)
    titles = ("tool-response entropy (nats/token)", "STARE gate open", "train accuracy", "held-out accuracy")
    for ax, title in zip(axes, titles):
        ax.set_title(title)
        ax.set_xlabel("RL step")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(f"{args.out}.png", dpi=110)
    Path(f"{args.out}.json").write_text(json.dumps(table, indent=1) + "\n")
    print(
        json.dumps(
            {"verdict": table.get("verdict"), **{a: t["final_eval_mean_sd"] for a, t in table["arms"].items()}},
            indent=1,
        )
    )
    for arm, t in table["arms"].items():
        print(arm)
        for r in t["per_step_mean"]:
            print("  ", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("premise")
    p.add_argument("--model", required=True, help="HF model directory (e.g. a run's sft/model)")
    p.add_argument("--config", default=ROOT / "configs" / "smollm2_cpu.yaml")
    p.add_argument("--prompts", type=int, default=8, help="prompts in the batch (x rollout.n_per_prompt)")
    p.add_argument("--out", default="")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    a = sub.add_parser("arms")
    a.add_argument("--sft", required=True, help="the SFT model every run starts from (stare-sft --output)")
    a.add_argument("--out", required=True, help="study directory: one run directory per arm and seed")
    a.add_argument("--config", default=ROOT / "configs" / "smollm2_cpu.yaml")
    a.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    a.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    a.add_argument("--steps", type=int, default=6, help="RL steps per run")
    a.add_argument("--jobs", type=int, default=1, help="runs at once")
    a.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    g = sub.add_parser("sglang")
    g.add_argument("--sft", required=True, help="the model the server serves and the run starts from")
    g.add_argument("--out", required=True, help="directory for the server's log and the run")
    g.add_argument("--config", default=ROOT / "configs" / "smollm2_cpu.yaml")
    g.add_argument("--steps", type=int, default=3)
    g.add_argument("--weight-sync", default="distributed", choices=["disk", "tensor", "distributed"])
    g.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    c = sub.add_parser("curves")
    c.add_argument("--study", required=True, help="the study directory of `arms`")
    c.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    c.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    c.add_argument("--out", required=True, help="output path without extension (.png and .json)")
    c.add_argument("--target", type=float, required=True, help="the runs' algo.stare.target_entropy (H*)")
    c.add_argument("--window", type=int, default=4, help="late window: the last N steps (pre-registered: 4)")
    args = ap.parse_args()
    {"premise": premise, "arms": arms, "sglang": sglang, "curves": curves}[args.what](args)


if __name__ == "__main__":
    main()
