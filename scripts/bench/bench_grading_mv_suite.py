"""math-verify's own test suite as a test of our builtin grader.

Every (prediction, gold, expected) case that the tests of math-verify 0.9.0 assert, taken from its
PyPI sdist (downloaded with pip, pinned by version and sha256, cached), graded by our builtin
grader (`env.grader=builtin`). The cases are read from the test files with `ast`, not imported:
each test that calls their compare helper (`compare_strings(gold, pred, ...)`, or
`verify(parse(gold), parse(pred))`) contributes its parametrized rows, and a helper call written
out in a test body (`assert compare_strings("$\\frac{1}{3}$", "0.3333$", ...) == 1`) is one case.
Their string-extraction test (`parse(pred, [StringExtractionConfig()]) == [...]`) gives a case
per row: the response against the letter it reads (expected equal), or, where it reads none,
against "A" (expected not equal).

Reported apart, not as failures of ours:
- deliberate refusals (`DELIBERATE`): math-verify compares floats after rounding to the
  `precision` a test asks for, so "0.3333" is 1/3 at precision 4; our decimal rule keeps a close
  decimal for an exact value refused (envs.grading.numbers), on purpose; likewise f(y) for f(x)
  (their non-strict mode), a set for a pair, and 1 + 1/e for 1 - 1/e;
- artifacts: a raw string that doubles its backslashes (r"$-2 \\\\le x$" is LaTeX's line break, then
  "le"), which math-verify's parser forgives and ours reads as written.
A false positive is our "equal" on a case expected not equal.

    python scripts/bench/bench_grading_mv_suite.py [--cache DIR] [--show]

The last line is `RESULT agree=N total=283 false_positives=K misses=M deliberate=D artifacts=A`,
where a miss is a case expected equal that we refuse and that is neither deliberate nor an artifact.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import math
import os
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VERSION = "0.9.0"
SHA256 = "45ac6c61344ba056b9e99a660a4bc8d044ed408f730aed68c60435aa5eec4645"
SDIST = f"math_verify-{VERSION}.tar.gz"
TOTAL = 283  # the cases its tests assert (huggingface/Math-Verify at 5d148cf, plus 7)
HELPERS = ("compare_strings", "verify", "parse")

# (pred, gold): the decimal rule refuses a close decimal for an exact value, whatever precision a
# test asks math-verify to round to.
DELIBERATE = {
    ("0.3333$", "$\\frac{1}{3}$"): "0.3333 is not 1/3 (math-verify: precision=4)",
    ("$(0.6,2.6667]$", "$(\\frac{3}{5},\\frac{8}{3}]$"): "2.6667 is not 8/3 (math-verify: precision=2)",
    (
        "$\\begin{pmatrix}0.33\\\\0.2 \\end{pmatrix}$",
        "$(\\begin{pmatrix}\\frac{1}{3}\\\\ \\frac{1}{5} \\end{pmatrix})$",
    ): "0.33 is not 1/3 (math-verify: precision=2)",
    # Different answers that a test of theirs calls equal on purpose, for an option we do not have
    # or a reading of theirs:
    ("$f(y)$", "$f(x)$"): "f(y) is not f(x) (math-verify: strict=False ignores variable names)",
    ("${1,3}$", "$(1,3)$"): "the set {1, 3} is not the pair (1, 3)",
    (
        "$1 + \\frac{1}{\\mathrm{e}}$",
        "$1 - \\frac{1}{\\mathrm{e}}$",
    ): "1 + 1/e is not 1 - 1/e (their test pins their parse of \\mathrm{e} as a name)",
}


@dataclass(frozen=True)
class Case:
    pred: str
    gold: str
    expected: bool
    where: str  # test file::function
    artifact: bool  # a raw string with doubled backslashes before a command


def default_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "stare-tir" / "math-verify-suite"


def fetch_sdist(cache: Path) -> Path:
    """The pinned sdist in `cache` (downloaded with pip when absent); raises when its hash differs."""
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / SDIST
    if not path.exists():
        cmd = [sys.executable, "-m", "pip", "download", f"math-verify=={VERSION}", "--no-binary", ":all:"]
        subprocess.run([*cmd, "--no-deps", "--quiet", "-d", str(cache)], check=True, timeout=300)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != SHA256:
        path.unlink()
        raise RuntimeError(f"{SDIST}: sha256 {digest}, expected {SHA256} (removed; run again)")
    return path


def test_sources(sdist: Path) -> dict[str, str]:
    """file name -> source of every tests/test_*.py in the sdist."""
    out = {}
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if len(parts) == 3 and parts[1] == "tests" and parts[2].startswith("test_") and member.isfile():
                f = tar.extractfile(member)
                assert f is not None
                out[parts[2]] = f.read().decode()
    return out


def _value(node: ast.AST):
    """A literal; an f-string of `math` (their `f"{math.sqrt(17):.15f}"`) is evaluated with math only."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        code = compile(ast.Expression(node), "<case>", "eval")
        return eval(code, {"math": math, "__builtins__": {}})  # noqa: S307 (a pinned, hashed file)


def _doubled(source: str, node: ast.AST) -> bool:
    """A raw string literal that writes `\\\\` before a letter (meaning one backslash)."""
    text = ast.get_source_segment(source, node) or ""
    return text[:1] in "rR" and any(
        text[i : i + 2] == "\\\\" and text[i + 2 : i + 3].isalpha() for i in range(len(text))
    )


def _calls_helper(fn: ast.FunctionDef) -> bool:
    return any(isinstance(n, ast.Call) and getattr(n.func, "id", None) in HELPERS for n in ast.walk(fn))


def cases_of(name: str, source: str) -> list[Case]:
    """The asserted cases of one test file (module docstring)."""
    tree = ast.parse(source)
    out = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef) or not fn.name.startswith("test_") or not _calls_helper(fn):
            continue
        where = f"{name}::{fn.name}"
        for dec in fn.decorator_list:
            if not (isinstance(dec, ast.Call) and getattr(dec.func, "attr", None) == "parametrize"):
                continue
            names = [s.strip() for s in ast.literal_eval(dec.args[0]).split(",")]
            if names == ["pred", "expected", "config"]:  # their string extraction: the letter it reads
                for row in dec.args[1].elts:
                    pred, extracted = _value(row.elts[0]), _value(row.elts[1])
                    gold = extracted[-1] if extracted else "A"  # (none read: no letter is its answer)
                    out.append(Case(pred, gold, bool(extracted), where, False))
                continue
            if "gold" not in names or "pred" not in names:
                continue
            flag = "expected" if "expected" in names else "result"
            for row in dec.args[1].elts:
                values = dict(zip(names, (_value(e) for e in row.elts)))
                g, p = row.elts[names.index("gold")], row.elts[names.index("pred")]
                doubled = _doubled(source, g) or _doubled(source, p)
                out.append(Case(values["pred"], values["gold"], bool(values[flag]), where, doubled))
        # A helper call written out in the body: `assert compare_strings(gold, pred, ...) == 1`.
        for node in ast.walk(fn):
            if (
                isinstance(node, ast.Compare)
                and isinstance(node.left, ast.Call)
                and getattr(node.left.func, "id", None) == "compare_strings"
                and all(isinstance(a, ast.Constant) for a in node.left.args[:2])
            ):
                gold, pred = (a.value for a in node.left.args[:2])
                out.append(Case(pred, gold, bool(_value(node.comparators[0])), where, False))
    return out


def load_cases(cache: Path | None = None) -> list[Case]:
    sources = test_sources(fetch_sdist(cache or default_cache()))
    return [c for name in sorted(sources) for c in cases_of(name, sources[name])]


@dataclass(frozen=True)
class Report:
    total: int
    agree: int
    false_positives: list[Case]
    misses: list[Case]
    deliberate: list[Case]
    artifacts: list[Case]

    def result_line(self) -> str:
        return (
            f"RESULT agree={self.agree} total={self.total} false_positives={len(self.false_positives)} "
            f"misses={len(self.misses)} deliberate={len(self.deliberate)} artifacts={len(self.artifacts)}"
        )


def grade_suite(cases: list[Case], grade) -> Report:
    """`grade(response, gold) -> bool` over every case, sorted into the report's groups."""
    agree, fps, misses, deliberate, artifacts = 0, [], [], [], []
    for c in cases:
        verdict = bool(grade(c.pred, c.gold))
        if verdict == c.expected:
            agree += 1
        elif verdict:
            fps.append(c)
        elif (c.pred, c.gold) in DELIBERATE:
            deliberate.append(c)
        elif c.artifact:
            artifacts.append(c)
        else:
            misses.append(c)
    return Report(len(cases), agree, fps, misses, deliberate, artifacts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=None, help="where the sdist is kept")
    ap.add_argument("--show", action="store_true", help="print every case we disagree on")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from envs.grading import Grader

    cases = load_cases(args.cache)
    grader = Grader("builtin", cache_size=0)
    t0 = time.perf_counter()
    report = grade_suite(cases, grader.grade)
    secs = time.perf_counter() - t0
    grader.close()
    print(f"math-verify {VERSION} suite: {report.total} cases (expected {TOTAL}), graded in {secs:.1f} s")
    groups = (
        ("false positive", report.false_positives),
        ("miss", report.misses),
        ("artifact", report.artifacts),
    )
    for label, group in groups:
        for c in group if (args.show or label == "false positive") else ():
            print(f"[{label}] {c.where}: pred={c.pred[-100:]!r} gold={c.gold[-100:]!r} expected={c.expected}")
    for c in report.deliberate:
        print(f"[deliberate] {c.where}: {DELIBERATE[(c.pred, c.gold)]}")
    print(report.result_line())


if __name__ == "__main__":
    main()
