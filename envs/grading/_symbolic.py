"""Symbolic answer comparison with sympy: runs in the grading worker process only.

`envs.grading` sends (pred, gold) pairs that plain numbers cannot decide to its worker process
(`python -m envs.grading._worker`), one JSON line each, and kills that process if it overruns its
time bound. Here the answers are converted from LaTeX to sympy by a small translator of our own
(`envs.grading.latex_expr.to_python`; no eval of model text: every identifier of the translated
text is checked against a whitelist and builtins are removed from the evaluation namespace), then
compared exactly (`envs.grading._exact`):

- decimal literals inside an expression become exact rationals (10.5 -> 21/2); a scalar that is
  a written decimal against an exact expression follows the decimal rule of `envs.grading.numbers`
  (`decimal_matches_exact`), never a tolerance;
- numbers and expressions: equal only with a proof that the difference is zero (`envs.grading._exact`:
  numerical evaluation only rejects);
- relations: `a = b` vs `c = d` when a - b and c - d are proportional; inequalities when they are
  positively proportional with the same strictness;
- conditions on one real variable (`x^2 = 4` vs `x = 2 or x = -2`, `|x| < 2` vs
  `-2 < x and x < 2`): their solution sets over the reals (`envs.grading._solution_sets`).

A side our translator cannot read leaves the pair undecided (`Undecided`); the worker then asks
the math-verify stage (`envs/grading/_mv_stage.py`), whose "equal" is re-checked exactly before it counts.
"""

from __future__ import annotations

from functools import partial

import sympy
from sympy.parsing.sympy_parser import (
    implicit_multiplication,
    parse_expr,
    standard_transformations,
)

from envs.grading._exact import decimal_vs_expr, exprs_equal, proportional
from envs.grading._solution_sets import solution_sets_equal
from envs.grading.equivalence import (
    NeedSymbolic,
    Undecided,
    compare_normalized,
    fast_relation_eq,
    fast_scalar_eq,
)
from envs.grading.latex_expr import GREEK_IDENT, to_python
from envs.grading.numbers import parse_number

_LOCALS: dict = {c: sympy.Symbol(c) for c in "abcdfghjklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"}
_LOCALS.update({"e": sympy.E, "i": sympy.I, "pi": sympy.pi, "oo": sympy.oo})
_LOCALS.update({ident: sympy.Symbol(g) for g, ident in GREEK_IDENT.items()})
_GLOBALS: dict = {}
exec("from sympy import *", _GLOBALS)  # the names parse_expr's transformations emit
_GLOBALS["__builtins__"] = {}  # model text can never reach open/exec/__import__
_TRANSFORMS = standard_transformations + (implicit_multiplication,)


def latex_to_sympy(s: str):
    """sympy expression for a normalized LaTeX scalar, or None when it cannot be translated."""
    try:
        py = to_python(s.strip())
        if not py.strip():
            return None
        raw = parse_expr(
            py, local_dict=dict(_LOCALS), global_dict=_GLOBALS, transformations=_TRANSFORMS, evaluate=False
        )
        if not isinstance(raw, sympy.Basic) or _too_big(raw):
            return None
        return parse_expr(
            py, local_dict=dict(_LOCALS), global_dict=_GLOBALS, transformations=_TRANSFORMS, evaluate=True
        )
    except Exception:
        return None


def _too_big(expr) -> bool:
    """Powers/factorials whose exact evaluation would take seconds (2^{10^{10}}, 10000!)."""
    for node in sympy.preorder_traversal(expr):
        try:
            if isinstance(node, sympy.Pow) and node.base.is_number and node.exp.is_number:
                if abs(float(node.exp)) > 1e4 and abs(float(node.base)) != 1:
                    return True
            if isinstance(node, sympy.factorial) and node.args[0].is_number:
                if abs(float(node.args[0])) > 1e4:
                    return True
        except (TypeError, ValueError, OverflowError):
            return True
    return False


def sympy_scalar_eq(pred: str, gold: str, *, finer_decimals: bool = True) -> bool:
    try:
        return fast_scalar_eq(pred, gold, finer_decimals=finer_decimals)
    except NeedSymbolic:
        pass
    a, b = latex_to_sympy(pred), latex_to_sympy(gold)
    if a is None or b is None:
        raise Undecided(f"cannot translate {pred if a is None else gold!r}")
    for text, other in ((pred, b), (gold, a)):
        num = parse_number(text)
        if num is not None and num.approx:  # a written decimal: judged by the decimal rule
            return decimal_vs_expr(num, other)
    return exprs_equal(a, b)


def sympy_relation_eq(pp: list, po: list, gp: list, go: list) -> bool:
    try:
        return fast_relation_eq(pp, po, gp, go)
    except NeedSymbolic:
        pass
    if len(po) != 1 or len(go) != 1:
        return False
    sides = [latex_to_sympy(x) for x in (pp[0], pp[1], gp[0], gp[1])]
    if any(x is None for x in sides):
        return False
    e1, e2 = sides[0] - sides[1], sides[2] - sides[3]
    op1, op2 = po[0], go[0]
    if "=" in (op1, op2) or "!=" in (op1, op2):
        return op1 == op2 and proportional(e1, e2, positive=False)
    if (op1 in ("<", ">")) != (op2 in ("<", ">")):
        return False
    e1 = -e1 if op1 in ("<", "<=") else e1  # both now read "e > 0" / "e >= 0"
    e2 = -e2 if op2 in ("<", "<=") else e2
    return proportional(e1, e2, positive=True)


def symbolic_equivalent(pred: str, gold: str, *, finer_decimals: bool = True) -> bool | None:
    """Full comparison of two normalized answers with sympy scalars, relations and solution
    sets; None when our translator could not read some part (math-verify may still decide)."""
    scalar_eq = partial(sympy_scalar_eq, finer_decimals=finer_decimals)
    try:
        return compare_normalized(
            pred, gold, scalar_eq, sympy_relation_eq, partial(solution_sets_equal, to_sympy=latex_to_sympy)
        )
    except Undecided:
        return None
    except NeedSymbolic:
        return False
