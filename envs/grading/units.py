"""Quantities with units (no sympy): `read_quantity`, `quantities_equal`.

An answer "10 cm" states a number and a unit. Two answers that both state a unit are equal only
when they state the same quantity: the same dimension, and the same value once both are in the
same unit ("10 m" = "1000 cm", "36 km/h" = "10 m/s", "12 cm^2" = "1200 mm^2"). A different prefix
or another quantity is never equal ("10 m" is not "10 cm", "5 kg" is not "5 g", "12 cm^2" is
not "12 cm", "2 hours" is not "2 minutes"). A unit is read when the whole answer is a number
followed by a unit expression of known units: SI symbols with their prefixes (mm, cm, km, mg,
kg, ms, mL, kV, ...), their names in words ("meters", "kilograms", "square feet"), imperial
lengths and masses, time (min, h, days, weeks), money (dollars, cents), with exponents (^2, ²,
"square", "cubic") and quotients ("/", "per"). Conversions are exact (`fractions.Fraction`);
months and years, whose length varies, compare only with themselves.

Where only one side states a unit, or a unit is not read, nothing is decided here: the other
comparisons drop a trailing unit ("7 cm" against a gold "7" is 7, as golds often omit units).
A glued single letter ("6m") is a variable, not a unit, unless it is spaced ("6 m"); other single
letters than m, s, h, g, l ("2 t", "3 L", "5 N") are units only inside \\text{} or \\mathrm{}
("0.8 \\mathrm{V}"). The prose reader of `envs.grading.extract_prose` spaces the units it finds in
sentences ("3.5m²" -> "3.5 m²").
Percent signs are not units here (the percent convention is `envs.grading.forms`').
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from envs.grading.normalize import normalize_answer
from envs.grading.numbers import Num, numbers_equal, parse_number

__all__ = [
    "Quantity",
    "UNIT_SYMBOL_RE",
    "compare_quantities",
    "quantities_equal",
    "read_quantity",
    "unit_after",
    "without_unit",
]

F = Fraction
# dimension name -> exponent, as a sorted tuple (hashable)
Dim = tuple[tuple[str, int], ...]

# SI symbols that take prefixes: symbol -> (dimension, scale to the base unit)
_SI = {
    "m": ("L", F(1)),
    "g": ("M", F(1, 1000)),
    "s": ("T", F(1)),
    "L": ("L3", F(1, 1000)),
    "l": ("L3", F(1, 1000)),
    "V": ("V", F(1)),
    "W": ("W", F(1)),
    "J": ("J", F(1)),
    "N": ("N", F(1)),
    "Pa": ("P", F(1)),
    "A": ("I", F(1)),
    "Hz": ("Hz", F(1)),
    "eV": ("J", F(1602176634, 10**28)),
    "mol": ("mol", F(1)),
}
_PREFIXES = {"k": F(1000), "M": F(10**6), "G": F(10**9), "c": F(1, 100), "m": F(1, 1000), "µ": F(1, 10**6)}
_PREFIXES |= {"μ": F(1, 10**6), "u": F(1, 10**6), "n": F(1, 10**9), "d": F(1, 10)}
# Units that are not an SI symbol with a prefix: names, imperial units, time, money.
_NAMED = {
    "min": ("T", F(60)),
    "h": ("T", F(3600)),
    "hr": ("T", F(3600)),
    "sec": ("T", F(1)),
    "in": ("L", F(254, 10000)),
    "ft": ("L", F(3048, 10000)),
    "yd": ("L", F(9144, 10000)),
    "mi": ("L", F(1609344, 1000)),
    "lb": ("M", F(45359237, 10**8)),
    "lbs": ("M", F(45359237, 10**8)),
    "oz": ("M", F(45359237, 16 * 10**8)),
    "mph": ("L/T", F(1609344, 3600 * 1000)),
    "kph": ("L/T", F(1000, 3600)),
    "t": ("M", F(1000)),
}
_WORDS = {
    "meter": "m",
    "metre": "m",
    "millimeter": "mm",
    "millimetre": "mm",
    "centimeter": "cm",
    "centimetre": "cm",
    "kilometer": "km",
    "kilometre": "km",
    "gram": "g",
    "milligram": "mg",
    "kilogram": "kg",
    "second": "s",
    "millisecond": "ms",
    "minute": "min",
    "hour": "h",
    "day": "day",
    "week": "week",
    "month": "month",
    "year": "year",
    "inch": "in",
    "inche": "in",
    "foot": "ft",
    "feet": "ft",
    "yard": "yd",
    "mile": "mi",
    "pound": "lb",
    "ounce": "oz",
    "liter": "L",
    "litre": "L",
    "milliliter": "mL",
    "millilitre": "mL",
    "volt": "V",
    "watt": "W",
    "joule": "J",
    "newton": "N",
    "ampere": "A",
    "hertz": "Hz",
    "dollar": "dollar",
    "cent": "cent",
    "hrs": "h",
    "mins": "min",
    "secs": "s",
}
_OTHER = {
    "day": ("T", F(86400)),
    "week": ("T", F(7 * 86400)),
    "month": ("month", F(1)),  # (its length varies: only equal to months)
    "year": ("year", F(1)),
    "dollar": ("$", F(1)),
    "cent": ("$", F(1, 100)),
}

_ATOM_RE = re.compile(r"([a-zA-Zµμ]+)(?:\^\{?(-?\d)\}?)?")
_SQUARE_RE = re.compile(r"^(square|sq\.?|cubic|cu\.?)\s+", re.IGNORECASE)


def _atom(name: str) -> tuple[Dim, Fraction] | None:
    """Dimension and scale of one unit name ("cm", "kilometers", "ft"), or None."""
    low = name.lower()
    word = _WORDS.get(low) or (_WORDS.get(low[:-1]) if low.endswith("s") else None)
    symbol = word or name
    if symbol in _OTHER:
        dim, scale = _OTHER[symbol]
    elif symbol in _NAMED:
        dim, scale = _NAMED[symbol]
    elif symbol in _SI:
        dim, scale = _SI[symbol]
    elif len(symbol) > 1 and symbol[0] in _PREFIXES and symbol[1:] in _SI:
        dim, scale = _SI[symbol[1:]]
        scale = scale * _PREFIXES[symbol[0]]
    else:
        return None
    if dim == "L3":
        return (("L", 3),), scale
    if dim == "L/T":
        return (("L", 1), ("T", -1)), scale
    return ((dim, 1),), scale


def _combine(a: Dim, b: Dim, sign: int) -> Dim:
    out = dict(a)
    for k, v in b:
        out[k] = out.get(k, 0) + sign * v
    return tuple(sorted((k, v) for k, v in out.items() if v))


def read_unit(text: str) -> tuple[Dim, Fraction] | None:
    """Dimension and exact scale of a unit expression ("km/h", "m^2", "square feet",
    "meters per second", "N m"), or None when any part is not a known unit."""
    t = text.strip().rstrip(".")
    t = re.sub(r"\s+per\s+", "/", t)
    t = t.replace("²", "^2").replace("³", "^3")
    parts = re.split(r"\s*/\s*", t)
    if not t or len(parts) > 2:
        return None
    dim: Dim = ()
    scale = F(1)
    for k, part in enumerate(parts):
        power_word = 1
        m = _SQUARE_RE.match(part)
        if m:
            power_word = 2 if m.group(1).lower().startswith("s") else 3
            part = part[m.end() :]
        atoms = [a for a in re.split(r"\s*(?:\\cdot|\*|\s)\s*", part) if a]
        if not atoms:
            return None
        for atom in atoms:
            am = _ATOM_RE.fullmatch(atom)
            if not am:
                return None
            read = _atom(am.group(1))
            if read is None:
                return None
            power = (int(am.group(2)) if am.group(2) else 1) * power_word
            d, s = read
            sign = 1 if k == 0 else -1
            for _ in range(abs(power)):
                dim = _combine(dim, d, sign if power > 0 else -sign)
                scale = scale * s if (sign > 0) == (power > 0) else scale / s
    return dim, scale


@dataclass(frozen=True)
class Quantity:
    """A number with a unit: the number as written, the unit's dimension and exact scale."""

    number: str
    unit: str
    dim: Dim
    scale: Fraction


# Before reading: math delimiters, \text-like wrappers and spacing commands go (units are
# words inside \text{} or \mathrm{}).
_WRAPPER_RE = re.compile(r"\\(?:text|textrm|mathrm|mbox|operatorname|rm)\s*\{([^{}]*)\}")
_SPACING_RE = re.compile(r"\\[,;:! ]|~|\\q?quad(?![a-zA-Z])")
# The unit starts at the first letter after the number that is not part of a command ("3\\pi m").
# Single letters read as units when spaced from the number without \\text{}: those an answer
# writes as units far more often than as variables ("5 m", "3 s", "2 h", "4 g", "1 l").
_PLAIN_LETTER_UNITS = frozenset("mshgl")
_STARTS_WITH_NUMBER_RE = re.compile(r"\s*\$?\s*[-+]?\s*[\d.]")
_LETTER_RE = re.compile(r"[a-zA-Zµμ]")
_NUM_PART = r"(?:\\[a-zA-Z]+|[^a-zA-Zµμ\\])"
_QUANTITY_RE = re.compile(rf"^(?P<num>{_NUM_PART}*?\d{_NUM_PART}*?)(?P<sep>\s*)(?P<unit>[a-zA-Zµμ].*)$")


def read_quantity(text: str) -> Quantity | None:
    """The number and unit of an answer that is a plain number followed by known units; None
    otherwise (no unit, an unknown unit, a percent, an expression)."""
    if "%" in text or len(text) > 100 or not _STARTS_WITH_NUMBER_RE.match(text) or not _LETTER_RE.search(text):
        return None  # (the common case, decided before any rewriting: "42", "x = 5", "\\frac{1}{2}")
    t = text.replace("$", "")
    wrapped = bool(_WRAPPER_RE.search(t))
    for _ in range(3):
        t = _WRAPPER_RE.sub(r" \1 ", t)
    t = _SPACING_RE.sub(" ", t)
    t = re.sub(r"\^\{\s*([23])\s*\}", r"^\1", t).replace("²", "^2").replace("³", "^3")
    t = re.sub(r"\s+", " ", t).strip().rstrip(".")
    t = re.sub(r"\s+\^", "^", t)  # "cm ^2" (a \text{cm}^2 unwrapped)
    m = _QUANTITY_RE.match(t)
    if not m:
        return None
    unit = m.group("unit").strip()
    letter = re.fullmatch(r"([a-zA-Zµμ])(?:\^\d)?", unit)
    if letter and (not m.group("sep") or (letter.group(1) not in _PLAIN_LETTER_UNITS and not wrapped)):
        return None  # "6m", "2x^2", "2 t", "3 L": a variable, not a unit ("0.8 \\mathrm{V}" is one)
    read = read_unit(unit)
    if read is None:
        return None
    return Quantity(m.group("num").strip(), unit, read[0], read[1])


def _number(q: Quantity) -> Num | None:
    return parse_number(normalize_answer(q.number))


def compare_quantities(pred: str, gold: str, *, finer_decimals: bool = True) -> tuple[bool | None, str, str]:
    """(verdict, pred, gold): the verdict of `quantities_equal`, and the two answers with a unit
    stated on one side only dropped (`without_unit`), reading each answer once."""
    qp, qg = read_quantity(pred), read_quantity(gold)
    if qp is not None and qg is not None:
        return _quantities_verdict(qp, qg, finer_decimals), pred, gold
    if qp is not None:
        return None, qp.number, gold
    if qg is not None:
        return None, pred, qg.number
    return None, pred, gold


def quantities_equal(pred: str, gold: str, *, finer_decimals: bool = True) -> bool | None:
    """True/False when both answers state a quantity with a unit (module docstring); None when
    a side states none, so that the other comparisons decide."""
    qp, qg = read_quantity(pred), read_quantity(gold)
    if qp is None or qg is None:
        return None
    return _quantities_verdict(qp, qg, finer_decimals)


def _quantities_verdict(qp: Quantity, qg: Quantity, finer_decimals: bool) -> bool | None:
    if qp.dim != qg.dim:
        return False  # another quantity: a length is never a time
    np_, ng = _number(qp), _number(qg)
    if np_ is None or ng is None:
        return None if qp.scale == qg.scale else False  # (expressions: compared without units)
    if qp.scale == qg.scale:  # the same unit: the decimal rule decides
        return numbers_equal(np_, ng, finer_decimals=finer_decimals)
    return np_.value * qp.scale == ng.value * qg.scale


def without_unit(pred: str, gold: str) -> tuple[str, str]:
    """The two answers, the unit dropped from the one side that states it ("0.8 V" against "0.8"
    compares 0.8 with 0.8); unchanged when neither or both state one."""
    qp, qg = read_quantity(pred), read_quantity(gold)
    if (qp is None) == (qg is None):
        return pred, gold
    return (qp.number, gold) if qp is not None else (pred, qg.number)


def unit_after(text: str) -> str | None:
    """The unit that the words at the start of `text` name ("meters per second long" ->
    "meters per second"), the longest of up to four words; None when they name no known unit."""
    words = re.findall(r"[^\s,.;:!?]+", text[:80])
    for k in range(min(4, len(words)), 0, -1):
        phrase = " ".join(words[:k])
        if read_unit(phrase) is None:
            continue
        if (len(words[k - 1]) == 1 or words[k - 1] == "in") and k < len(words) and words[k][:1].isalpha():
            return None  # "4 in total", "3 m away": a short word that runs on is no unit
        return phrase
    return None


# The unit symbols and words a prose reader may find glued to a number ("18kg", "3.5m²").
UNIT_SYMBOL_RE = re.compile(
    r"(?:(?:[kMGcmµμund])?(?:m|g|s|L|l|V|W|J|N|Pa|A|Hz|eV|mol)|min|h|hr|hrs|sec|in|ft|yd|mi|lb|lbs|oz|mph|kph)"
    r"(?:²|³|\^\{?[23]\}?)?(?:/(?:[kMGcmµμund])?(?:m|g|s|L|l|h|min))?(?![A-Za-z])"
)
