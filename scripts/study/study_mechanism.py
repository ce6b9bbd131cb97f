#!/usr/bin/env python
"""How much can STARE's reweighting move the entropy? A first-order look at real batches.

Rolls out batches with the entropy study's shared SFT checkpoint (the study's step-1 prompts and
sampling seeds), then splits the policy gradient g = grad J, J = token-mean(A * log pi), into
STARE's token groups:
    L+ = the top-P surprisal tokens of T+ (A > 0): STARE multiplies their advantage by W
    T+ rest, L- = the top-P surprisal tokens of T- (C2 multiplies by M), T- rest.
For each group it reports how a step along that group's gradient changes the batch entropy H:
    SGD:   dH/dlr = <grad H, g_group>              (exact to first order; additive over groups)
    Adam:  the first step is lr * g / (|g| + eps) per parameter (bias-corrected m / sqrt(v) at
           step 1), so dH = lr * <grad H, g(W) / (|g(W)| + eps)>: not additive, the weight W only
           matters where it flips a parameter's sign.
and checks the predictions with real one-step updates (torch SGD and AdamW) on the same batch for
several W. Writes <docs>/mechanism.md and <docs>/mechanism.json.

Example:
    python scripts/study/study_mechanism.py --sft runs/study/sft_base/sft/model --batches 2
"""

from __future__ import annotations

import argparse
import copy
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import harness
from harness import TINY_CPU

if TYPE_CHECKING:  # torch is imported inside the functions: --help stays light
    import torch

GROUPS = ("L+", "T+ rest", "L-", "T- rest")


def flat_grad(loss, params) -> torch.Tensor:
    import torch

    grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params)])


def batch_tensors(model, batch, advantages, pad_id: int):
    """Per loss token: log pi, entropy (both with grad), advantage, and the STARE group masks."""
    import torch

    from stare_tir.learner.micro_batch import build_micro_batch

    mb = build_micro_batch(batch, list(range(len(batch))), pad_id)
    logits = model(
        input_ids=mb.input_ids, attention_mask=mb.attention_mask, position_ids=mb.position_ids
    ).logits  # [B, L, V]
    # Plain autograd (the trainer's fused kernel has no entropy gradient): [N, V] is small here.
    logp_all = torch.log_softmax(logits[mb.sel_rows, mb.sel_pos].float(), dim=-1)  # [N, V]
    logp = logp_all.gather(1, mb.targets[:, None]).squeeze(1)  # [N]
    ent = -(logp_all.exp() * logp_all).sum(-1)  # [N]
    adv = torch.tensor([advantages[mb.indices[r]] for r in mb.sel_rows.tolist()])  # [N]
    return logp, ent, adv


def group_masks(logp, adv, top_p: float) -> dict:
    from stare_tir.algos.stare import stare_token_weights

    # C2 with distinct sentinel weights marks L+ (w) and L- (m) exactly as the trainer selects them.
    omega, _ = stare_token_weights(-logp.detach(), adv, top_p=top_p, w=2.0, m=0.5, variant="C2")
    lp, lm = omega == 2.0, omega == 0.5
    return {"L+": lp, "T+ rest": (adv > 0) & ~lp, "L-": lm, "T- rest": (adv < 0) & ~lm}


def objective(logp, adv, weights) -> torch.Tensor:
    """J = token-mean(omega * A * log pi): the clipped surrogate's value and gradient at rho = 1."""
    return (weights * adv * logp).sum() / logp.numel()


def analyse_batch(model, batch, advantages, pad_id, args) -> dict:
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    logp, ent, adv = batch_tensors(model, batch, advantages, pad_id)
    masks = group_masks(logp, adv, args.top_p)
    H = ent.mean()
    gH = flat_grad(H, params)
    g = {k: flat_grad(objective(logp, adv, m.float()), params) for k, m in masks.items()}
    s, e = (-logp).detach(), ent.detach()
    groups = {}
    for k, m in masks.items():
        groups[k] = {
            "tokens": int(m.sum()),
            "frac_tokens": float(m.float().mean()),
            "mean_surprisal": float(s[m].mean()) if m.any() else None,
            "mean_entropy": float(e[m].mean()) if m.any() else None,
            # Raising log pi of a token raises its position's entropy iff its surprisal exceeds
            # that entropy (d H / d z_a = p_a (s_a - H)): the share of the group that can do it.
            "frac_s_gt_H": float((s[m] > e[m]).float().mean()) if m.any() else None,
            "grad_norm": float(g[k].norm()),
            "sgd_dH_per_lr": float(gH @ g[k]),
        }
    # L+ at other P, and the T+ tokens that can raise entropy at all (s > H at their position).
    p_sweep = {}
    for top_p in args.p_sweep:
        lp = group_masks(logp, adv, top_p)["L+"]
        p_sweep[str(top_p)] = {
            "tokens": int(lp.sum()),
            "mean_surprisal": float(s[lp].mean()),
            "frac_s_gt_H": float((s[lp] > e[lp]).float().mean()),
            "sgd_dH_per_lr": float(gH @ flat_grad(objective(logp, adv, lp.float()), params)),
        }
    raising = (adv > 0) & (s > e)
    p_sweep["T+ with s>H"] = {
        "tokens": int(raising.sum()),
        "mean_surprisal": float(s[raising].mean()) if raising.any() else None,
        "frac_s_gt_H": 1.0 if raising.any() else None,
        "sgd_dH_per_lr": float(gH @ flat_grad(objective(logp, adv, raising.float()), params)),
    }
    other = sum(groups[k]["sgd_dH_per_lr"] for k in GROUPS if k != "L+")
    lplus = groups["L+"]["sgd_dH_per_lr"]
    w_balance = -other / lplus if lplus > 0 and other < 0 else None

    def g_of(w: float, m: float = 1.0):
        return w * g["L+"] + g["T+ rest"] + m * g["L-"] + g["T- rest"]

    def adam_dir(v):
        return v / (v.abs() + args.adam_eps)

    pred = {}
    for w in args.ws:
        gw = g_of(w)
        pred[str(w)] = {
            "sgd_dH_per_lr": float(gH @ gw),
            "adam_dH": float(args.lr * (gH @ adam_dir(gw))),
            "sign_flips": float((torch.sign(gw) != torch.sign(g_of(1.0))).float().mean()),
        }
    for m in args.ms:  # C2's M on L- (W = 1): the other lever STARE has
        gm = g_of(1.0, m)
        pred[f"M={m}"] = {
            "sgd_dH_per_lr": float(gH @ gm),
            "adam_dH": float(args.lr * (gH @ adam_dir(gm))),
            "sign_flips": float((torch.sign(gm) != torch.sign(g_of(1.0))).float().mean()),
        }
    # Real one-step updates on the same batch: does the first-order picture hold?
    sgd_lr = abs(pred["1.0"]["adam_dH"]) / max(abs(pred["1.0"]["sgd_dH_per_lr"]), 1e-12)
    real = {}
    settings = [(str(w), w, 1.0) for w in args.ws] + [(f"M={m}", 1.0, m) for m in args.ms]
    for key, w, m in settings:
        weights = torch.ones_like(adv)
        weights[masks["L+"]] = w
        weights[masks["L-"]] = m
        row = {}
        for opt_name in ("sgd", "adam"):
            m2 = copy.deepcopy(model)
            ps = [p for p in m2.parameters() if p.requires_grad]
            opt = (
                torch.optim.SGD(ps, lr=sgd_lr)
                if opt_name == "sgd"
                else torch.optim.AdamW(ps, lr=args.lr, eps=args.adam_eps, weight_decay=0.0)
            )
            lp2, _, _ = batch_tensors(m2, batch, advantages, pad_id)
            (-objective(lp2, adv, weights)).backward()
            opt.step()
            with torch.no_grad():
                _, ent2, _ = batch_tensors(m2, batch, advantages, pad_id)
            row[f"{opt_name}_dH"] = float(ent2.mean() - H.detach())
        real[key] = row
    return {
        "H": float(H.detach()),
        "tokens": int(logp.numel()),
        "groups": groups,
        "w_balance_sgd": w_balance,
        "predicted": pred,
        "real": real,
        "sgd_lr": sgd_lr,
        "p_sweep": p_sweep,
    }


def write_report(results: list[dict], args, docs: Path) -> None:
    lines = [
        "# STARE mechanism: how far can reweighting move the entropy?\n",
        f"Produced by `scripts/study/study_mechanism.py` (SFT checkpoint of the entropy study, "
        f"{len(results)} batch(es) of 16 prompts x 8 samples from the SFT policy, P={args.top_p}, "
        f"Adam lr={args.lr}). Numbers per batch.\n",
        "dH/dlr (SGD) is the exact first-order entropy change per unit learning rate of a step "
        "along that group's policy gradient; the columns add up to the whole batch's.\n",
    ]
    for i, r in enumerate(results):
        lines += [
            f"## Batch {i + 1}: H = {r['H']:.3f}, {r['tokens']} model tokens\n",
            "| group | tokens | frac | mean surprisal | mean entropy | frac s > H | grad norm | SGD dH/dlr |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for k in GROUPS:
            gr = r["groups"][k]
            ms = "n/a" if gr["mean_surprisal"] is None else f"{gr['mean_surprisal']:.3f}"
            me = "n/a" if gr["mean_entropy"] is None else f"{gr['mean_entropy']:.3f}"
            fs = "n/a" if gr["frac_s_gt_H"] is None else f"{gr['frac_s_gt_H']:.2f}"
            lines.append(
                f"| {k} | {gr['tokens']} | {gr['frac_tokens']:.3f} | {ms} | {me} | {fs} | "
                f"{gr['grad_norm']:.4f} | {gr['sgd_dH_per_lr']:+.5f} |"
            )
        wb = r["w_balance_sgd"]
        lines += [
            "",
            f"W at which L+ cancels the other groups' first-order entropy change under SGD: "
            f"{'n/a' if wb is None else f'{wb:.1f}'}\n",
            f"| weights | SGD dH/dlr (pred.) | SGD dH real (lr {r['sgd_lr']:.3g}) | "
            f"Adam dH (pred.) | Adam dH real | params whose sign flips vs GRPO |",
            "|---|---|---|---|---|---|",
        ]
        for key in [str(w) for w in args.ws] + [f"M={m}" for m in args.ms]:
            p, q = r["predicted"][key], r["real"][key]
            name = f"L- x {key[2:]}" if key.startswith("M=") else f"L+ x {key}"
            lines.append(
                f"| {name} | {p['sgd_dH_per_lr']:+.5f} | {q['sgd_dH']:+.5f} | {p['adam_dH']:+.5f} | "
                f"{q['adam_dH']:+.5f} | {p['sign_flips']:.3f} |"
            )
        lines += [
            "",
            "L+ selected at other P (top-P surprisal of T+), and all T+ tokens with s > H:\n",
            "| selection | tokens | mean surprisal | frac s > H | SGD dH/dlr |",
            "|---|---|---|---|---|",
        ]
        for k, q in r["p_sweep"].items():
            ms = "n/a" if q["mean_surprisal"] is None else f"{q['mean_surprisal']:.3f}"
            fs = "n/a" if q["frac_s_gt_H"] is None else f"{q['frac_s_gt_H']:.2f}"
            name = k if k.startswith("T+") else f"L+ at P={k}"
            lines.append(f"| {name} | {q['tokens']} | {ms} | {fs} | {q['sgd_dH_per_lr']:+.5f} |")
        lines.append("")
    harness.write_report(docs, "mechanism", lines, {"args": vars(args), "batches": results})


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--sft",
        default="runs/study/sft_base/sft/model",
        help="SFT checkpoint (HF dir) whose rollouts are analysed (default: the entropy "
        "study's shared one, runs/study/sft_base/sft/model)",
    )
    p.add_argument("--batches", type=int, default=2, help="batches (RL steps 1..N of seed 0) to analyse")
    p.add_argument("--seed", type=int, default=0, help="trainer.seed for the rollouts (default: 0)")
    p.add_argument("--top-p", type=float, default=0.1, help="STARE P (default: 0.1)")
    p.add_argument(
        "--ws",
        type=float,
        nargs="+",
        default=[1.0, 1.1, 2.0, 10.0],
        help="weights W on L+ to evaluate (must include 1.0; default: 1 1.1 2 10)",
    )
    p.add_argument(
        "--ms",
        type=float,
        nargs="*",
        default=[0.9, 0.5, 0.0],
        help="weights M on L- (C2's lever, with W = 1) to evaluate (default: 0.9 0.5 0)",
    )
    p.add_argument(
        "--p-sweep",
        type=float,
        nargs="*",
        default=[0.01, 0.02, 0.05, 0.1, 0.2],
        help="other P values at which to report L+'s entropy effect",
    )
    p.add_argument("--lr", type=float, default=1e-4, help="Adam learning rate (default: 1e-4, the study's)")
    p.add_argument("--adam-eps", type=float, default=1e-8, help="Adam eps (default: 1e-8, the learner's)")
    p.add_argument("--docs", default="docs/study", help="output directory (default: docs/study)")
    p.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="extra config overrides for the rollout (same as the study's --set)",
    )
    args = p.parse_args(argv)
    if 1.0 not in args.ws:
        p.error("--ws must include 1.0 (the GRPO reference)")
    if not Path(args.sft, "config.json").is_file():
        p.error(
            f"--sft {args.sft!r} is not an HF checkpoint dir; run scripts/study/study_entropy.py first "
            "(it builds the shared SFT checkpoint) or pass --sft"
        )

    import torch
    from transformers import AutoModelForCausalLM

    from stare_tir.config import load_config
    from stare_tir.train_config import TrainConfig
    from stare_tir.trainer import build_run, close_run, collect_batch, group_advantages

    torch.manual_seed(0)
    cfg = load_config(
        TrainConfig,
        TINY_CPU,
        [
            f"model.path={args.sft}",
            "sft.enabled=false",
            "algo.name=grpo_ds",
            f"trainer.seed={args.seed}",
            "data.seed=0",
            "data.arithmetic_eval_size=8",
            *args.set,
        ],
    )
    batches = []
    with tempfile.TemporaryDirectory() as td:
        run = build_run(cfg, args.sft, Path(td))
        try:
            for step in range(1, args.batches + 1):
                batch = collect_batch(run, step)[0]
                if not batch:
                    raise SystemExit(
                        f"batch {step}: no prompt group with differing rewards, nothing to "
                        "analyse; raise trainer.prompts_per_step or use a better SFT model"
                    )
                batches.append(batch)
            pad_id = run.parts.tokenizer.pad_token_id
        finally:
            close_run(run)
    model = AutoModelForCausalLM.from_pretrained(args.sft, dtype=torch.float32)
    model.eval()  # no dropout: the gradients are the policy's, not a noisy sample of them
    results = []
    for i, batch in enumerate(batches):
        adv, _ = group_advantages(batch, cfg.algo.advantage)
        r = analyse_batch(model, batch, adv, pad_id, args)
        results.append(r)
        print(
            f"[mechanism] batch {i + 1}: H={r['H']:.3f} "
            + " ".join(f"{k}:{r['groups'][k]['sgd_dH_per_lr']:+.4f}" for k in GROUPS)
            + f" w_balance={r['w_balance_sgd']}",
            flush=True,
        )
    docs = Path(args.docs)
    docs.mkdir(parents=True, exist_ok=True)
    write_report(results, args, docs)
    r0 = results[0]
    print(
        f"RESULT H={r0['H']:.3f} lplus_frac={r0['groups']['L+']['frac_tokens']:.3f} "
        f"lplus_dH={r0['groups']['L+']['sgd_dH_per_lr']:+.5f} "
        f"total_dH={sum(r0['groups'][k]['sgd_dH_per_lr'] for k in GROUPS):+.5f} "
        f"w_balance_sgd={r0['w_balance_sgd']}",
        flush=True,
    )


if __name__ == "__main__":
    main()
