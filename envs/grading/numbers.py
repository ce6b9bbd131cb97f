"""Exact numbers and the decimal rule (no sympy): `parse_number`, `numbers_equal`.

A plain number (integer, decimal, a/b, \\frac{a}{b}, mixed number, scientific notation) parses to
an exact `Fraction`, remembering how it was written: whether with a decimal point, and how many
digits it states. The decimal rule that `envs.grading` documents is implemented here
(`numbers_equal`, `decimal_matches_exact`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction


@dataclass(frozen=True)
class Num:
    """An exactly parsed number; `approx` when written with a decimal point or exponent."""

    value: Fraction
    approx: bool
    decimals: int | None  # digits after the point, when written as a plain decimal
    sig: int = 0  # significant digits written (decimals and scientific notation)
    last_exp: int | None = None  # the written value is an integer times 10**last_exp


_DEC = r"[-+]?(?:\d+\.?\d*|\.\d+)"
_DEC_RE = re.compile(r"^(" + _DEC + r")(?:[eE]([-+]?\d{1,4}))?$")
_SCI_RE = re.compile(r"^(" + _DEC + r")(?:\\times|\\cdot|\*|×|x)10\^\{?([-+]?\d{1,4})\}?$")
_POW10_RE = re.compile(r"^([-+]?)10\^\{?([-+]?\d{1,4})\}?$")
_FRAC_RE = re.compile(r"^([-+]?)\\frac\{(" + _DEC + r")\}\{(" + _DEC + r")\}$")
_SLASH_RE = re.compile(r"^(" + _DEC + r")/(" + _DEC + r")$")
_MIXED_RE = re.compile(r"^([-+]?)(\d+)\\frac\{(\d+)\}\{(\d+)\}$")
_MIXED_SPACE_RE = re.compile(r"^([-+]?)(\d+)\s+(\d+)/(\d+)$")
_THOUSANDS_RE = re.compile(r"^[-+]?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?$")


def _dec(text: str) -> Fraction:
    return Fraction(text)


def _written_precision(mant: str, exp: int) -> tuple[int, int]:
    """(significant digits, exponent of the last written digit) of a decimal mantissa."""
    digits = mant.lstrip("+-")
    frac = digits.split(".")[1] if "." in digits else ""
    sig = len(digits.replace(".", "").lstrip("0")) or 1
    return sig, exp - len(frac)


def parse_number(s: str) -> Num | None:
    """Parse a plain number (int, decimal, fraction, mixed number, scientific); None otherwise."""
    if len(s) > 200:
        return None
    # Spaces go, except between two digits: "4 4/9" is a mixed number, "12 13" is no number.
    t = re.sub(r"(?<!\d)\s+|\s+(?!\d)", "", s.strip())
    m = _MIXED_SPACE_RE.match(t)
    if m and int(m.group(3)) < int(m.group(4)):
        v = int(m.group(2)) + Fraction(int(m.group(3)), int(m.group(4)))
        return Num(-v if m.group(1) == "-" else v, False, None)
    if re.search(r"\d\s+\d", t):
        return None
    if t.startswith("(") and t.endswith(")") and "," not in t:
        t = t[1:-1]
    if _THOUSANDS_RE.match(t):
        t = t.replace(",", "")
    try:
        m = _DEC_RE.match(t)
        if m:
            mant, exp = m.group(1), m.group(2)
            v = _dec(mant) * (Fraction(10) ** int(exp) if exp else 1)
            approx = "." in mant or exp is not None
            decimals = len(mant.split(".")[1]) if "." in mant and not exp else None
            if not approx:
                return Num(v, False, None)
            return Num(v, True, decimals, *_written_precision(mant, int(exp or 0)))
        m = _SCI_RE.match(t)
        if m:
            exp = int(m.group(2))
            return Num(_dec(m.group(1)) * Fraction(10) ** exp, True, None, *_written_precision(m.group(1), exp))
        m = _POW10_RE.match(t)
        if m:
            v = Fraction(10) ** int(m.group(2))
            return Num(-v if m.group(1) == "-" else v, False, None)
        m = _FRAC_RE.match(t) or None
        if m:
            num, den = _dec(m.group(2)), _dec(m.group(3))
            if den == 0:
                return None
            v = num / den
            return Num(-v if m.group(1) == "-" else v, "." in m.group(2) + m.group(3), None)
        m = _SLASH_RE.match(t)
        if m:
            num, den = _dec(m.group(1)), _dec(m.group(2))
            if den == 0:
                return None
            return Num(num / den, "." in t, None)
        m = _MIXED_RE.match(t)
        if m and int(m.group(3)) < int(m.group(4)):  # 2\frac{1}{2} = 5/2 (proper fraction only)
            v = int(m.group(2)) + Fraction(int(m.group(3)), int(m.group(4)))
            return Num(-v if m.group(1) == "-" else v, False, None)
    except (ValueError, ZeroDivisionError, OverflowError):
        return None
    return None


# A decimal stands for an exact value only when it is the value rounded at the precision it
# states AND it states at least this many significant digits (a calculator or float print of the
# value: 0.0833333333333333 for 1/12, 3.14159265358979 for pi). Fewer digits (0.333 for 1/3,
# 1.4142 for sqrt 2) answer a different question than an exact gold asks; a truncation
# (0.666666666666666 for 2/3) or a value off in any stated digit is never accepted.
FULL_PRECISION_DIGITS = 12


def _round_half_away(x: Fraction) -> int:
    return int((x + Fraction(1, 2)).__floor__()) if x >= 0 else -int((-x + Fraction(1, 2)).__floor__())


def rounds_to(exact: Fraction, dec: Num) -> bool:
    """True when `exact` rounded at the last digit `dec` writes is `dec`'s value."""
    if dec.last_exp is None:
        return False
    scale = Fraction(10) ** dec.last_exp
    return _round_half_away(exact / scale) * scale == dec.value


def decimal_matches_exact(dec: Num, exact: Fraction) -> bool:
    """The decimal rule for a decimal against an exact value (see FULL_PRECISION_DIGITS)."""
    return dec.value == exact or (dec.sig >= FULL_PRECISION_DIGITS and rounds_to(exact, dec))


def _stated_decimals(n: Num) -> int | None:
    """Decimals a decimal states ("27.39": 2), or its mantissa's in scientific notation
    ("6.02e23": 2)."""
    if n.decimals is not None:
        return n.decimals
    return n.sig - 1 if n.last_exp is not None else None


def numbers_equal(pred: Num, gold: Num, *, finer_decimals: bool = True) -> bool:
    """The decimal rule: exact when both sides are exact; two decimals are equal when their values
    are, or (with `finer_decimals`, the default) when the prediction states more digits and
    rounds to a gold of two or more decimals ("27.3912" for a gold rounded to "27.39"; "6.022e23"
    for "6.02e23"; a gold "0.5" is taken as exact); a decimal against an exact value follows
    `decimal_matches_exact`."""
    if pred.value == gold.value:
        return True
    if not (pred.approx or gold.approx):
        return False
    if pred.approx and gold.approx:
        # A gold with one decimal (0.5, 2.5) is an exact value far more often than a rounding.
        stated = _stated_decimals(gold)
        if (
            finer_decimals
            and stated is not None
            and stated >= 2
            and pred.last_exp is not None
            and gold.last_exp is not None
            and pred.last_exp < gold.last_exp
        ):
            return rounds_to(pred.value, gold)
        return False
    dec, exact = (pred, gold) if pred.approx else (gold, pred)
    return decimal_matches_exact(dec, exact.value)
