#!/usr/bin/env python
"""Reward-neutral choice on the toy: does GRPO-ds collapse a choice the reward does not see, and
does STARE-O1 hold it?

On the default toy task the entropy curve is tool adoption (tool calls are written at a far lower
entropy than direct answers, and RL raises their share), so STARE has nothing to act on there.
This arm keeps a choice *inside* the tool mode that the reward cannot tell apart: the cold-start
SFT traces all call the tool (sft.tool_fraction=1.0) and write their code in one of two styles
drawn 50/50 (sft.code_styles=[print,assign]; --styles changes the mix):

    print(347*829)                 "print"
    x = 347*829\\nprint(x)          "assign"

Both print the same line, so the interpreter's output and the grade are identical. The choice is
made at one token (the first of the code block: `print` or `x`). Each RL step writes every
trajectory it sampled to <run_dir>/samples/step_N.jsonl (trainer.samples_every=1,
trainer.samples_per_step large); this script classifies the first code block of each response
that called the tool and reports per step the share of the rarer style ("minority share", 0.5 =
an even mix, 0 = collapsed) and the choice entropy in nats (ln 2 = 0.693 for an even mix, 0 for a
collapsed one), next to accuracy, entropy/batch and STARE's gate.

One shared SFT checkpoint (built once under <out>/sft_base), then GRPO-ds and STARE-O1 (H*=0.3,
the tiny_cpu defaults otherwise) for each seed, all with the same data order (data.seed=0) and,
per seed, the same sampling seeds: arm differences are paired by seed.

Writes <docs>/neutral_choice.md (setup, commands, a per-step table of means over seeds, per-seed
numbers, a verdict), <docs>/neutral_choice.json (the numbers) and <docs>/neutral_choice.png.

Sizing: 30 RL steps of 16 prompts x 8 samples (the tiny_cpu batch) at tiny_cpu's lr 1e-4, 8000
SFT traces (all with the tool; more tool traces than the default's 5600), held-out accuracy before
and after RL only. On 2 cores shared with another job this took ~10 min per pair of runs.

The study as reported (2 runs at a time, 1 thread each):
    OMP_NUM_THREADS=1 python scripts/study/study_neutral_choice.py
The table again from finished runs, launching nothing:
    python scripts/study/study_neutral_choice.py --report-only
A skewed start (80/20), where a restoring force toward the rarer style would show (its own --out
and --docs: the SFT differs):
    OMP_NUM_THREADS=1 python scripts/study/study_neutral_choice.py --styles print print print print assign \\
        --out runs/neutral_choice_80_20 --docs docs/study/neutral_choice_80_20
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

from harness import ensure_sft, fmt, mean, read_run, run_arms, run_dir, study_parser, write_report

STYLES = ("print", "assign")
ARMS = {
    "grpo_ds": {"overrides": ["algo.name=grpo_ds"], "label": "GRPO-ds"},
    "stare_o1": {"overrides": ["algo.name=stare", "algo.stare.variant=O1"], "label": "STARE-O1 (H*=0.3)"},
}
_CODE_RE = re.compile(r"<code>\s*```python\n(.*?)```", re.DOTALL)
_PRINT_RE = re.compile(r"print\(([^\n]*)\)")
_ASSIGN_RE = re.compile(r"([A-Za-z_]\w*) = ([^\n]*)\nprint\(\1\)")


def code_style(text: str) -> str | None:
    """The style of a response's first code block: "print" (print(EXPR) alone), "assign" (a name
    bound to EXPR, then print(name)), "other" (anything else), None without a code block."""
    m = _CODE_RE.search(text)
    if m is None:
        return None
    code = m.group(1).strip()
    if _PRINT_RE.fullmatch(code):
        return "print"
    if _ASSIGN_RE.fullmatch(code):
        return "assign"
    return "other"


def choice_stats(rows: list[dict]) -> dict:
    """One step's samples rows -> counts per style over the responses that called the tool, the
    share of "assign" and of the rarer style among the classified ones, the choice entropy (nats)
    and the accuracy of each style (the choice is reward-neutral only if these agree)."""
    tool = [r for r in rows if (r.get("tool_calls") or 0) > 0]
    styles = [code_style(r["text"]) for r in tool]
    counts = {s: styles.count(s) for s in (*STYLES, "other")}
    n = counts["print"] + counts["assign"]
    p = counts["assign"] / n if n else None
    entropy = None if p is None else -sum(q * math.log(q) for q in (p, 1 - p) if q > 0)
    acc = {}
    for s in STYLES:
        graded = [bool(r.get("correct")) for r, st in zip(tool, styles) if st == s]
        acc[s] = sum(graded) / len(graded) if graded else None
    return {
        "n": len(rows),
        "n_tool": len(tool),
        **{f"n_{s}": c for s, c in counts.items()},
        "assign_share": p,
        "minority_share": None if p is None else min(p, 1 - p),
        "choice_entropy": entropy,
        "acc_print": acc["print"],
        "acc_assign": acc["assign"],
        "correct_print": sum(bool(r.get("correct")) for r, st in zip(tool, styles) if st == "print"),
        "correct_assign": sum(bool(r.get("correct")) for r, st in zip(tool, styles) if st == "assign"),
    }


def run_curves(rd: Path) -> dict:
    """Per RL step of one finished run: choice statistics from its samples files, and from
    metrics.jsonl the accuracy, entropy and gate; plus held-out accuracy and wall time."""
    rows, evals, summary = read_run(rd)
    steps = []
    for r in rows:
        path = rd / "samples" / f"step_{r['step']:06d}.jsonl"
        samples = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
        steps.append(
            {
                "step": r["step"],
                **choice_stats(samples),
                "acc_train": r.get("acc/train"),
                "entropy_batch": r.get("entropy/batch"),
                "entropy_tool": r.get("entropy/tool_responses"),
                "tool_use_frac": r.get("rollout/tool_use_frac"),
                "gate_on": r.get("stare/gate_on"),
                "mean_weight": r.get("stare/mean_weight"),
            }
        )
    return {
        "steps": steps,
        "acc_before_rl": summary.get("acc_before_rl"),
        "acc_after_rl": summary.get("acc_after_rl"),
        "rl_seconds": (summary.get("seconds") or {}).get("rl"),
        "evals": evals,
    }


def tail_mean(steps: list[dict], key: str, tail: int) -> float | None:
    return mean(s[key] for s in steps[-tail:])


def linear_drift(ys: list[float | None]) -> tuple[float | None, float | None]:
    """Least-squares slope of ys over their step index times (len - 1): the drift over the run a
    straight line gives, and its standard error (None with fewer than 3 points)."""
    pts = [(i, y) for i, y in enumerate(ys) if y is not None]
    if len(pts) < 3:
        return None, None
    n = len(pts)
    mx, my = sum(i for i, _ in pts) / n, sum(y for _, y in pts) / n
    sxx = sum((i - mx) ** 2 for i, _ in pts)
    slope = sum((i - mx) * (y - my) for i, y in pts) / sxx
    resid = sum((y - my - slope * (i - mx)) ** 2 for i, y in pts) / (n - 2)
    span = len(ys) - 1
    return slope * span, (resid / sxx) ** 0.5 * span


def per_seed_summary(curves: dict, tail: int) -> dict:
    s = curves["steps"]
    pooled = {st: sum(x[f"n_{st}"] for x in s) for st in STYLES}
    correct = {st: sum(x[f"correct_{st}"] for x in s) for st in STYLES}
    drift, drift_se = linear_drift([x["assign_share"] for x in s])
    return {
        "steps": len(s),
        # the assign share's straight-line drift over the run (0 for a held mix) and its s.e.
        "assign_drift": drift,
        "assign_drift_se": drift_se,
        "mean_weight": mean(x["mean_weight"] for x in s),
        "minority_first": s[0]["minority_share"] if s else None,
        "minority_last": s[-1]["minority_share"] if s else None,
        "minority_tail": tail_mean(s, "minority_share", tail),
        "assign_first": s[0]["assign_share"] if s else None,
        "assign_tail": tail_mean(s, "assign_share", tail),
        "choice_entropy_first": s[0]["choice_entropy"] if s else None,
        "choice_entropy_last": s[-1]["choice_entropy"] if s else None,
        "choice_entropy_tail": tail_mean(s, "choice_entropy", tail),
        "acc_train_first": s[0]["acc_train"] if s else None,
        "acc_train_tail": tail_mean(s, "acc_train", tail),
        "entropy_first": s[0]["entropy_batch"] if s else None,
        "entropy_tail": tail_mean(s, "entropy_batch", tail),
        "gate_frac": mean(x["gate_on"] for x in s),
        "other_share": sum(x["n_other"] for x in s) / max(1, sum(x["n_tool"] for x in s)),
        # Over all steps: the accuracy of each style (equal if the choice is reward-neutral).
        "acc_print_all": correct["print"] / pooled["print"] if pooled["print"] else None,
        "acc_assign_all": correct["assign"] / pooled["assign"] if pooled["assign"] else None,
        "acc_before_rl": curves["acc_before_rl"],
        "acc_after_rl": curves["acc_after_rl"],
        "rl_seconds": curves["rl_seconds"],
    }


PER_STEP = ("minority_share", "assign_share", "choice_entropy", "acc_train", "entropy_batch", "gate_on")


def mean_curve(per_seed: list[dict]) -> list[dict]:
    """Per step the mean over the seeds that reached it."""
    n = max(len(c["steps"]) for c in per_seed)
    out = []
    for i in range(n):
        at = [c["steps"][i] for c in per_seed if len(c["steps"]) > i]
        out.append({"step": at[0]["step"], **{k: mean(s[k] for s in at) for k in PER_STEP}})
    return out


# Everything in neutral_choice.md from this line on is written by hand and kept when the table is
# regenerated.
NOTES_MARKER = "<!-- hand-written below -->"
COLLAPSED = 0.10  # minority share at or below this over the last steps: the choice is gone


def verdict(results: dict, tail: int) -> list[str]:
    """Plain-language answers, from stated rules (COLLAPSED, paired differences by seed)."""
    lines = []
    g, s = results.get("grpo_ds"), results.get("stare_o1")
    if g is None or s is None:
        return ["Both arms are needed for a verdict."]

    def describe(res: dict) -> tuple[int, str]:
        tails = [m["minority_tail"] for m in res["summary"]]
        gone = sum(t is not None and t <= COLLAPSED for t in tails)
        return gone, ", ".join(fmt(t, "{:.2f}") for t in tails)

    g_gone, g_tails = describe(g)
    s_gone, s_tails = describe(s)
    n = len(g["summary"])
    lines.append(
        f"- **Did GRPO-ds collapse the choice?** {'Yes' if g_gone == n else 'No' if g_gone == 0 else 'In some seeds'}: "
        f"minority share over the last {tail} steps {g_tails} per seed ({g_gone} of {n} at or below {COLLAPSED})."
    )
    paired = [
        (b["choice_entropy_tail"] - a["choice_entropy_tail"])
        for a, b in zip(g["summary"], s["summary"])
        if a["choice_entropy_tail"] is not None and b["choice_entropy_tail"] is not None
    ]
    higher = sum(d > 0 for d in paired)
    lines.append(
        f"- **Did STARE-O1 hold it?** minority share over the last {tail} steps {s_tails} per seed "
        f"({s_gone} of {len(s['summary'])} at or below {COLLAPSED}); its choice entropy minus GRPO-ds's, "
        f"paired by seed: {', '.join(f'{d:+.3f}' for d in paired)} nats (higher in {higher} of {len(paired)})."
    )
    drifts = {
        name: ", ".join(fmt(m["assign_drift"], "{:+.3f}", m["assign_drift_se"]) for m in res["summary"])
        for name, res in (("grpo_ds", g), ("stare_o1", s))
    }
    lines.append(
        f"- **How far did the mix move?** assign share's straight-line drift over the run, per seed: "
        f"GRPO-ds {drifts['grpo_ds']}; STARE-O1 {drifts['stare_o1']}."
    )
    if g_gone == 0:
        lines.append(
            "- GRPO-ds kept the choice, so this arm cannot show STARE holding a choice against a "
            "collapse: the question it answers is whether STARE moves a choice GRPO-ds leaves alone."
        )
    return lines


def _round(v: object) -> object:
    return round(v, 4) if isinstance(v, float) else v


def write_doc(results: dict, docs: Path, meta: dict, tail: int) -> None:
    lines = [
        "# A reward-neutral choice on the toy: GRPO-ds vs STARE-O1\n",
        "Generated by `scripts/study/study_neutral_choice.py` (its docstring explains the design); "
        "numbers in [`neutral_choice.json`](neutral_choice.json).\n",
        "## Setup\n",
        "- SFT: one shared checkpoint, configs/tiny_cpu.yaml with "
        f"`{' '.join(meta['sft_set'])}`: every trace calls the tool and writes `print(EXPR)` or "
        "`x = EXPR` + `print(x)`, drawn uniformly from that list. Same interpreter output, same grade.",
        f"- RL: `{' '.join(meta['common'])}`; arms `algo.name=grpo_ds` and `algo.name=stare "
        "algo.stare.variant=O1` (H*=0.3, P=0.1, W=1.1, the tiny_cpu defaults), lr "
        f"{meta['lr']} after tiny_cpu's 5-step warm-up; seeds {meta['seeds']} (trainer.seed), data.seed=0.",
        "- Measured from every trajectory each step sampled (all rounds of dynamic sampling): the "
        "first code block of each response that called the tool is classified; minority share = "
        "share of the rarer style (0.5 even, 0 collapsed); choice entropy = binary entropy of the "
        "two styles' shares (ln 2 = 0.693 even). acc = acc/train, H = entropy/batch, gate = "
        "stare/gate_on.\n",
        "Commands:\n",
        "```",
        f"OMP_NUM_THREADS=1 python scripts/study/study_neutral_choice.py {meta['argv']}".rstrip(),
        "```\n",
        f"Wall time: {meta.get('wall_note') or 'see the RL wall s column below'}\n",
        "## Per step, mean over seeds\n",
        "| step | GRPO-ds minority | choice H | acc | H batch | STARE-O1 minority | choice H | acc | H batch | gate |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    g = results.get("grpo_ds", {}).get("mean", [])
    s = results.get("stare_o1", {}).get("mean", [])
    for i in range(max(len(g), len(s))):
        a = g[i] if i < len(g) else {}
        b = s[i] if i < len(s) else {}
        step = (a or b)["step"]
        lines.append(
            f"| {step} | {fmt(a.get('minority_share'))} | {fmt(a.get('choice_entropy'))} | {fmt(a.get('acc_train'))} "
            f"| {fmt(a.get('entropy_batch'))} | {fmt(b.get('minority_share'))} | {fmt(b.get('choice_entropy'))} "
            f"| {fmt(b.get('acc_train'))} | {fmt(b.get('entropy_batch'))} | {fmt(b.get('gate_on'), '{:.2f}')} |"
        )
    lines += [
        "\n## Per seed\n",
        f"First = RL step 1 (the SFT policy's own mix); tail = mean over the last {tail} steps. "
        "Assign drift = slope of a straight line through the per-step assign share, times the "
        "steps it spans (± its standard error): how far the mix moved over the run. STARE weight = "
        "stare/mean_weight, mean over steps. "
        "acc by style = accuracy of the tool responses in each style over all steps (a reward-"
        "neutral choice has them equal). Other = tool responses in neither style.\n",
        "| arm | seed | minority first -> tail | choice H first -> tail | assign share first -> tail "
        "| assign drift (line fit) | acc/train first -> tail | H batch first -> tail | gate on | STARE weight "
        "| acc print / assign | other | held-out before -> after | RL wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, res in results.items():
        for seed, m in zip(res["seeds"], res["summary"]):
            lines.append(
                f"| {ARMS[name]['label']} | {seed} | {fmt(m['minority_first'])} -> {fmt(m['minority_tail'])} "
                f"| {fmt(m['choice_entropy_first'])} -> {fmt(m['choice_entropy_tail'])} "
                f"| {fmt(m['assign_first'])} -> {fmt(m['assign_tail'])} "
                f"| {fmt(m['assign_drift'], '{:+.3f}', m['assign_drift_se'])} "
                f"| {fmt(m['acc_train_first'])} -> {fmt(m['acc_train_tail'])} "
                f"| {fmt(m['entropy_first'])} -> {fmt(m['entropy_tail'])} | {fmt(m['gate_frac'], '{:.2f}')} "
                f"| {fmt(m['mean_weight'], '{:.4f}')} "
                f"| {fmt(m['acc_print_all'])} / {fmt(m['acc_assign_all'])} | {fmt(m['other_share'])} "
                f"| {fmt(m['acc_before_rl'])} -> {fmt(m['acc_after_rl'])} | {fmt(m['rl_seconds'], '{:.0f}')} |"
            )
    lines += ["\n## Verdict\n", *verdict(results, tail)]
    if (docs / "neutral_choice.png").is_file():
        lines.append("\n![choice entropy, accuracy and batch entropy per step](neutral_choice.png)")
    old = docs / "neutral_choice.md"
    text = old.read_text() if old.is_file() else ""
    if NOTES_MARKER in text:  # the hand-written reading of the numbers survives a regeneration
        lines += ["", text[text.index(NOTES_MARKER) :].rstrip()]
    payload = {
        "meta": meta,
        "arms": {n: {"seeds": r["seeds"], "summary": r["summary"], "mean": r["mean"]} for n, r in results.items()},
    }
    keep = ("step", "n_tool", "n_print", "n_assign", "n_other", "assign_share", "choice_entropy", "acc_train", "entropy_batch", "gate_on")  # fmt: skip
    payload["per_step"] = {
        n: [[{k: _round(x[k]) for k in keep} for x in c["steps"]] for c in r["curves"]] for n, r in results.items()
    }
    write_report(docs, "neutral_choice", lines, payload)


def plot(results: dict, docs: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    panels = [
        ("assign_share", "share of assign style", (0, 1)),
        ("choice_entropy", "choice entropy (nats)", (0, 0.75)),
        ("acc_train", "acc/train", None),
        ("entropy_batch", "entropy/batch", None),
    ]
    for name, color in (("grpo_ds", "tab:blue"), ("stare_o1", "tab:red")):
        if name not in results:
            continue
        for ax, (key, title, ylim) in zip(axes, panels):
            for c in results[name]["curves"]:
                ax.plot([s["step"] for s in c["steps"]], [s[key] for s in c["steps"]], color=color, alpha=0.25, lw=0.8)
            m = results[name]["mean"]
            ax.plot([s["step"] for s in m], [s[key] for s in m], color=color, lw=2, label=ARMS[name]["label"])
            ax.set_title(title)
            ax.set_xlabel("RL step")
            if ylim:
                ax.set_ylim(*ylim)
    axes[0].axhline(0.5, color="grey", ls=":", lw=1)
    axes[1].axhline(math.log(2), color="grey", ls=":", lw=1)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(docs / "neutral_choice.png", dpi=72)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = study_parser(__doc__, seeds=[0, 1, 2], steps=30, lr=1e-4, out="runs/neutral_choice", jobs=2, threads=1)
    p.add_argument("--prompts", type=int, default=16, help="trainer.prompts_per_step (default: 16, x 8 samples)")
    p.add_argument("--num-traces", type=int, default=8000, help="SFT traces, all with a tool call (default: 8000)")
    p.add_argument(
        "--styles",
        nargs="+",
        default=["print", "assign"],
        help="sft.code_styles of the shared SFT (each tool trace draws one; repeat a name to weigh it, "
        "e.g. print print print print assign for an 80/20 start; default: print assign)",
    )
    p.add_argument("--tail", type=int, default=5, help="last steps averaged for the per-seed tail numbers (default: 5)")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="extra overrides for every run")
    args = p.parse_args(argv)

    out, docs = Path(args.out), Path(args.docs)
    sft_set = [
        f"sft.num_traces={args.num_traces}",
        "sft.tool_fraction=1.0",
        f"sft.code_styles=[{','.join(args.styles)}]",
    ]
    common = [
        f"trainer.steps={args.steps}",
        f"trainer.prompts_per_step={args.prompts}",
        f"learner.lr={args.lr}",
        "trainer.eval_every=0",  # held-out accuracy before and after RL only: the choice is the question
        "trainer.samples_every=1",
        "trainer.samples_per_step=100000",  # every trajectory of every step
    ]
    rl_wall_s = None
    if not args.report_only:
        sft = ensure_sft(out, [*sft_set, *args.set], threads=args.threads)
        # ensure_sft keeps whatever <out>/sft_base holds: refuse one made with other styles
        made = json.loads((Path(sft) / "sft_key.json").read_text())["inputs"]["traces"].get("code_styles")
        if made != args.styles:
            raise SystemExit(f"{sft} was made with code_styles={made}, not {args.styles}: pass another --out")
        t0 = time.time()
        run_arms(
            ARMS,
            args.seeds,
            out,
            lambda arm, seed: [*common, *args.set, *ARMS[arm]["overrides"]],
            sft,
            jobs=args.jobs,
            threads=args.threads,
        )
        rl_wall_s = time.time() - t0
    elif (docs / "neutral_choice.json").is_file():  # keep the time of the launch that made the runs
        rl_wall_s = json.loads((docs / "neutral_choice.json").read_text())["meta"].get("rl_wall_s")
    base = out / "sft_base" / "summary.json"
    sft_s = (json.loads(base.read_text()).get("seconds") or {}).get("sft") if base.is_file() else None
    wall_note = (
        f"{fmt(rl_wall_s, '{:.0f}')} s for the {len(ARMS) * len(args.seeds)} RL runs ({args.jobs} at a time, "
        f"{args.threads} thread each), after {fmt(sft_s, '{:.0f}')} s for the shared SFT (traces made in the "
        "sandbox and trained on), on 2 cores shared with another job"
    )

    results = {}
    for name in ARMS:
        curves, seeds = [], []
        for seed in args.seeds:
            rd = run_dir(out, name, seed)
            if (rd / "summary.json").is_file():
                curves.append(run_curves(rd))
                seeds.append(seed)
        if curves:
            results[name] = {
                "seeds": seeds,
                "curves": curves,
                "summary": [per_seed_summary(c, args.tail) for c in curves],
                "mean": mean_curve(curves),
            }
    argv_note = " ".join(
        f"--{k} {v}" if not isinstance(v, list) else f"--{k} {' '.join(map(str, v))}"
        for k, v in (("seeds", args.seeds), ("steps", args.steps), ("prompts", args.prompts), ("styles", args.styles))
        if v != p.get_default(k)
    )
    meta = {
        "seeds": args.seeds,
        "steps": args.steps,
        "prompts": args.prompts,
        "lr": args.lr,
        "num_traces": args.num_traces,
        "sft_set": sft_set,
        "common": common,
        "set": args.set,
        "tail": args.tail,
        "argv": argv_note,
        "rl_wall_s": rl_wall_s,
        "sft_s": sft_s,
        "wall_note": wall_note,
    }
    docs.mkdir(parents=True, exist_ok=True)
    if results:
        plot(results, docs)
    write_doc(results, docs, meta, args.tail)
    print(f"[study] wrote {docs / 'neutral_choice.md'} ({len(results)} arms)", flush=True)


if __name__ == "__main__":
    main()
