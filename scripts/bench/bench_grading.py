"""Compare envs.grading (the builtin grader) with Hugging Face math-verify on labelled cases.

Both graders see exactly the same (response, gold) pairs: the project's labelled cases
(tests/envs/grading_cases.py, grading_cases_kinds.py, grading_cases_prose_forms.py), then, reported
apart, the held-out cases (grading_cases_heldout.py: written before the grader changes they
score; their first, blind score is recorded in that file), then the phrasings set
(grading_cases_phrasings.py: right answers phrased the ways a strict reader misses, such as
chat-template tails, the Minerva answer line, glued units, several boxes, damaged boxes, and unit
traps), with its own agreement, false positives and speed ratio. For math-verify the gold is
wrapped in $...$ as its documentation does and the whole response goes to its `parse` (its own
extraction). Agreement = verdict equals the label;
a false positive = "equal" on a pair labelled not equal. The per-kind table shows both graders
on every kind; `kinds_below_math_verify` counts kinds where ours agrees less often, and
`closeness_false_pos` counts our false positives on the kinds where a lenient grader accepts a
merely close value (closeness, decimal_rule).

Speed, measured in this run after one warm-up call each (imports, sympy, our worker start), best
of --repeat passes, our result cache off, the two graders' passes alternating (a load change on
a shared machine hits both alike):
- over all labelled cases, and over the phrasings set (many need algebra: our worker process
  answers those);
- over an integer-heavy mix shaped like DAPO rewards (integer golds; responses with reasoning
  text ending in \\boxed{n} or "Answer: n", right or wrong, some formatted "1,000" / "12.0" /
  "x = 5", a few without an answer), which is what RL grades at every step.
Hang check: adversarial answers (power towers, huge factorials, deep nesting, long sums) go
through our grader, in every mode; each call must return within its time bound plus start-up.

    python scripts/bench/bench_grading.py [--repeat 3] [--show-disagreements]

math-verify's own test suite, graded by ours: scripts/bench/bench_grading_mv_suite.py.

The last line is `RESULT agree_ours=N/M agree_math_verify=N/M false_pos_ours=K
false_pos_math_verify=K kinds_below_math_verify=K closeness_false_pos=K heldout_agree_ours=N/M
heldout_agree_math_verify=N/M heldout_false_pos_ours=K heldout_false_pos_math_verify=K
phrasings_agree_ours=N/M phrasings_agree_math_verify=N/M phrasings_false_pos_ours=K
phrasings_false_pos_math_verify=K phrasings_speed_ratio=X speed_ratio=X int_mix_speed_ratio=Y
hang_max_s=Z`.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LABELLED = ("grading_cases", "grading_cases_kinds", "grading_cases_prose_forms")
HELD_OUT = ("grading_cases_heldout",)
PHRASINGS = ("grading_cases_phrasings",)
CLOSENESS_KINDS = ("closeness", "decimal_rule")


def load_cases(names: tuple[str, ...] = LABELLED) -> list[tuple[str, str, bool, str]]:
    cases = []
    for name in names:
        spec = importlib.util.spec_from_file_location(name, ROOT / f"tests/envs/{name}.py")
        mod = importlib.util.module_from_spec(spec)
        assert spec.loader is not None
        spec.loader.exec_module(mod)
        cases += mod.CASES
    return cases


def dapo_mix(n: int = 400, seed: int = 0) -> list[tuple[str, str]]:
    """(gold, response) pairs like an RL step's: integer golds, mostly integer answers."""
    rng = random.Random(seed)
    filler = (
        "Let me set up the equation. We compute the sum step by step and check the "
        "boundary cases with the interpreter. "
    )
    out = []
    for _ in range(n):
        gold = rng.randint(0, 99999)
        pred = gold if rng.random() < 0.4 else gold + rng.randint(1, 50)
        style = rng.random()
        if style < 0.55:
            ans = f"\\boxed{{{pred}}}"
        elif style < 0.7:
            ans = f"Answer: {pred}"
        elif style < 0.78:
            ans = f"\\boxed{{{pred:,}}}"
        elif style < 0.85:
            ans = f"\\boxed{{{pred}.0}}"
        elif style < 0.92:
            ans = f"so $\\boxed{{x = {pred}}}$"
        elif style < 0.96:
            ans = f"\\boxed{{\\frac{{{2 * pred}}}{{2}}}}"
        else:
            ans = "I could not finish the computation."
        out.append((str(gold), filler * rng.randint(2, 12) + ans))
    return out


ADVERSARIAL = [
    r"\boxed{2^{2^{2^{2^{2^{2^{2}}}}}}}",
    r"\boxed{10^{10^{10^{10}}}}",
    r"\boxed{9^{9^{9^{9}}}}",
    r"\boxed{100000000!}",
    r"\boxed{(10^{100})!}",
    "\\boxed{" + "(" * 300 + "1" + ")" * 300 + "}",
    "\\boxed{" + "\\frac{1}{" * 60 + "2" + "}" * 60 + "}",
    "\\boxed{" + "\\sqrt{" * 80 + "2" + "}" * 80 + "}",
    "\\boxed{" + "x^{" * 40 + "2" + "}" * 40 + "}",
    r"\boxed{" + "+".join(f"x^{{{i}}}" for i in range(300)) + "}",
    # Backtracking patterns of the in-process stage (outside the worker's bound): a run of letters
    # before "=", an answer anchor or Minerva's closing before a long run of spaces.
    "\\boxed{" + "a" * 40 + "1 = 19}",
    "\\boxed{the total number of points is 1 + 18 = 19}",
    "The answer is " + " " * 5000,
    "The answer is 5" + " " * 5000 + "I hope",
]


def interleaved(graders: dict, pairs, repeat: int) -> tuple[dict[str, list[bool]], dict[str, float]]:
    """Verdicts and seconds of several graders on the same pairs, in alternating passes (ours over
    all pairs, then math-verify over all pairs, `repeat` times), so that a load change on a shared
    machine hits both alike while each grader runs its cases back to back, as RL grades a batch;
    per grader the best pass is kept."""
    best = {name: float("inf") for name in graders}
    out: dict[str, list[bool]] = {}
    for _ in range(max(1, repeat)):
        for name, fn in graders.items():
            t0 = time.perf_counter()
            out[name] = [fn(resp, gold) for gold, resp in pairs]
            best[name] = min(best[name], time.perf_counter() - t0)
    return out, best


def per_kind_table(cases, verdicts: dict[str, list[bool]]) -> tuple[list[str], int]:
    """Rows of the per-kind table, and how many kinds ours agrees on less often than math-verify."""
    by_kind: dict[str, list[int]] = {}
    for i, (_, _, label, kind) in enumerate(cases):
        row = by_kind.setdefault(kind, [0, 0, 0, 0, 0])
        row[0] += 1
        row[1] += verdicts["ours"][i] == label
        row[2] += verdicts["math_verify"][i] == label
        row[3] += verdicts["ours"][i] and not label
        row[4] += verdicts["math_verify"][i] and not label
    lines = [f"{'kind':<14} {'N':>4} {'ours':>5} {'math_verify':>11} {'fp_ours':>8} {'fp_mv':>6}"]
    below = 0
    for kind, (cnt, a, b, fa, fb) in sorted(by_kind.items()):
        below += a < b
        lines.append(
            f"{kind:<14} {cnt:>4} {a:>5} {b:>11} {fa:>8} {fb:>6}" + ("  <- below math-verify" if a < b else "")
        )
    return lines, below


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="timing passes (best is kept)")
    ap.add_argument("--show-disagreements", action="store_true")
    args = ap.parse_args()

    sys.path.insert(0, str(ROOT))
    from math_verify import parse, verify

    from envs.grading import GRADERS, Grader

    logging.getLogger("math_verify").setLevel(logging.CRITICAL)  # it logs every parse failure
    cases = load_cases()
    n = len(cases)
    ours = Grader(cache_size=0)

    def mv(response: str, gold: str) -> bool:
        g = gold if "$" in gold or "\\boxed" in gold else f"${gold}$"
        try:
            return bool(verify(parse(g), parse(response)))
        except Exception:
            return False

    graders = {"ours": lambda r, g: ours.grade(r, g), "math_verify": mv}
    for fn in graders.values():  # warm-up: imports, sympy, our worker process
        fn(r"\boxed{\sqrt{2}}", "2^{1/2}")

    pairs = [(c[0], c[1]) for c in cases]
    verdicts, secs = interleaved(graders, pairs, args.repeat)
    agree = {k: sum(v == c[2] for v, c in zip(vs, cases)) for k, vs in verdicts.items()}
    false_pos = {k: sum(v and not c[2] for v, c in zip(vs, cases)) for k, vs in verdicts.items()}
    closeness_fp = sum(v and not c[2] and c[3] in CLOSENESS_KINDS for v, c in zip(verdicts["ours"], cases))

    lines, below = per_kind_table(cases, verdicts)
    print("\n".join(lines))
    negatives = sum(1 for c in cases if not c[2])
    print(
        f"labelled cases={n} (not equal: {negatives})  calls/s: ours={n / secs['ours']:.0f} "
        f"math_verify={n / secs['math_verify']:.0f}  worker calls={ours.stats['symbolic_calls']}"
    )

    held = load_cases(HELD_OUT)
    held_verdicts = {name: [fn(resp, gold) for gold, resp, _, _ in held] for name, fn in graders.items()}
    held_agree = {k: sum(v == c[2] for v, c in zip(vs, held)) for k, vs in held_verdicts.items()}
    held_fp = {k: sum(v and not c[2] for v, c in zip(vs, held)) for k, vs in held_verdicts.items()}
    held_lines, held_below = per_kind_table(held, held_verdicts)
    print(f"\nheld-out cases={len(held)} (written before the grader changes; first blind score in their file):")
    print("\n".join(held_lines))
    print(f"held-out kinds below math-verify: {held_below}")

    phrasings = load_cases(PHRASINGS)
    phr_pairs = [(c[0], c[1]) for c in phrasings]
    phr_verdicts, phr_secs = interleaved(graders, phr_pairs, args.repeat)
    phr_agree = {k: sum(v == c[2] for v, c in zip(vs, phrasings)) for k, vs in phr_verdicts.items()}
    phr_fp = {k: sum(v and not c[2] for v, c in zip(vs, phrasings)) for k, vs in phr_verdicts.items()}
    phr_lines, phr_below = per_kind_table(phrasings, phr_verdicts)
    phr_ratio = phr_secs["math_verify"] / phr_secs["ours"]
    print(f"\nphrasings cases={len(phrasings)} (not equal: {sum(1 for c in phrasings if not c[2])}):")
    print("\n".join(phr_lines))
    print(
        f"phrasings kinds below math-verify: {phr_below}  calls/s: ours={len(phrasings) / phr_secs['ours']:.0f} "
        f"math_verify={len(phrasings) / phr_secs['math_verify']:.0f}  ratio={phr_ratio:.1f}x"
    )

    if args.show_disagreements:
        groups = (("", cases, verdicts), ("held-out ", held, held_verdicts), ("phrasings ", phrasings, phr_verdicts))
        for group, group_cases, group_verdicts in groups:
            for i, (gold, resp, label, cat) in enumerate(group_cases):
                o, m = group_verdicts["ours"][i], group_verdicts["math_verify"][i]
                if o != label or m != label:
                    print(f"{group}[{cat}] label={label} ours={o} math_verify={m} gold={gold!r} resp={resp[-90:]!r}")

    mix = dapo_mix()
    mix_verdicts, mix_secs = interleaved(graders, mix, args.repeat)
    mix_ours, mix_mv = mix_verdicts["ours"], mix_verdicts["math_verify"]
    t_ours, t_mv = mix_secs["ours"], mix_secs["math_verify"]
    same = sum(a == b for a, b in zip(mix_ours, mix_mv))
    print(
        f"integer mix: {len(mix)} responses  calls/s: ours={len(mix) / t_ours:.0f} "
        f"math_verify={len(mix) / t_mv:.0f}  ratio={t_mv / t_ours:.1f}x  same verdict={same}/{len(mix)}"
    )

    hang_max = 0.0
    for mode in GRADERS.names():
        g = Grader(mode, timeout_s=2.0, cache_size=0)
        g.grade(r"\boxed{\sqrt{8}}", r"2\sqrt{2}")  # start-up paid here, not in the bound
        for text in ADVERSARIAL:
            t0 = time.perf_counter()
            g.grade(text, "5")
            hang_max = max(hang_max, time.perf_counter() - t0)
        print(
            f"hang check [{mode}]: {len(ADVERSARIAL)} adversarial answers, timeouts={g.stats['timeouts']}, "
            f"max so far {hang_max:.2f} s (bound 2 s + worker restart)"
        )
        g.close()
    ours.close()
    print(
        f"RESULT agree_ours={agree['ours']}/{n} agree_math_verify={agree['math_verify']}/{n} "
        f"false_pos_ours={false_pos['ours']} false_pos_math_verify={false_pos['math_verify']} "
        f"kinds_below_math_verify={below} closeness_false_pos={closeness_fp} "
        f"heldout_agree_ours={held_agree['ours']}/{len(held)} "
        f"heldout_agree_math_verify={held_agree['math_verify']}/{len(held)} "
        f"heldout_false_pos_ours={held_fp['ours']} heldout_false_pos_math_verify={held_fp['math_verify']} "
        f"phrasings_agree_ours={phr_agree['ours']}/{len(phrasings)} "
        f"phrasings_agree_math_verify={phr_agree['math_verify']}/{len(phrasings)} "
        f"phrasings_false_pos_ours={phr_fp['ours']} phrasings_false_pos_math_verify={phr_fp['math_verify']} "
        f"phrasings_speed_ratio={phr_ratio:.1f} "
        f"speed_ratio={secs['math_verify'] / secs['ours']:.2f} int_mix_speed_ratio={t_mv / t_ours:.1f} "
        f"hang_max_s={hang_max:.2f}"
    )


if __name__ == "__main__":
    main()
