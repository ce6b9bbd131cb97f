"""Answers stated in prose, without a box or an answer line: the last step of `envs.grading.extract`.

    answer_in_prose(text) -> str | None

A careful reader takes the conclusion of a worked solution as its answer, and nothing from a
response that hedges, asks, states the task, or stops before concluding. So:
1. The last math span (`$...$`, `\\(...\\)`, `\\[...\\]`, `$$...$$`; an escaped `\\$` is no
   delimiter) is the answer when nothing after its sentence states more (no digit, math or code
   follows, and at most a short remark), its sentence is finished (a response cut off
   mid-sentence concluded nothing), is not a question, does not state the task ("Find ...",
   "Let ..."), and neither it nor what follows hedges or negates ("not sure", "could not",
   "whether", "let us", "might", "not", ...). A span that a condition introduces ("attained at
   $x = \\frac12$", "when $n = 3$") is where the result holds: the span before it is the result.
   Spans joined only by connectors are one answer ("$-3$ and $5$" -> "-3, 5"). A span that is a
   lone name ("$x$", "$ABC$") states no result.
   ("Therefore $x \\geq 5$ is the solution.", "so the probability is $\\frac{6}{36} = \\frac{1}{6}$.")
2. Without math spans, a plain number is the answer only in a conclusion: when the whole
   response is one short sentence holding it ("The meeting starts at 15:00."), or when the last
   sentence opens with a conclusion word (so, thus, therefore, hence, in total, ...) and ends
   with its period; the sentence must hold one number, or end its numbers with "= n"
   ("So she has 20 - 5 = 15 apples left." -> "15"). A unit glued to the number stays with it,
   spaced ("so each box weighs 18kg." -> "18 kg"); a currency sign or code goes ("2,500.75€").
"""

from __future__ import annotations

import functools
import re

from envs.grading.units import UNIT_SYMBOL_RE, unit_after

__all__ = ["answer_in_prose", "glued_number", "join_spans", "math_spans", "number_text", "prose_numbers"]

# Math delimiters; `\$` (an escaped dollar, a currency sign inside math) never opens or closes.
# Each delimiter pair as an alternative; lengths are bounded, so an unclosed delimiter scans a
# bounded stretch, and only the pairs whose closer occurs in the text are tried at all.
_SPAN_PARTS = (
    ("$$", r"(?<!\\)\$\$(?P<dd>.{1,1500}?)(?<!\\)\$\$"),
    ("\\]", r"\\\[(?P<db>.{1,1500}?)\\\]"),
    ("\\)", r"\\\((?P<ip>.{1,1500}?)\\\)"),
    ("$", r"(?<![\\$])\$(?!\$)(?P<id>(?:\\\$|[^$]){1,1500}?)(?<!\\)\$"),
)


@functools.lru_cache(maxsize=16)
def _span_re(present: tuple[bool, ...]) -> re.Pattern | None:
    parts = [part for (_, part), on in zip(_SPAN_PARTS, present) if on]
    return re.compile("|".join(parts), re.DOTALL) if parts else None


_CODE_RE = re.compile(r"<code>.*?(?:</code>|$)|```.*?(?:```|$)|<interpreter>.*?(?:</interpreter>|$)", re.DOTALL)

# Words that make a sentence not a conclusion (a hedge, a plan, an assumption, a doubt).
_HEDGE_RE = re.compile(
    r"\b(?:not\s+sure|unsure|could\s*n[o']t|can\s*n[o']t|can\s+not|don'?t\s+know|do\s+not\s+know|"
    r"unclear|unknown|whether|maybe|perhaps|might|guess|would|let\s+us|let's|let\s+me|need\s+to|"
    r"needs\s+to|yet|wait|hmm|suppose|assume|assuming|if|try|trying|remains?|later|cannot|unable|"
    r"wrong|incorrect|mistake|no\s+solution|not|never)\b|n't\b",
    re.IGNORECASE,
)
# A sentence that states the task, not a result ("Find $x$ with $x^2 = 25$.", "Let $n = 7$.").
_TASK_RE = re.compile(
    r"^\W*(?:find|determine|compute|calculate|solve|evaluate|simplify|show|prove|consider|given|let|"
    r"suppose|assume|recall|note\s+that|we\s+(?:want|need|have\s+to|must))\b",
    re.IGNORECASE,
)
# What introduces a condition rather than a result, right before a span ("attained at $x = 1$",
# "when $n = 3$", "for $x > 0$").
_CONDITION_RE = re.compile(
    r"\b(?:at|when|whenever|where|for|with|if|since|because|as|attained|achieved|reached|occurs?|"
    r"provided|given)\s*$",
    re.IGNORECASE,
)
_CONCLUSION_RE = re.compile(
    r"^\W*(?:so|thus|therefore|hence|consequently|finally|overall|altogether|in\s+total|in\s+all|"
    r"in\s+conclusion|as\s+a\s+result|this\s+means|that\s+means|which\s+means|∴)\b",
    re.IGNORECASE,
)
# A plain number in prose: a clock time, a fraction, a decimal or integer (thousands separators),
# a percentage.
# A unit or currency glued on ("18kg", "3.5m²", "60km/h", "2,500.75€", "1,200USD") belongs to the
# number: the unit is kept, spaced ("3.5 m²": `envs.grading.units` compares it), the currency goes.
_GLUED = rf"(?:(?P<unit>{UNIT_SYMBOL_RE.pattern})|(?:USD|EUR|GBP|JPY|CNY|RMB)(?![A-Za-z])|[€£¥₹])?"
_NUMBER_RE = re.compile(
    r"(?<![\w.^_])(?P<num>\d{1,2}:\d{2}(?::\d{2})?(?:\s*[AaPp]\.?[Mm]\b\.?)?"
    r"|[-+]?[$€£¥₹]?\d[\d,]*(?:\.\d+)?(?:/\d+)?(?:\s*%|\s*percent\b)?)" + _GLUED + r"(?![\w^_])"
)
_GLUED_NUMBER_RE = re.compile(r"\s*[$€£¥₹]?(?P<num>[-+]?\d[\d,]*(?:\.\d+)?(?:/\d+)?)" + _GLUED + r"\s*")


def number_text(m: re.Match) -> str:
    """A matched prose number as an answer: the number, and its unit spaced ("3.5 m²")."""
    num = m.group("num").strip().replace("$", "").lstrip("€£¥₹")
    return f"{num} {m.group('unit')}" if m.group("unit") else num


def prose_numbers(text: str) -> list[re.Match]:
    """The plain numbers of a sentence (`_NUMBER_RE`: times, fractions, decimals, percentages)."""
    return list(_NUMBER_RE.finditer(text))


def glued_number(text: str) -> str | None:
    """ "7.2m/s" -> "7.2 m/s", "2,500.75€" -> "2,500.75": a number with a glued unit or currency
    (text outside math, where a letter after a number is a unit); None for anything else."""
    m = _GLUED_NUMBER_RE.fullmatch(text)
    return number_text(m) if m else None


# Minerva's closing sentence (starts only where a run of spaces and dots starts: one try per run).
MINERVA_CLOSE_RE = re.compile(r"(?<![\s.])[\s.]*I\s+hope\s+it\s+is\s+correct\W*$", re.IGNORECASE)
_SENTENCE_END_RE = re.compile(r"(?<!\d)\.(?=\s|$)|[.!?。！？](?=\s)|[!?。！？]$|\n\s*\n|\n")
_CONNECTOR_RE = re.compile(r"(?:\s|,|;|\\(?:text|mbox)\{\s*(?:and|or)\s*\}|\band\b|\bor\b)*")
_LONE_NAME_RE = re.compile(r"^\s*(?:\\(?!pi\b|infty\b)[a-zA-Z]+|[a-zA-Z]{1,3})(?:_\{?\w+\}?)?'*\s*$")
_CONSTANT_NAMES = {"e", "i", "\\pi", "\\infty"}
_MAX_REMARK_CHARS = 200  # what may follow the concluding sentence ("This completes the proof.")
_WINDOW_CHARS = 4000  # the conclusion is read from the end of the text


def math_spans(text: str) -> list[tuple[int, int, str]]:
    """(start, end, content) of every math span, in order."""
    span_re = _span_re(tuple(closer in text for closer, _ in _SPAN_PARTS))
    out = []
    for m in span_re.finditer(text) if span_re is not None else ():
        content = next(g for g in m.groupdict().values() if g is not None)
        out.append((m.start(), m.end(), content.strip()))
    return out


def join_spans(spans: list[tuple[int, int, str]], text: str, *, forward: bool = False) -> str:
    """The last span (the first with `forward`) joined with the spans next to it that only
    connectors separate from it, as one answer ("$-3$ and $5$" -> "-3, 5")."""
    order = spans if forward else spans[::-1]
    run = [order[0]]
    for s in order[1:]:
        a, b = (run[-1], s) if forward else (s, run[-1])
        if not _CONNECTOR_RE.fullmatch(text[a[1] : b[0]]):
            break
        run.append(s)
    run.sort()
    return ", ".join(s[2] for s in run)


def _mask(text: str, spans: list[tuple[int, int, str]]) -> str:
    """The text with math spans blanked out (their periods end no sentence)."""
    chars = list(text)
    for a, b, _ in spans:
        chars[a:b] = "x" * (b - a)
    return "".join(chars)


def _sentence_bounds(masked: str, start: int, end: int) -> tuple[int, int, bool]:
    """Start and end of the sentence holding masked[start:end], and whether it is finished (a
    sentence end follows; a response cut off mid-sentence has none)."""
    begin = 0
    for m in _SENTENCE_END_RE.finditer(masked, 0, start):
        begin = m.end()
    m = _SENTENCE_END_RE.search(masked, end)
    return begin, (m.end() if m else len(masked)), m is not None


def _states_nothing_more(tail: str) -> bool:
    """What follows the concluding sentence: nothing, or a short remark without numbers or math."""
    return (
        len(tail.strip()) <= _MAX_REMARK_CHARS
        and not re.search(r"\d|\$|\\[(\[]|<code>|```", tail)
        and not _HEDGE_RE.search(tail)
    )


def _from_spans(text: str, spans: list[tuple[int, int, str]]) -> str | None:
    masked = _mask(text, spans)
    last = spans[-1]
    begin, end, finished = _sentence_bounds(masked, last[0], last[1])
    run_on = list(_RUN_ON_RE.finditer(masked, begin, last[0]))
    if run_on:  # "$y = 6$ So, the pair is $(7, 6)$.": the conclusion starts at "So"
        begin = run_on[-1].end()
    sentence = masked[begin:end]
    if "?" in sentence or _HEDGE_RE.search(sentence) or _TASK_RE.match(sentence):
        return None
    if not _states_nothing_more(text[end:]):
        return None
    if _RUN_ON_RE.search(masked, last[1], end):  # "$$...$$ Therefore, it increases by 100%.": concluded after
        return None
    if not finished and re.search(r"\w", text[last[1] :]):
        return None  # the sentence runs on to the end of the text unfinished (a truncated response)
    in_sentence = [s for s in spans if s[0] >= begin]
    # "the minimum is $-\frac14$, attained at $x = \frac12$": a span that a condition introduces
    # is where the result holds; the result is the span before it.
    while len(in_sentence) > 1 and _CONDITION_RE.search(masked[in_sentence[-2][1] : in_sentence[-1][0]]):
        in_sentence = in_sentence[:-1]
    answer = join_spans(in_sentence, text)
    if _LONE_NAME_RE.match(answer) and answer.strip() not in _CONSTANT_NAMES:
        return None
    return answer or None


# A conclusion run on after a formula without a period ("P(A) = 2/3 Therefore, the probability
# is 2/3."): the sentence starts at the conclusion word.
_RUN_ON_RE = re.compile(r"(?<=[\w)$])[ \t]+(?=(?:Therefore|Thus|Hence|So|Finally)\b)")
# A number the sentence takes back ("the number is not 10 which is 1,000.99", "it's not 10 it's
# 12"): it is not the answer, and its "not" does not negate what follows; unless a connector
# joins more to it ("x is not 2 or 3" negates both).
_NEGATED_NUMBER_RE = re.compile(r"\bnot\b[^\d\n]{0,12}?[-+]?\d(?:[\d,]*\d)?(?:\.\d+)?(?![\d.,])(?!\s*(?:or|and|nor)\b)")
# Between two numbers: the second restates the first ("5 + 5 = 10", "10 which is 1,000.99").
_RESTATED_RE = re.compile(r"\s*(?:=|which\s+is|that\s+is|i\.e\.,?|it'?s)\s*")


def _from_numbers(text: str, *, concluded_only: bool = False) -> str | None:
    stripped = text.strip()
    ends = [m for m in _SENTENCE_END_RE.finditer(stripped) if m.end() < len(stripped)]
    last = stripped[ends[-1].end() :].strip() if ends else stripped
    run_on = list(_RUN_ON_RE.finditer(last))
    if run_on:
        last = last[run_on[-1].end() :]
    whole = not ends and not run_on and len(stripped.split()) <= 30 and not concluded_only
    concluded = bool(_CONCLUSION_RE.match(last)) and stripped[-1] in ".!。"  # (not a truncated sentence)
    last = _NEGATED_NUMBER_RE.sub(" ", last)
    if not (whole or concluded) or "?" in last or _HEDGE_RE.search(last) or _TASK_RE.match(last):
        return None
    numbers = list(_NUMBER_RE.finditer(last))
    if not numbers:
        return None
    if len(numbers) > 1 and not _RESTATED_RE.fullmatch(last[numbers[-2].end() : numbers[-1].start()]):
        return None  # several numbers, and the last one is not the result of "... = n"
    last_number = numbers[-1]
    text_after = last[last_number.end() :]
    unit = unit_after(text_after) if not last_number.group("unit") and text_after[:1].isspace() else None
    # "The distance is 5 miles.": a unit in words stays with the number ("5 km" is not 5 miles)
    return f"{number_text(last_number)} {unit}" if unit else number_text(last_number)


def answer_in_prose(text: str) -> str | None:
    """The answer a worked solution concludes with, or None (rules: module docstring)."""
    if len(text) > _WINDOW_CHARS:
        text = text[-_WINDOW_CHARS:]  # the conclusion is at the end; bound the work on junk
    text = _CODE_RE.sub("\n<code>\n", text)  # code is no prose: what follows it is not concluded
    text = MINERVA_CLOSE_RE.sub(".", text)  # "... 12 sequences. I hope it is correct." ends at "sequences."
    spans = math_spans(text)
    if spans:
        answer = _from_spans(text, spans)
        # A concluding sentence after the last span, with a plain number ("Therefore, the error
        # increases by 100%."), is the answer.
        return answer if answer is not None else _from_numbers(text[spans[-1][1] :], concluded_only=True)
    return _from_numbers(text)
