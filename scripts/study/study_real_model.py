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
curves: the metrics of training runs (stare-train on the same SFT model, one run per arm) as a
table and a figure of batch entropy, gate and accuracy per step.

    python scripts/study/study_real_model.py premise --model RUN/sft/model --out docs/study/real_model_premise.json
    python scripts/study/study_real_model.py curves --runs stare=RUN_A grpo_ds=RUN_B --out docs/study/real_model
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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
    result = {
        "trajectories": len(batch),
        "rolled": len(rolled),
        "model_tokens": int(mask.sum()),
        "batch_entropy": float(h.mean()),
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


def curves(args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = dict(r.split("=", 1) for r in args.runs)
    keys = ("entropy/batch", "entropy/after_update", "stare/gate_on", "acc/train", "rollout/tool_use_frac")
    table, fig = {}, plt.figure(figsize=(12, 3.2))
    axes = fig.subplots(1, 3)
    for name, run_dir in arms.items():
        rows = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in rows if "entropy/batch" in r]
        evals = [(r["step"], r["eval/acc"]) for r in rows if r.get("eval/acc") is not None]
        table[name] = {"steps": [{k: r.get(k) for k in ("step", *keys)} for r in steps], "eval": evals}
        x = [r["step"] for r in steps]
        axes[0].plot(x, [r["entropy/batch"] for r in steps], marker="o", label=name)
        axes[1].plot(x, [r["acc/train"] for r in steps], marker="o", label=name)
        axes[2].plot([e[0] for e in evals], [e[1] for e in evals], marker="s", label=name)
    for ax, title in zip(axes, ("batch entropy (nats/token)", "train accuracy", "held-out accuracy")):
        ax.set_title(title)
        ax.set_xlabel("RL step")
        ax.legend()
    fig.tight_layout()
    fig.savefig(f"{args.out}.png", dpi=110)
    Path(f"{args.out}.json").write_text(json.dumps(table, indent=1) + "\n")
    for name, t in table.items():
        print(name, "eval:", t["eval"])
        for r in t["steps"]:
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
    c = sub.add_parser("curves")
    c.add_argument("--runs", nargs="+", required=True, metavar="NAME=RUN_DIR")
    c.add_argument("--out", required=True, help="output path without extension (.png and .json)")
    args = ap.parse_args()
    premise(args) if args.what == "premise" else curves(args)


if __name__ == "__main__":
    main()
