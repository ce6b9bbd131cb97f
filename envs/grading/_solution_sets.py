"""Conditions on one real variable compared by their solution sets (grading worker only).

`x^2 = 4` and `x = 2 or x = -2` state the same thing; so do `|x| < 2`, `-2 < x and x < 2` and
`(-2, 2)`. When both answers read as conditions on (or values of) the same single variable and
one of them is more than a plain assignment (`envs.grading.structure.solution_pair` decides), each is
turned into a subset of the reals:
- a relation or a chain (`a < x <= b`): sympy's `solveset` over the reals, chains intersected;
- a list: "and" intersects; "or" unites; a comma list unites only equations and values;
- an interval `(a, b]`, a union of them, a set `\\{1, 2\\}`, a value: themselves.
The two subsets are then compared exactly, piece by piece: the same finite points and the same
intervals (same open/closed ends), every endpoint and point equal by `envs.grading._exact.exprs_equal`.
A set sympy cannot write as intervals and points (a condition set) decides nothing: not equal.
"""

from __future__ import annotations

from collections.abc import Callable

import sympy

from envs.grading._exact import exprs_equal
from envs.grading.structure import leaf_texts

_RELATIONS = {"=": sympy.Eq, "!=": sympy.Ne, "<": sympy.Lt, ">": sympy.Gt, "<=": sympy.Le, ">=": sympy.Ge}
_INFINITIES = {"\\infty": sympy.oo, "+\\infty": sympy.oo, "-\\infty": -sympy.oo}


class _NoSet(Exception):
    """A part that is no subset of the reals in one variable."""


def _value(text: str, to_sympy: Callable):
    t = text.strip()
    if t in _INFINITIES:
        return _INFINITIES[t]
    expr = to_sympy(t)
    if expr is None:
        raise _NoSet(t)
    return expr


def _real_set(node, var, to_sympy: Callable):
    kind = node[0]
    if kind == "rel":
        pieces, ops = node[1], node[2]
        result = sympy.S.Reals
        for k, op in enumerate(ops):
            if op not in _RELATIONS:
                raise _NoSet(op)
            rel = _RELATIONS[op](_value(pieces[k], to_sympy), _value(pieces[k + 1], to_sympy))
            result = sympy.Intersection(result, sympy.solveset(rel, var, domain=sympy.S.Reals))
        return result
    if kind == "list":
        items, connective = node[1], node[2]
        sets = [_real_set(it, var, to_sympy) for it in items]
        if connective == "and":
            return sympy.Intersection(*sets)
        if connective == "," and any(it[0] == "rel" and set(it[2]) != {"="} for it in items):
            raise _NoSet("a comma list of inequalities")  # "and" or "or"? not said
        return sympy.Union(*sets)
    if kind == "seq" and len(node[3]) == 2 and all(it[0] == "scalar" for it in node[3]):
        lo, hi = (_value(it[1], to_sympy) for it in node[3])
        return sympy.Interval(lo, hi, node[1] == "(", node[2] == ")")
    if kind == "union":
        return sympy.Union(*(_real_set(it, var, to_sympy) for it in node[1]))
    if kind in ("set", "scalar"):
        items = node[1] if kind == "set" else [node]
        if any(it[0] != "scalar" for it in items):
            raise _NoSet(kind)
        values = [_value(it[1], to_sympy) for it in items]
        if any(var in v.free_symbols for v in values):
            raise _NoSet("a value written with the variable")
        return sympy.FiniteSet(*values)
    raise _NoSet(kind)


def _pieces(s) -> list | None:
    """A subset of the reals as points and intervals, or None when sympy left it implicit."""
    if s is sympy.S.EmptySet:
        return []
    if s is sympy.S.Reals:
        return [("interval", -sympy.oo, sympy.oo, True, True)]
    if isinstance(s, sympy.FiniteSet):
        return [("point", v) for v in s.args]
    if isinstance(s, sympy.Interval):
        return [("interval", s.start, s.end, s.left_open, s.right_open)]
    if isinstance(s, sympy.Union):
        out = []
        for part in s.args:
            sub = _pieces(part)
            if sub is None:
                return None
            out += sub
        return out
    return None


def _same_piece(a, b) -> bool:
    if a[0] != b[0] or a[3:] != b[3:]:
        return False
    return all(exprs_equal(x, y) for x, y in zip(a[1:3], b[1:3]))


def solution_sets_equal(p, g, *, to_sympy: Callable) -> bool:
    """Same subset of the reals (module docstring); False when either side is not one."""
    texts = leaf_texts(p) + leaf_texts(g)
    exprs = [to_sympy(t) for t in texts if t.strip() not in _INFINITIES]
    if any(e is None for e in exprs):
        return False
    symbols = set().union(*(e.free_symbols for e in exprs))
    if len(symbols) != 1:
        return False
    var = symbols.pop()
    try:
        sp, sg = _real_set(p, var, to_sympy), _real_set(g, var, to_sympy)
    except _NoSet:
        return False
    pp, pg = _pieces(sp), _pieces(sg)
    if pp is None or pg is None or len(pp) != len(pg):
        return False
    left = list(pg)
    for a in pp:
        for j, b in enumerate(left):
            if _same_piece(a, b):
                del left[j]
                break
        else:
            return False
    return True
