"""Answers equal by form (no sympy): numerals in a base, clock times, numbers in words, a percent
against a plain rate, a function named differently.

Each reader returns None when its form does not apply, so the caller falls through to the other
comparisons; where a form applies, its verdict is exact:
- `base_numeral("4210_{7}") -> ("4210", 7)`: same digits, and the same base or a bare numeral
  ("4210_7" = "4210_{7}" = "4210" against a base-7 gold; "4210_8" and "22" are not "4210_7").
- `clock_seconds("08:34 P.M.") -> 74040`: H:MM[:SS] with an optional a.m./p.m. (two-digit
  minutes, so a ratio "2:3" is no time); "20:34" = "20:34:00" = "08:34 P.M.".
- `words_number("twenty-five") -> 25`: integers written in English words.
- `percent_rate_equal("25\\%", "0.25") -> True`: a percent against a plain rate (a number
  strictly between 0 and 1 in size) that is its value / 100, both ways, under the decimal rule;
  "28\\%" against "28" is decided elsewhere (the percent sign dropped, as MATH golds often omit
  it), "0.28" against "28" is not equal, and "2" against "200%" is not decided here (a gold "2"
  may mean 2%). This is the whole percent convention: a percent equals the number it writes and
  the rate it names, nothing else ("25\\%" is not "2.5", "0.25" is not "2.5\\%").
- `FUNCTION_HEAD_RE`: "y", "f(x)", "g(t)", "f^{-1}(x)": a left side that names a function, so
  "f(x) = 2x+3" and "y = 2x+3" compare by their right sides.
"""

from __future__ import annotations

import re

from envs.grading.normalize import normalize_answer
from envs.grading.numbers import Num, numbers_equal, parse_number

__all__ = [
    "FUNCTION_HEAD_RE",
    "base_numeral",
    "base_numerals_equal",
    "clock_seconds",
    "percent_rate_equal",
    "words_number",
]

# ----------------------------------------------------------------------------- numerals in a base

_BASE_RE = re.compile(r"^([0-9A-Z]+)_\{?(\d{1,2})\}?$")


def base_numeral(s: str) -> tuple[str, int | None] | None:
    """(digits, base) of "4210_{7}" / "BEAD_16"; (digits, None) of a bare integer; else None.
    A subscript on a name ("a_{10}", "x_1") is no base: the digits need a digit or base > 10."""
    t = re.sub(r"\s+", "", s)
    m = _BASE_RE.match(t)
    if m:
        digits, base = m.group(1), int(m.group(2))
        if not 2 <= base <= 36 or not (re.search(r"\d", digits) or base > 10):
            return None
        return digits, base
    if re.fullmatch(r"\d+", t):
        return t, None
    return None


def base_numerals_equal(a: str, b: str) -> bool | None:
    """Same numeral (digits, and base where both state one); None unless a side states a base."""
    na, nb = base_numeral(a), base_numeral(b)
    if na is None or nb is None or (na[1] is None and nb[1] is None):
        return None
    same_base = na[1] is None or nb[1] is None or na[1] == nb[1]
    return same_base and na[0].lstrip("0") == nb[0].lstrip("0")


# ----------------------------------------------------------------------------- clock times

_CLOCK_RE = re.compile(r"^(\d{1,2}):(\d{2})(?::(\d{2}))?\s*(?:([AaPp])\.?\s*[Mm]\.?)?$")


def clock_seconds(s: str) -> int | None:
    """Seconds after midnight of "20:34", "20:34:00", "08:34 P.M.", "12:05 am"; else None."""
    m = _CLOCK_RE.match(s.strip())
    if not m:
        return None
    h, mi, sec = int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)
    half = (m.group(4) or "").lower()
    if mi > 59 or sec > 59 or h > (12 if half else 24) or (half and h == 0):
        return None
    if half:
        h = h % 12 + (12 if half == "p" else 0)
    return (h * 60 + mi) * 60 + sec


# ----------------------------------------------------------------------------- numbers in words

_UNITS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen"
).split()
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()
_WORD_VALUE = {w: i for i, w in enumerate(_UNITS)} | {w: 10 * (i + 2) for i, w in enumerate(_TENS)}
_SCALES = {"thousand": 10**3, "million": 10**6, "billion": 10**9, "trillion": 10**12}


def words_number(s: str) -> int | None:
    """The integer an English phrase names ("twenty-five", "one thousand twenty-one",
    "negative three", "a hundred"); None when it is not only number words."""
    words = [w for w in re.split(r"[\s\-,]+", s.strip().lower().rstrip(".")) if w and w != "and"]
    if not words or len(words) > 20:
        return None
    sign = 1
    if words[0] in ("negative", "minus"):
        sign, words = -1, words[1:]
    if words[:1] == ["a"] and len(words) > 1 and words[1] in ("hundred", *_SCALES):
        words = ["one", *words[1:]]
    if not words:
        return None
    total = group = 0
    last_scale = None
    for w in words:
        if w in _WORD_VALUE:
            v, low = _WORD_VALUE[w], group % 100
            if v == 0 and len(words) > 1:
                return None  # "zero" only alone
            # a word may fill an empty tens-and-units place, or the units after a ten ("twenty five")
            if not (low == 0 or (low >= 20 and low % 10 == 0 and 0 < v < 10)):
                return None
            group += v
        elif w == "hundred":
            if not 1 <= group <= 9:
                return None
            group *= 100
        elif w in _SCALES:
            scale = _SCALES[w]
            if group == 0 or (last_scale is not None and scale >= last_scale):
                return None
            total += group * scale
            group, last_scale = 0, scale
        else:
            return None
    return sign * (total + group)


# ----------------------------------------------------------------------------- percent vs rate

_PERCENT_HINT_RE = re.compile(r"%|percent|pct", re.IGNORECASE)
_PERCENT_RE = re.compile(r"\\?%|\\text\{\s*\\?%\s*\}|\bpercent(?:age)?\b|\bpct\b", re.IGNORECASE)


def _percent_number(raw: str) -> tuple[Num, bool] | None:
    """(the number, whether it is written as a percent) of a plain-number answer; else None."""
    num = parse_number(normalize_answer(raw))
    return None if num is None else (num, bool(_PERCENT_RE.search(raw)))


def _as_rate(n: Num) -> Num:
    """The rate a percent states: 12.5% -> 0.125, keeping how many digits it states."""
    return Num(
        n.value / 100,
        n.approx,
        None if n.decimals is None else n.decimals + 2,
        n.sig,
        None if n.last_exp is None else n.last_exp - 2,
    )


def percent_rate_equal(pred: str, gold: str, *, finer_decimals: bool = True) -> bool:
    """True when exactly one side is a percent and the other is that rate as a plain number."""
    if not _PERCENT_HINT_RE.search(pred) and not _PERCENT_HINT_RE.search(gold):
        return False  # (the common case, decided without normalizing)
    p, g = _percent_number(pred), _percent_number(gold)
    if p is None or g is None or p[1] == g[1]:
        return False
    rate = g[0] if p[1] else p[0]
    if not 0 < abs(rate.value) < 1:
        return False  # a plain rate is a fraction of a whole: "50" against "5000%" says nothing
    p_num = _as_rate(p[0]) if p[1] else p[0]
    g_num = _as_rate(g[0]) if g[1] else g[0]
    return numbers_equal(p_num, g_num, finer_decimals=finer_decimals)


# ----------------------------------------------------------------------------- function heads

FUNCTION_HEAD_RE = re.compile(r"^(?:y|[a-zA-Z]'*(?:\^\{?-1\}?)?\([a-zA-Z]\))$")
