"""Answer text normalization: `normalize_answer` (no sympy).

Delimiters, spacing commands, \\text{} and styling, \\left/\\right, degrees, percent and currency
signs, thousands separators and trailing units go; what remains is compared as text by
`envs.grading.equivalence` and parsed into a structure by `envs.grading.structure`.
"""

from __future__ import annotations

import re

from envs.grading.numbers import _THOUSANDS_RE


def _match_brace(s: str, i: int) -> int:
    """Index of the '}' closing the '{' at s[i], or -1 when unbalanced."""
    depth = 0
    for j in range(i, len(s)):
        c = s[j]
        if c == "\\":  # an escaped brace \{ \} does not count
            continue
        if c == "{" and (j == 0 or s[j - 1] != "\\"):
            depth += 1
        elif c == "}" and (j == 0 or s[j - 1] != "\\"):
            depth -= 1
            if depth == 0:
                return j
    return -1


# ----------------------------------------------------------------------------- normalization

_TEXT_CMDS = (
    "text",
    "textbf",
    "textit",
    "textrm",
    "textnormal",
    "textsf",
    "texttt",
    "mathrm",
    "mathbf",
    "mathit",
    "mathsf",
    "mathtt",
    "mathnormal",
    "mbox",
    "hbox",
    "operatorname",
    "boldsymbol",
    "bm",
    "boxed",
    "fbox",
    "displaystyle",
    "mathbb",
    "mathcal",
)


def _unwrap_commands(s: str, names: tuple[str, ...]) -> str:
    """Replace \\name{content} by content (brace-matched, nested-safe)."""
    pat = re.compile(r"\\(?:" + "|".join(names) + r")(?![a-zA-Z])\s*")
    for _ in range(50):  # bounded: each pass removes one command
        m = pat.search(s)
        if not m:
            break
        j = m.end()
        if j < len(s) and s[j] == "{":
            k = _match_brace(s, j)
            if k < 0:
                s = s[: m.start()] + s[j + 1 :]
            else:
                s = s[: m.start()] + s[j + 1 : k] + s[k + 1 :]
        else:
            s = s[: m.start()] + s[j:]
    return s


_UNIT_WORDS = (
    r"(?:square|sq|cubic|cu)?\s*(?:units?|cm|mm|km|m|meters?|metres?|centimeters?|kilometers?|"
    r"inch(?:es)?|in|feet|foot|ft|yards?|yd|miles?|mi|mph|km/h|m/s|seconds?|sec|s|minutes?|min|"
    r"hours?|hrs?|h|days?|weeks?|months?|years?|degrees?|deg|radians?|rad|dollars?|cents?|"
    r"grams?|g|kg|kilograms?|pounds?|lbs?|liters?|litres?|l|ml|people|students|ways|points?|"
    r"sq\.?\s*units?|percent|pct|percentage)"
)
_UNIT_EXP = r"(?:\^\{?[23]\}?|²|³)?"
_UNIT_TAIL_RE = re.compile(
    r"^(.*?)(\s*)(" + _UNIT_WORDS + _UNIT_EXP + r"(?:\s+" + _UNIT_WORDS + _UNIT_EXP + r")*)\.?$", re.IGNORECASE
)


_MAX_UNIT_SCAN_CHARS = 300  # (its lazy head tries every split: quadratic, so only on answer-sized text)
_MERIDIEM_RE = re.compile(r"\{\s*[AaPp]\.?\s*[Mm]\.?\s*\}")
_TEXT_TAIL_RE = re.compile(r"(?<!\s)\s*\\(?:text|textrm|mbox|textnormal)\{\s*[a-zA-Z][a-zA-Z .,'!?-]*\}\.?$")


_DEGREE = r"(?:\^\s*\{?\s*\\circ\s*\}?|°|\\degree(?![a-zA-Z]))"
_TRIG_DEGREES_RE = re.compile(
    r"\\(sin|cos|tan|cot|sec|csc)\s*\(?\s*\{?\s*(-?\d+(?:\.\d+)?)\s*\}?\s*" + _DEGREE + r"\s*\)?"
)
_SUPERSCRIPTS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺", "0123456789-+")
_SUPERSCRIPT_RE = re.compile(r"[⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺]+")


def normalize_answer(s: str) -> str:
    """Canonical LaTeX-ish text of an answer: no delimiters, styling, units or separators."""
    s = re.sub(r"\s+", " ", s).strip()  # first: no pattern below meets a run of spaces
    s = s.replace("±", "\\pm ").replace("∓", "\\mp ")
    s = _SUPERSCRIPT_RE.sub(lambda m: "^{" + m.group(0).translate(_SUPERSCRIPTS) + "}", s)  # 10⁴, m²
    s = re.sub(r"(?<!\\)\\$", "", s).strip()  # "185\\": a stray trailing backslash
    s = s.replace("\\$", "").replace("$", "").strip()  # (before the tail rules: "$$0.06 \\text{ yuan}$$")
    # "17\text{ any text}": words in \text after a value are a comment, not part of it.
    tail = _TEXT_TAIL_RE.search(s)
    if tail and _MERIDIEM_RE.search(tail.group(0)):
        tail = None  # "9:15 \text{ PM}": part of a clock time, not a comment
    if tail and re.search(r"\d", s[: tail.start()]) and not re.search(r"[a-zA-Z]", s[: tail.start()]):
        s = s[: tail.start()]
    s = re.sub(r"(?<!\\)\\[\[\]()]", " ", s)  # \( \) \[ \]
    s = s.replace("\\$", "").replace("$", "")
    s = re.sub(r"\\(?:euro|pounds|yen)(?![a-zA-Z])|[€£¥₹]|\b(?:USD|EUR|GBP|JPY|CNY|RMB)\b", "", s)
    s = re.sub(r"\\(?:left|right)\s*\.", "", s)
    s = re.sub(r"\\(?:left|right|bigl|bigr|Bigl|Bigr|bigg|Bigg|big|Big)(?![a-zA-Z])", "", s)
    s = re.sub(r"\\(?:displaystyle|textstyle|limits|nolimits|rm|bf|it)(?![a-zA-Z])", "", s)
    s = re.sub(r",\\!\s*", ",", s)  # "11,\\! 111" is a thousands separator
    s = re.sub(r"(?<=\d) ?\{ ?, ?\} ?(?=\d)", ",", s)  # "14 {, }916": a thousands separator
    s = s.replace("{,}", ",").replace("\\!", "")
    s = re.sub(r"(?<!\\)\\[,;:>]", "", s)
    s = re.sub(r"\\(?:qquad|quad|space)(?![a-zA-Z])|(?<!\\)\\ |~", " ", s)
    s = _unwrap_commands(s, _TEXT_CMDS)
    s = re.sub(r"\\[dtc]frac(?![a-zA-Z])", r"\\frac", s)
    s = _TRIG_DEGREES_RE.sub(r"\\\1(\\frac{\2\\pi}{180})", s)  # \cos 60^\circ is cos(pi/3), not cos(60)
    s = re.sub(r"\^\s*\{?\s*\\circ\s*\}?|°|\\degree(?![a-zA-Z])|\\circ(?![a-zA-Z])", "", s)
    s = s.replace("\\%", "%")
    s = re.sub(r"\\(?:leqslant|leq|le)(?![a-zA-Z])|[≤⩽]", "<=", s)
    s = re.sub(r"\\(?:geqslant|geq|ge)(?![a-zA-Z])|[≥⩾]", ">=", s)
    s = re.sub(r"\\(?:neq|ne)(?![a-zA-Z])|≠", "!=", s)
    s = re.sub(r"\\lt(?![a-zA-Z])", "<", s)
    s = re.sub(r"\\gt(?![a-zA-Z])", ">", s)
    s = re.sub(r"\\(?:dots|ldots|cdots)(?![a-zA-Z])|\.\.\.", "", s)
    s = re.sub(r"\\(?:varnothing)(?![a-zA-Z])", r"\\emptyset", s)
    s = s.replace("\\lvert", "|").replace("\\rvert", "|").replace("\\vert", "|")
    s = re.sub(r"\\(?:sqrt)\s*(\d)", r"\\sqrt{\1}", s)  # \sqrt2 -> \sqrt{2}
    s = re.sub(r"\\frac\s*(\d)\s*(\d)", r"\\frac{\1}{\2}", s)  # \frac12
    s = re.sub(r"\\frac\s*(\d)\s*\{", r"\\frac{\1}{", s)  # \frac1{2}
    s = re.sub(r"\\frac\s*(\{[^{}]*\})\s*(\d)", r"\\frac\1{\2}", s)  # \frac{1}2
    s = re.sub(r"(?<!\s)\s*(?:%|\bpercent(?:age)?\b|\bpct\b)\s*$", "", s, flags=re.IGNORECASE)
    s = s.replace("%", "")
    s = re.sub(r"\s+", " ", s).strip()
    s = re.sub(r"^(?:[a-zA-Z]\s*)?\\in(?![a-zA-Z])\s*", "", s)  # "x \in [0, 1)" -> "[0, 1)"; not \int
    s = s.rstrip(" .;,")
    m = _UNIT_TAIL_RE.match(s) if len(s) <= _MAX_UNIT_SCAN_CHARS else None
    if m and _is_unit_tail(m.group(1), m.group(2), m.group(3)):
        s = m.group(1).strip()
    s = re.sub(r"^\+\s*(?=[\d\\])", "", s)
    if _THOUSANDS_RE.match(s) or re.fullmatch(r"[-+]?\d{1,3}(?: \d{3})+(?:\.\d+)?", s):
        s = s.replace(",", "").replace(" ", "")  # "7,425,000" / "1 000"
    return s


def _is_unit_tail(head: str, sep: str, unit: str) -> bool:
    """ "15 cm", "15cm", "36\\pi m": a number then units. Not "6m" or "2n": one glued letter is a
    variable, not a unit."""
    if not re.search(r"\d", head) or re.search(r"[a-zA-Z]", re.sub(r"\\(?:frac|sqrt|pi|times|cdot)", "", head)):
        return False
    if not sep:
        return bool(re.search(r"[\d}]$", head)) and len(re.match(r"[a-zA-Z]*", unit).group(0)) >= 2
    return True


def _squash(s: str) -> str:
    return re.sub(r"\s+", "", s)
