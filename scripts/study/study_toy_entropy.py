#!/usr/bin/env python
"""What the entropy curve of `make train` (configs/tiny_cpu.yaml) is made of, measured on one run.

The toy's responses come in two modes: those that call the tool and those that answer directly.
metrics.jsonl splits each step's batch entropy by mode (entropy/tool_responses,
entropy/direct_responses) and gives the share of model tokens written in tool responses
(entropy/tool_token_frac), so that entropy/batch = frac x H_tool + (1 - frac) x H_direct exactly.
This script asks how much of the curve is the *mix* moving rather than either mode's own entropy:

- the fixed-mode reconstruction frac_t x H_tool(step 1) + (1 - frac_t) x H_direct(step 1), the
  mode entropies held at their step-1 values, against entropy/batch (its max and mean error);
- each mode's own drift, first -> last step (and over the first and last 5 steps);
- with every trajectory of each step in <run_dir>/samples (trainer.samples_every=1,
  trainer.samples_per_step large): the accuracy of each mode in the training rollouts, and the
  held-out accuracy of each evaluation against (tool-mode accuracy x the held-out tool-call rate).
  The evaluation rows hold eval/tool_calls (code executions per sample), used as the rate: it
  exceeds the rate by the share of samples that call twice, which the training rollouts show
  (rollout/tool_calls vs rollout/tool_use_frac).

Writes <docs>/toy_entropy.md and <docs>/toy_entropy.json.

The run and the analysis as reported:
    OMP_NUM_THREADS=1 python scripts/train_tir.py trainer.run_dir=runs/toy_default \\
        trainer.samples_every=1 trainer.samples_per_step=100000
    python scripts/study/study_toy_entropy.py --run runs/toy_default
(the two samples settings only write what each step sampled; they do not change training)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from harness import fmt, mean, read_run, write_report


def mode_accuracy(rd: Path, step: int) -> dict:
    """Accuracy and count of tool-calling and direct responses among a step's sampled trajectories
    (None without a samples file for that step)."""
    path = rd / "samples" / f"step_{step:06d}.jsonl"
    if not path.is_file():
        return {"acc_tool": None, "acc_direct": None, "n_tool": None, "n_direct": None}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    tool = [bool(r.get("correct")) for r in rows if (r.get("tool_calls") or 0) > 0]
    direct = [bool(r.get("correct")) for r in rows if not (r.get("tool_calls") or 0) > 0]
    return {
        "acc_tool": sum(tool) / len(tool) if tool else None,
        "acc_direct": sum(direct) / len(direct) if direct else None,
        "n_tool": len(tool),
        "n_direct": len(direct),
    }


def analyse(rd: Path) -> dict:
    rows, evals, summary = read_run(rd)
    first = rows[0]
    h_tool0, h_direct0 = first["entropy/tool_responses"], first["entropy/direct_responses"]
    steps = []
    for r in rows:
        frac = r["entropy/tool_token_frac"]
        h_t, h_d = r.get("entropy/tool_responses"), r.get("entropy/direct_responses")
        fixed = frac * h_tool0 + (1 - frac) * h_direct0
        # The identity with this step's own mode entropies (a check of the metrics; a side without
        # tokens contributes nothing).
        exact = frac * (h_t or 0.0) + (1 - frac) * (h_d or 0.0)
        steps.append(
            {
                "step": r["step"],
                "entropy_batch": r["entropy/batch"],
                "entropy_tool": h_t,
                "entropy_direct": h_d,
                "tool_token_frac": frac,
                "tool_use_frac": r.get("rollout/tool_use_frac"),
                "tool_calls": r.get("rollout/tool_calls"),
                "acc_train": r.get("acc/train"),
                "fixed_mode_mix": fixed,
                "fixed_mode_error": fixed - r["entropy/batch"],
                "identity_error": exact - r["entropy/batch"],
                "update_change": r.get("entropy/update_change"),
                **mode_accuracy(rd, r["step"]),
            }
        )

    def drift(key: str) -> dict:
        vals = [(s["step"], s[key]) for s in steps if s[key] is not None]
        if not vals:
            return {}
        return {
            "first": vals[0][1],
            "last": vals[-1][1],
            "last_step": vals[-1][0],
            "first5": mean(v for _, v in vals[:5]),
            "last5": mean(v for _, v in vals[-5:]),
        }

    # One constant for the whole run: the tool-mode accuracy of all training rollouts, times each
    # evaluation's tool-call rate (per-step accuracies swing with the batch's problems).
    eval_rows = [
        json.loads(line)
        for line in (rd / "metrics.jsonl").read_text().splitlines()
        if line.strip() and '"eval/acc"' in line
    ]
    by_step = {e["step"]: e for e in eval_rows if e.get("eval/acc") is not None}
    n_tool = sum(s["n_tool"] or 0 for s in steps)
    acc_tool = sum((s["acc_tool"] or 0.0) * (s["n_tool"] or 0) for s in steps) / n_tool if n_tool else None
    n_direct = sum(s["n_direct"] or 0 for s in steps)
    acc_direct = sum((s["acc_direct"] or 0.0) * (s["n_direct"] or 0) for s in steps) / n_direct if n_direct else None
    held = []
    for step, acc in evals:
        rate = by_step.get(step, {}).get("eval/tool_calls")
        predicted = acc_tool * rate if acc_tool is not None and rate is not None else None
        held.append(
            {
                "step": step,
                "eval_acc": acc,
                "eval_tool_calls": rate,
                "predicted": predicted,
                "error": predicted - acc if predicted is not None else None,
                # held-out accuracy per tool call: the held-out tool-mode accuracy when direct
                # answers score ~0 and an answer calls the tool at most once
                "acc_per_tool_call": acc / rate if rate else None,
            }
        )
    fixed_err = [abs(s["fixed_mode_error"]) for s in steps]
    return {
        "run_dir": str(rd),
        "steps": steps,
        "held_out": held,
        "h_tool_step1": h_tool0,
        "h_direct_step1": h_direct0,
        "fixed_mode_max_abs_error": max(fixed_err),
        "fixed_mode_mean_abs_error": sum(fixed_err) / len(fixed_err),
        # How much of the batch entropy's fall (step 1 -> mean of the last 5 steps) the mix alone
        # gives: the fixed-mode mix's fall over the measured one.
        "mix_share_of_fall": (steps[0]["fixed_mode_mix"] - mean(s["fixed_mode_mix"] for s in steps[-5:]))
        / (steps[0]["entropy_batch"] - mean(s["entropy_batch"] for s in steps[-5:])),
        "identity_max_abs_error": max(abs(s["identity_error"]) for s in steps),
        "drift": {k: drift(k) for k in ("entropy_batch", "entropy_tool", "entropy_direct", "tool_token_frac")},
        "acc_tool_pooled": acc_tool,
        "acc_direct_pooled": acc_direct,
        "n_tool_responses": n_tool,
        "n_direct_responses": n_direct,
        # how far code executions per trajectory exceed the share of trajectories with one (a
        # second call in the same answer): the gap between eval/tool_calls and a tool-call rate
        "max_calls_minus_use": max(
            (
                s["tool_calls"] - s["tool_use_frac"]
                for s in steps
                if s["tool_calls"] is not None and s["tool_use_frac"] is not None
            ),
            default=None,
        ),
        "acc_per_tool_call_range": [
            min(h["acc_per_tool_call"] for h in held if h["acc_per_tool_call"] is not None),
            max(h["acc_per_tool_call"] for h in held if h["acc_per_tool_call"] is not None),
        ]
        if any(h["acc_per_tool_call"] is not None for h in held)
        else None,
        "held_out_max_abs_error": max((abs(h["error"]) for h in held if h["error"] is not None), default=None),
        "acc_before_rl": summary.get("acc_before_rl"),
        "acc_after_rl": summary.get("acc_after_rl"),
        "seconds": summary.get("seconds"),
    }


def write_doc(a: dict, docs: Path, command: str) -> None:
    d = a["drift"]
    lines = [
        "# What the entropy curve of `make train` is made of\n",
        "Generated by `scripts/study/study_toy_entropy.py` from one run of the CPU default "
        "(configs/tiny_cpu.yaml: 40 RL steps of STARE-O1 after cold-start SFT, 16 prompts x 8 samples); "
        "numbers in [`toy_entropy.json`](toy_entropy.json).\n",
        "```",
        command,
        "```\n",
        "## Summary\n",
        f"- Tool responses are written at {fmt(d['entropy_tool']['first'])} nats/token at step 1, direct "
        f"answers at {fmt(d['entropy_direct']['first'])}. The share of model tokens in tool responses goes "
        f"{fmt(d['tool_token_frac']['first'])} -> {fmt(d['tool_token_frac']['last'])}, and entropy/batch "
        f"{fmt(d['entropy_batch']['first'])} -> {fmt(d['entropy_batch']['last'])}.",
        f"- Holding both modes at their step-1 entropies, frac x H_tool + (1 - frac) x H_direct "
        f"reproduces entropy/batch within {fmt(a['fixed_mode_max_abs_error'])} at every step "
        f"(mean error {fmt(a['fixed_mode_mean_abs_error'])}); the mix alone gives "
        f"{a['mix_share_of_fall']:.0%} of the fall from step 1 to the last 5 steps: the curve is the mix moving.",
        f"- Each mode's own entropy, first 5 -> last 5 steps: tool {fmt(d['entropy_tool']['first5'])} -> "
        f"{fmt(d['entropy_tool']['last5'])}, direct {fmt(d['entropy_direct']['first5'])} -> "
        f"{fmt(d['entropy_direct']['last5'])} (last step with direct answers: {d['entropy_direct'].get('last_step')}).",
        f"- Accuracy in the training rollouts, all steps pooled: tool responses {fmt(a['acc_tool_pooled'])} "
        f"({a['n_tool_responses']} responses), direct answers {fmt(a['acc_direct_pooled'])} "
        f"({a['n_direct_responses']}). Held-out accuracy {fmt(a['acc_before_rl'])} -> {fmt(a['acc_after_rl'])}; "
        f"{fmt(a['acc_tool_pooled'])} x the held-out tool-call rate matches every evaluation within "
        f"{fmt(a['held_out_max_abs_error'])}, and held-out accuracy per tool call stays in "
        f"{fmt((a['acc_per_tool_call_range'] or [None])[0])}-{fmt((a['acc_per_tool_call_range'] or [None, None])[1])}: "
        "RL raised accuracy by calling the tool more often, not by calling it better.",
        f"- Where the fixed-mode mix misses: it is high by up to {fmt(max(x['fixed_mode_error'] for x in a['steps']), '{:+.3f}')} "
        "late in the run, because each mode sharpened a little (the drifts above; the direct mode "
        f"measured on few responses by then: {a['steps'][-1]['n_direct']} of "
        f"{a['steps'][-1]['n_direct'] + a['steps'][-1]['n_tool']} at the last step), and off by "
        f"{fmt(min(x['fixed_mode_error'] for x in a['steps']), '{:+.3f}')} at worst early, where step-to-step noise in the direct "
        "mode's entropy dominates.",
        "\n## Held-out evaluations\n",
        "Predicted = the pooled tool-mode accuracy of the training rollouts x eval/tool_calls (code "
        "executions per held-out sample, used as the tool-call rate: in the training rollouts "
        "rollout/tool_calls exceeds rollout/tool_use_frac by at most "
        f"{fmt(a['max_calls_minus_use'])} at any step).\n",
        "| step | held-out acc | tool calls | predicted | error | acc per tool call |",
        "|---|---|---|---|---|---|",
    ]
    for h in a["held_out"]:
        lines.append(
            f"| {h['step']} | {fmt(h['eval_acc'])} | {fmt(h['eval_tool_calls'])} "
            f"| {fmt(h['predicted'])} | {fmt(h['error'], '{:+.3f}')} | {fmt(h['acc_per_tool_call'])} |"
        )
    lines += [
        "\n## Per step\n",
        "H = entropy/batch; H tool, H direct = entropy/tool_responses, entropy/direct_responses; "
        "frac = entropy/tool_token_frac; fixed-mode mix = frac x H_tool(step 1) + (1 - frac) x "
        "H_direct(step 1); use = rollout/tool_use_frac, calls = rollout/tool_calls; acc tool / direct "
        "= accuracy of each mode in that step's rollouts.\n",
        "| step | H | H tool | H direct | frac | fixed-mode mix | error | use | calls | acc/train | acc tool | acc direct |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in a["steps"]:
        lines.append(
            f"| {s['step']} | {fmt(s['entropy_batch'])} | {fmt(s['entropy_tool'])} | {fmt(s['entropy_direct'])} "
            f"| {fmt(s['tool_token_frac'])} | {fmt(s['fixed_mode_mix'])} | {fmt(s['fixed_mode_error'], '{:+.3f}')} "
            f"| {fmt(s['tool_use_frac'])} | {fmt(s['tool_calls'])} | {fmt(s['acc_train'])} "
            f"| {fmt(s['acc_tool'])} | {fmt(s['acc_direct'])} |"
        )
    lines.append(f"\nIdentity check (each step's own mode entropies): max error {a['identity_max_abs_error']:.1e}.")
    write_report(docs, "toy_entropy", lines, a)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", default="runs/toy_default", help="a finished run of configs/tiny_cpu.yaml (default: runs/toy_default)")  # fmt: skip
    p.add_argument("--docs", default="docs/study", help="where toy_entropy.md/.json go (default: docs/study)")
    args = p.parse_args(argv)
    rd = Path(args.run)
    if not (rd / "summary.json").is_file():
        raise SystemExit(f"{rd}: not a finished run (no summary.json)")
    command = (
        f"OMP_NUM_THREADS=1 python scripts/train_tir.py trainer.run_dir={rd} trainer.samples_every=1 "
        f"trainer.samples_per_step=100000\npython scripts/study/study_toy_entropy.py --run {rd}"
    )
    a = analyse(rd)
    write_doc(a, Path(args.docs), command)
    print(f"[toy-entropy] wrote {Path(args.docs) / 'toy_entropy.md'}", flush=True)


if __name__ == "__main__":
    main()
