"""Compare envs.grading.grade_answer with Hugging Face math-verify on the same labeled cases.

Both graders see exactly the same (response, gold) pairs from tests/envs/grading_cases.py; for
math-verify the gold is wrapped in $...$ as its documentation does. Agreement = verdict equals the
label. Speed = calls per second over the whole case list, measured in this run, one grader after
the other, after one warm-up call each (imports, sympy, our worker start). Our result cache is
off, so every call does the full work; math-verify keeps its internal parse caches.

    python scripts/bench_grading.py [--repeat 3] [--show-disagreements]

The last line is `RESULT agree_ours=<n>/<N> agree_math_verify=<m>/<N> speed_ratio=<ours/theirs>`.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_cases() -> list[tuple[str, str, bool, str]]:
    spec = importlib.util.spec_from_file_location("grading_cases", ROOT / "tests/envs/grading_cases.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod.CASES


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="timing passes over all cases (best is kept)")
    ap.add_argument("--show-disagreements", action="store_true")
    args = ap.parse_args()

    import sys
    sys.path.insert(0, str(ROOT))
    from envs.grading import Grader
    from math_verify import parse, verify

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

    verdicts: dict[str, list[bool]] = {}
    rate: dict[str, float] = {}
    for name, fn in graders.items():
        best = float("inf")
        for _ in range(max(1, args.repeat)):
            t0 = time.perf_counter()
            out = [fn(resp, gold) for gold, resp, _, _ in cases]
            best = min(best, time.perf_counter() - t0)
        verdicts[name] = out
        rate[name] = n / best

    agree = {k: sum(v == c[2] for v, c in zip(vs, cases)) for k, vs in verdicts.items()}
    by_cat: dict[str, list[int]] = {}
    for i, (_, _, label, cat) in enumerate(cases):
        row = by_cat.setdefault(cat, [0, 0, 0])
        row[0] += 1
        row[1] += verdicts["ours"][i] == label
        row[2] += verdicts["math_verify"][i] == label
    print(f"{'category':<12} {'N':>4} {'ours':>5} {'math_verify':>11}")
    for cat, (cnt, a, b) in sorted(by_cat.items()):
        print(f"{cat:<12} {cnt:>4} {a:>5} {b:>11}")
    negatives = sum(1 for c in cases if not c[2])
    print(f"cases={n} (true negatives: {negatives})  calls/s: ours={rate['ours']:.0f} "
          f"math_verify={rate['math_verify']:.0f}  symbolic worker calls={ours.stats['symbolic_calls']}")
    if args.show_disagreements:
        for i, (gold, resp, label, cat) in enumerate(cases):
            o, m = verdicts["ours"][i], verdicts["math_verify"][i]
            if o != label or m != label:
                print(f"[{cat}] label={label} ours={o} math_verify={m} gold={gold!r} resp={resp[-90:]!r}")
    ours.close()
    print(f"RESULT agree_ours={agree['ours']}/{n} agree_math_verify={agree['math_verify']}/{n} "
          f"speed_ratio={rate['ours'] / rate['math_verify']:.2f}")


if __name__ == "__main__":
    main()
