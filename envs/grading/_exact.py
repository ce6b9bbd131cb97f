"""Exact equality of sympy expressions: no tolerance ever decides "equal" (grading worker only).

Numerical evaluation only rejects. "Equal" needs a proof that the difference d = a - b is zero:
- a constant d: sympy's evaluation makes it 0, or it is a rational (then it is 0 or not), or
  evaluation at 30 guaranteed digits (`evalf(strict=True)`) shows a nonzero value (not equal), or
  one of expand / sqrtdenest / trigsimp / simplify turns it into 0, or, for an algebraic number
  of small degree, its minimal polynomial is x. Nothing else: "99999999/10^8" is not
  "99999998/99999999", and 2^{1/2^{1000}} is not 1, however many digits agree.
- d with symbols: at sign-varying random rational points the two sides must agree numerically
  (a cheap filter: sqrt(x^2) = x fails at a negative point), then d must be exactly zero at four
  such points (each value a constant proved zero as above: identity testing with exact
  arithmetic), or simplify(d) must be 0.
- a decimal against an exact value: the decimal rule (`envs.grading.numbers.decimal_matches_exact`), where
  "the value itself" needs a rational value; an irrational one is never a decimal's exact value.
"""

from __future__ import annotations

import random
from fractions import Fraction

import sympy

from envs.grading.numbers import FULL_PRECISION_DIGITS, Num, decimal_matches_exact, rounds_to

_X = sympy.Symbol("_x")
_PRIMES = (11, 13, 17, 19, 23, 29, 31, 37)
_NUMERATORS = tuple(n for n in range(41, 98) if all(n % p for p in _PRIMES))
_MAX_PROOF_INT = 10**40  # larger integers in a constant: no answer's, and their proofs can hang
_MAX_ALGEBRAIC_DEGREE = 64  # a root of index above this is no answer's radical: no minimal polynomial


def cval(expr, subs=None) -> complex | None:
    """30-digit numerical value (a filter only), or None where undefined."""
    try:
        v = complex(expr.evalf(30, subs=subs) if subs else sympy.N(expr, 30))
    except Exception:
        return None
    if v != v or abs(v) == float("inf"):
        return None
    return v


def close(a: complex, b: complex, tol: float) -> bool:
    """Relative closeness, used only to reject: values this far apart are not equal."""
    scale = max(abs(a), abs(b))
    if min(abs(a), abs(b)) == 0:
        return scale < 1e-25
    return abs(a - b) <= tol * scale


def points(syms, k: int = 8):
    """Random rational points with both signs: a rule that holds only for positive values
    (sqrt(x^2) = x, |x| = x, log(x^2) = 2 log x) must fail here, not pass."""
    rng = random.Random(1234)  # deterministic: the same pair always gets the same verdict
    for j in range(k):
        # Prime denominators that do not divide the numerator: never an integer, never a simple
        # fraction at which sin(pi x) or a period-like factor vanishes by accident.
        yield {
            s: (-1 if (j + n) % 2 else 1) * sympy.Rational(rng.choice(_NUMERATORS), rng.choice(_PRIMES))
            for n, s in enumerate(syms)
        }


def _small_algebraic(d) -> bool:
    """An algebraic constant whose radicals have small index (its minimal polynomial is cheap)."""
    for node in sympy.preorder_traversal(d):
        if isinstance(node, sympy.Pow) and isinstance(node.exp, sympy.Rational) and node.exp.q > _MAX_ALGEBRAIC_DEGREE:
            return False
        if isinstance(node, (sympy.Function, sympy.Float)) or node in (sympy.pi, sympy.E):
            return False
    return True


def _pathological(d) -> bool:
    """A rational exponent or constant beyond any answer's (2^{1/2^{1000}}): no proof attempted."""
    return any(
        isinstance(r, sympy.Rational) and (abs(r.p) > _MAX_PROOF_INT or r.q > _MAX_PROOF_INT)
        for r in d.atoms(sympy.Rational)
    )


def const_is_zero(d) -> bool:
    """A proof that the constant expression d is zero (see the module docstring)."""
    if d == 0:
        return True
    if d.is_Rational or _pathological(d):
        return False
    try:
        if d.evalf(30, strict=True) != 0:
            return False  # 30 guaranteed digits of a nonzero value
    except Exception:
        pass  # no digit could be guaranteed: a zero, or a difference below any working precision
    for prove in (sympy.expand, sympy.sqrtdenest, sympy.trigsimp, sympy.simplify):
        try:
            if prove(d) == 0:
                return True
        except Exception:
            continue
    try:
        if d.is_algebraic and _small_algebraic(d):
            return sympy.minimal_polynomial(d, _X) == _X
    except Exception:
        pass
    return False


def exact_floats(expr):
    """Floats (from a parser that makes them) -> the exact decimal they print as."""
    try:
        floats = expr.atoms(sympy.Float)
    except Exception:
        return expr
    if not floats:
        return expr
    return expr.xreplace({f: sympy.Rational(repr(float(f))) for f in floats})


def exprs_equal(a, b) -> bool:
    """Exact equality of two sympy expressions (decimal literals were made exact rationals)."""
    if a == b:
        return True
    a, b = exact_floats(a), exact_floats(b)
    syms = sorted(a.free_symbols | b.free_symbols, key=str)
    if not syms:
        return const_is_zero(a - b)
    defined = []
    for subs in points(syms):  # every point is checked: negatives come second
        va, vb = cval(a, subs), cval(b, subs)
        if va is None or vb is None:
            continue
        if not close(va, vb, 1e-12):
            return False
        defined.append(subs)
    d = a - b
    try:
        if sympy.expand(d) == 0:
            return True
        at_points = [d.subs(subs) for subs in defined[:4]]
    except Exception:
        return False
    if len(at_points) == 4 and all(v.is_Rational for v in at_points):
        return all(v == 0 for v in at_points)  # exact values at 4 points: identity testing
    for prove in (sympy.trigsimp, sympy.simplify):
        try:
            if prove(d) == 0:
                return True
        except Exception:
            continue
    return len(at_points) == 4 and all(const_is_zero(v) for v in at_points)


def proportional(e1, e2, positive: bool) -> bool:
    """e1 = c * e2 for a constant c != 0 (c > 0 when `positive`), proved exactly."""
    if e1.free_symbols != e2.free_symbols:
        return False
    syms = sorted(e1.free_symbols, key=str)
    if not syms:
        return exprs_equal(e1, e2)
    for subs in points(syms):
        try:
            v2 = e2.subs(subs)
            if v2 == 0 or cval(v2) in (None, 0):
                continue
            c = sympy.simplify(e1.subs(subs) / v2)
        except Exception:
            return False
        if c == 0 or c.free_symbols or (positive and not c.is_positive):
            return False
        return exprs_equal(e1, c * e2)
    return False


def exact_fraction(expr) -> Fraction | None:
    """A real constant as a Fraction good to ~60 digits, or None."""
    try:
        if expr.free_symbols:
            return None
        v = sympy.N(expr, 60)
        if not v.is_real:
            return None
        return Fraction(str(v))
    except Exception:
        return None


def decimal_vs_expr(dec: Num, expr) -> bool:
    """The decimal rule for a written decimal against an exact expression: equal to its value
    only when that value is rational; else as its correct rounding at >= 12 significant digits."""
    try:
        value = expr if expr.is_Rational else sympy.simplify(expr)
    except Exception:
        value = expr
    if value.is_Rational:
        return decimal_matches_exact(dec, Fraction(int(value.p), int(value.q)))
    approx = exact_fraction(expr)
    return approx is not None and dec.sig >= FULL_PRECISION_DIGITS and rounds_to(approx, dec)
