"""The math-verify stage of the grader: runs inside the grading worker process only.

Hugging Face math-verify (`math_verify.parse` / `math_verify.verify`) reads far more LaTeX than our
own translator (matrix expressions, `\\begin{array}`, sets written many ways, relations solved for
a variable). It is also lenient where a reward must not be: floats are compared after rounding to
6 decimals or at 15 digits (`grader.sympy_numeric_eq` in its source), so a different 7th digit or a
15-digit truncation of 2/3 passes. So its "equal" is only a candidate here: `guarded_equal`
re-checks the two objects math-verify parsed with our exact comparison (`confirm`), structure by
structure, and accepts only when both agree. What the re-check demands:

- numbers and expressions: exact (`_symbolic.exprs_equal`, sign-aware random points, then
  simplify); a float math-verify parsed counts as the decimal it prints as, judged by the decimal
  rule of `envs.grading.equivalence` (never by a tolerance);
- matrices (after evaluating matrix expressions): same shape, entries exact;
- sets / tuples / intervals / unions: same kind, items exact (sets unordered, tuples in order,
  intervals with the same open/closed ends);
- relations: the same relation kind with proportional sides (an `x = 3` against `3`: the value);
- anything else (strings, mismatched kinds): not confirmed.

math-verify's own timeouts use SIGALRM and are switched off here (`parsing_timeout=None`,
`timeout_seconds=None`): the worker's own alarm and the parent's kill bound every call.
"""

from __future__ import annotations

import logging
import re

import sympy
from sympy.matrices import MatrixBase

from envs.grading._exact import decimal_vs_expr, exprs_equal, proportional
from envs.grading.numbers import numbers_equal, parse_number

logging.getLogger("math_verify").setLevel(logging.CRITICAL)  # it logs every parse failure

from math_verify import parse, verify  # noqa: E402 (imported after its logger is silenced)

_BOXED = "\\boxed{{{}}}"


def _parse_answer(text: str) -> list:
    """math-verify's parse of an already extracted answer (boxed: its highest-priority target)."""
    return parse(_BOXED.format(text), parsing_timeout=None)


def parse_response(text: str) -> list:
    """math-verify's parse of a whole response, with its own extraction (the `math_verify` mode)."""
    return parse(text, parsing_timeout=None)


def gold_parse(gold: str) -> list:
    """The gold as its documentation passes it: inside $...$ unless it already has delimiters."""
    g = gold if "$" in gold or "\\boxed" in gold else f"${gold}$"
    return parse(g, parsing_timeout=None)


def math_verify_response(response: str, gold: str) -> tuple[bool, str | None]:
    """math-verify alone, as a paper would grade: its extraction, its comparison; with the text
    of the answer it extracted (None when it found none)."""
    parsed = parse_response(response)
    pred = str(parsed[-1]) if parsed and isinstance(parsed[-1], str) else (str(parsed[0]) if parsed else None)
    return bool(verify(gold_parse(gold), parsed, timeout_seconds=None)), pred


def math_verify_pair(pred: str, gold: str) -> bool:
    """math-verify's comparison of two extracted answers."""
    return bool(verify(gold_parse(gold), _parse_answer(pred), timeout_seconds=None))


# Answers math-verify would read by dropping part of them, or whose evaluation is unbounded:
# a digit with a subscript (a base, 204_5 -> 204), power towers and huge exponents or factorials.
_SKIP_RE = re.compile(r"\d\s*_|\^\s*\{[^{}]*\^|\^\s*\{?\s*-?\d{4,}|\d{4,}\s*!|\\text\s*\{[^{}]*\d")
_LETTER_RE = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z](?![a-zA-Z])")


def _letters(text: str) -> set[str]:
    """The one-letter names an answer writes (outside commands and \\text{}), e and i excluded."""
    t = re.sub(r"\\(?:text|mathrm|textbf|operatorname|mbox)\s*\{[^{}]*\}", " ", text)
    t = re.sub(r"\\[a-zA-Z]+", " ", t)
    return set(_LETTER_RE.findall(t)) - {"e", "i"}


def _symbols(obj) -> set[str] | None:
    try:
        return {str(s) for s in obj.free_symbols}
    except Exception:
        return None


def guarded_equal(pred: str, gold: str, *, finer_decimals: bool = True) -> bool:
    """math-verify's verdict on two extracted answers, confirmed by our exact re-check
    (`finer_decimals`: the decimal rule's switch, `envs.grading.numbers.numbers_equal`)."""
    if len(pred) + len(gold) > 600 or _SKIP_RE.search(pred) or _SKIP_RE.search(gold):
        return False
    g, p = gold_parse(gold), _parse_answer(pred)
    if not g or not p or isinstance(g[0], str) or isinstance(p[0], str):
        return False  # nothing parsed: string fallbacks are our own string step's business
    # math-verify drops what it takes for units or labels ("6m" -> 6): a name the answer writes
    # must survive its parse, or its verdict is about a different answer.
    for text, obj in ((gold, g[0]), (pred, p[0])):
        syms = _symbols(obj)
        if syms is None or not _letters(text) <= syms | _labels_dropped(text):
            return False
    if not verify(g[:1], p[:1], timeout_seconds=None):
        return False
    return confirm(g[0], p[0], finer_decimals)


def _labels_dropped(text: str) -> set[str]:
    """Letters of a label math-verify may rightly drop ("x = 3", "AB = 4": the value counts)."""
    m = re.match(r"^\s*([^=<>]*?)=(?!=)", text)
    return set(re.findall(r"[a-zA-Z]", m.group(1))) if m else set()


def _doit(x):
    try:
        return x.doit() if hasattr(x, "doit") else x
    except Exception:
        return x


def _float_decimal(x):
    """The written decimal behind a bare sympy Float, as an `equivalence.Num`."""
    if isinstance(x, sympy.Float):
        return parse_number(repr(float(x)))
    if isinstance(x, sympy.Mul) and len(x.args) == 2 and x.args[0] == -1 and isinstance(x.args[1], sympy.Float):
        return parse_number(repr(-float(x.args[1])))
    return None


def _expr_exact(g, p, finer: bool) -> bool:
    """Gold and prediction objects (in that order: the decimal rule is not symmetric)."""
    dg, dp = _float_decimal(g), _float_decimal(p)
    if dg is not None and dp is not None:
        return numbers_equal(dp, dg, finer_decimals=finer)
    if dg is not None:
        return decimal_vs_expr(dg, p)
    if dp is not None:
        return decimal_vs_expr(dp, g)
    if g.atoms(sympy.Float) or p.atoms(sympy.Float):
        return False  # a decimal inside an expression: only our own exact path may accept it
    return exprs_equal(g, p)


def _unordered(xs, ys, finer: bool) -> bool:
    if len(xs) != len(ys):
        return False
    left = list(ys)
    for x in xs:
        for j, y in enumerate(left):
            if confirm(x, y, finer):
                del left[j]
                break
        else:
            return False
    return True


def confirm(g, p, finer_decimals: bool = True) -> bool:
    """Our exact re-check of two objects math-verify called equal (see the module docstring)."""
    g, p = _doit(g), _doit(p)
    if isinstance(g, str) or isinstance(p, str):
        return False
    if isinstance(g, MatrixBase) or isinstance(p, MatrixBase):
        if not (isinstance(g, MatrixBase) and isinstance(p, MatrixBase)) or g.shape != p.shape:
            return False
        return all(_expr_exact(a, b, finer_decimals) for a, b in zip(g, p))
    if isinstance(g, sympy.Eq) and not isinstance(p, sympy.Rel):
        return confirm(g.rhs, p, finer_decimals)  # "x = 3" against "3"
    if isinstance(p, sympy.Eq) and not isinstance(g, sympy.Rel):
        return confirm(g, p.rhs, finer_decimals)
    if isinstance(g, sympy.Rel) or isinstance(p, sympy.Rel):
        if type(g) is not type(p):
            flipped = {sympy.Lt: sympy.Gt, sympy.Gt: sympy.Lt, sympy.Le: sympy.Ge, sympy.Ge: sympy.Le}
            if flipped.get(type(g)) is not type(p):
                return False
            p = type(g)(p.rhs, p.lhs, evaluate=False)
        e1, e2 = g.lhs - g.rhs, p.lhs - p.rhs
        return proportional(e1, e2, positive=not isinstance(g, (sympy.Eq, sympy.Ne)))
    if isinstance(g, sympy.FiniteSet) or isinstance(p, sympy.FiniteSet):
        gs = list(g.args) if isinstance(g, sympy.FiniteSet) else [g]
        ps = list(p.args) if isinstance(p, sympy.FiniteSet) else [p]
        return _unordered(gs, ps, finer_decimals)
    if isinstance(g, sympy.Interval) or isinstance(p, sympy.Interval):
        if not (isinstance(g, sympy.Interval) and isinstance(p, sympy.Interval)):
            return False
        return (
            (g.left_open, g.right_open) == (p.left_open, p.right_open)
            and confirm(g.start, p.start, finer_decimals)
            and confirm(g.end, p.end, finer_decimals)
        )
    if isinstance(g, sympy.Union) or isinstance(p, sympy.Union):
        if not (isinstance(g, sympy.Union) and isinstance(p, sympy.Union)):
            return False
        return _unordered(list(g.args), list(p.args), finer_decimals)
    if isinstance(g, sympy.Tuple) or isinstance(p, sympy.Tuple):
        if not (isinstance(g, sympy.Tuple) and isinstance(p, sympy.Tuple)) or len(g) != len(p):
            return False
        return all(confirm(a, b, finer_decimals) for a, b in zip(g, p))
    if isinstance(g, sympy.Expr) and isinstance(p, sympy.Expr):
        if g in (sympy.oo, -sympy.oo) or p in (sympy.oo, -sympy.oo):
            return g == p
        return _expr_exact(g, p, finer_decimals)
    return False


def warm() -> None:
    """Pay math-verify's first-call costs (grammar load) before the worker says ready."""
    guarded_equal("\\frac{1}{2}", "0.5")
