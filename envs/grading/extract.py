"""Final-answer extraction: which part of a response is its answer.

    extract_answer(response) -> str | None                    # the builtin grader's extraction
    extract_answer(response, boxed_only=True) -> str | None   # the `boxed` grader: \\boxed{} only

The steps, in order:
1. Chat-template leftovers end the response: text from the first special token that follows
   some text (any `<|...|>` such as `<|im_start|>`, `<|im_end|>`, `<|eot_id|>`, `<|user|>`;
   `<｜end▁of▁sentence｜>`, `<end_of_turn>`, `</s>`, `[INST]`) or from a line that opens another
   speaker's turn ("User:", "Human:", "Assistant:", "### Instruction:"), outside code blocks, is
   dropped ("... is $42$.<|im_start|>user ..." -> "... is $42$."): a hallucinated next turn is
   not the model's answer to this problem.
2. Reasoning blocks: when the response closes a `<think>` block, only the text after the last
   `</think>` is searched. The thinking is searched only when nothing follows it: a \\boxed{5}
   while thinking is not the final answer of "<think>... \\boxed{5}</think> Let me verify this."
   (no answer) nor of "... </think> The final answer is 7." (7).
3. In the text chosen: the last `<answer>...</answer>` block (its last \\boxed{}, else its final-
   answer line, else its whole text); else the last \\boxed{}/\\fbox{}, joined with the boxes just
   before it when only connectors or a label separate them (`,` `;` `and` `or` `\\quad`
   `\\text{and}` `$` `x =`: "\\boxed{(2,2)} \\quad \\text{and} \\quad \\boxed{(6,2)}" is the one
   answer "(2,2), (6,2)", "x = \\boxed{-2} \\text{ or } x = \\boxed{3}" is "-2, 3");
   else an answer line: the last of "The final answer is", "Answer:", "the answer is", "our
   answers are", "the correct option is", "答案：", "故选", GSM8K's "####". Its value is its first
   math span with the spans joined to it by connectors (`$...$`, `\\(...\\)`, `\\[...\\]`,
   `$$...$$`, also over several lines; "$-3$ and $5$" -> "-3, 5"), an option letter ("(B).",
   "option A", "C, because ..." -> the letter), or else the sentence up to its end (after a last
   " is "; "12 apples" -> "12"). An answer line that doubts or negates ("check if the answer is
   5", "the answer is not $5$") states no answer;
   else the response itself when it is a bare answer (one short line with at most two words, or
   one display-math block);
   else the conclusion of a worked solution (`envs.grading.extract_prose`: the last math span of a
   concluding sentence, or one number in a short or concluding last sentence).
With `boxed_only`, step 3 keeps only \\boxed{}/\\fbox{} answers (inside <answer> or not).

Option letters with their values, labelled values and the like are not decided here: extraction
returns the text ("C. x = 42"), and `envs.grading.equivalence` compares it with the gold.
"""

from __future__ import annotations

import re

from envs.grading.extract_prose import (
    MINERVA_CLOSE_RE,
    answer_in_prose,
    glued_number,
    join_spans,
    math_spans,
    number_text,
    prose_numbers,
)
from envs.grading.units import unit_after

__all__ = ["boxed_set", "boxed_values", "extract_answer", "has_answer_line", "option_in_prose"]

# A box, also damaged the ways a reader still sees one: "\\beginboxed{42}", "boxed {77}" (no
# backslash, before a brace), a box glyph or \\Box before a brace ("□{15}").
_BOXED_RE = re.compile(r"\\(?:begin)?(?:boxed|fbox)\s*|(?:(?<![\\a-zA-Z])boxed|[□☐▢▭⬜]|\\Box(?![a-zA-Z]))\s*(?=\{)")
# Where a response's own turn ends: a chat-template token (`<|im_end|>`, `<|eot_id|>`, `<|user|>`,
# any `<|...|>`; DeepSeek's `<｜end▁of▁sentence｜>`; Gemma's `<end_of_turn>`; `</s>`, `[INST]`), or a
# line that opens another speaker's turn ("User:", "Human:", "### Instruction:").
_SPECIAL_RE = re.compile(
    r"<\|[^<>|\s]{1,40}\|>|<｜[^<>｜\s]{1,40}｜>|<(?:start|end)_of_turn>|</s>|<s>|\[/?INST\]"
    r"|\n[ \t]*(?:#{1,4}[ \t]*)?(?:User|USER|Human|HUMAN|Assistant|ASSISTANT|Instruction|Question)[ \t]*:"
)


def _brace_pairs(text: str) -> dict[int, int]:
    """Index of each '{' -> index of its matching '}' (one linear pass; \\{ \\} do not count)."""
    pairs, stack = {}, []
    for i, c in enumerate(text):
        if c in "{}" and i > 0 and text[i - 1] == "\\":
            continue
        if c == "{":
            stack.append(i)
        elif c == "}" and stack:
            pairs[stack.pop()] = i
    return pairs


def _find_boxed(text: str) -> list[tuple[int, int, str]]:
    """All \\boxed{...}/\\fbox{...} (and `\\boxed 5`) as (start, end, content), in order."""
    found = []
    pairs: dict[int, int] | None = None
    for m in list(_BOXED_RE.finditer(text))[-64:]:  # the last ones matter; bounded work on junk
        j = m.end()
        if j < len(text) and text[j] == "{":
            pairs = _brace_pairs(text) if pairs is None else pairs
            k = pairs.get(j, -1)
            if k < 0:
                continue
            found.append((m.start(), k + 1, text[j + 1 : k]))
        elif text[m.start()] == "\\":  # "\\boxed 5" form: the next token
            t = re.match(r"[^\s$.,;]+", text[j : j + 200])
            if t:
                found.append((m.start(), j + t.end(), t.group(0)))
    return found


def boxed_values(text: str) -> list[str]:
    """The contents of every box in `text`, in order ("\\boxed{1} papers and \\boxed{2} bins" -> 1, 2)."""
    return [b[2].strip() for b in _find_boxed(text)]


# What may stand between two boxes of one multi-part answer (a label "x =" included:
# "x = \\boxed{-2} \\text{ or } x = \\boxed{3}").
_BOX_JOIN_RE = re.compile(
    r"(?:\s|\$|,|;|\.|&|\\[,;:! ]|\\q?quad(?![a-zA-Z])|\\(?:text|textrm|mbox)\{\s*(?:and|or|,)?\s*\}"
    r"|\band\b|\bor\b|\\\[|\\\]|\\\(|\\\)|[a-zA-Z](?:_\{?\w+\}?)?\s*=)*"
)


_MAX_JOIN_CHARS = 200  # longer text between two boxes is prose: they are two answers


def _last_boxed(text: str) -> str | None:
    boxes = _find_boxed(text)
    if not boxes:
        return None
    parts = [boxes[-1]]
    for b in reversed(boxes[:-1]):
        gap = text[b[1] : parts[0][0]]
        if len(gap) <= _MAX_JOIN_CHARS and _BOX_JOIN_RE.fullmatch(gap):
            parts.insert(0, b)
        else:
            break
    return ", ".join(p[2].strip() for p in parts)


# Where an answer line starts ("The final answer is", "Answer:", "the answers are", "the correct
# option is", "答案：", "故选", GSM8K's "####"); group 1 is the rest of the text.
# (No two adjacent quantifiers may match the same text: "answer is" then a long run of spaces
# would be tried in cubic many ways. The colons and spaces after an anchor are one class.)
_FINAL_RE = re.compile(
    r"(?:\banswers?(?:\s*(?:is|are|was|would\s+be|should\s+be|will\s+be))?\s*[:：=]"
    r"|\banswers?\s+(?:is|are|was|would\s+be|should\s+be|will\s+be)\b"
    r"|final\s+answer\s*\*\*[ \t]*:?(?=[ \t]*\n)|(?:^|\n)[ \t]*\**answer\b\**"
    r"|\b(?:option|choice)\s+(?:is|would\s+be)\b"
    r"|答案(?:\s*(?:是|为|為|应为|應為))?|(?:故|所以|因此|应|應)选"
    r"|(?:^|\n)[ \t]*####)[\s:：]*(\S.*)",
    re.IGNORECASE,
)
_FINAL_ANSWER_RE = re.compile(r"\bfinal\s+answer\b", re.IGNORECASE)
_ANSWER_TAG_RE = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.DOTALL)
_WORD_RE = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]{2,}")
_MATH_WORDS = {
    "pi",
    "sqrt",
    "frac",
    "sin",
    "cos",
    "tan",
    "log",
    "ln",
    "exp",
    "and",
    "or",
    "infty",
    "cup",
    "cap",
    "in",
    "to",
}
_DISPLAY_RE = re.compile(r"\s*(\\\[|\$\$)(.*?)(\\\]|\$\$)", re.DOTALL)
_OPTION_RE = re.compile(r"\s*(?:(?i:option|choice)\s+)?\(?([A-E])\)?(?=[\s,.;:!?。，]|$)")
_MORE_OPTIONS_RE = re.compile(r"\s*(?:,|&|/|\band\b|\bor\b)\s*\(?[A-E]\b")  # "B and C": several options
# An answer line that is no answer: a conditional or doubtful "answer is" ("check if the answer is
# 5", "I guess the answer is", "whether the answer is"), or a negated value ("the answer is not 5").
_ANCHOR_HEDGE_RE = re.compile(
    r"\b(?:if|whether)\s+(?:the\s+|our\s+|my\s+)?(?:final\s+|correct\s+)?answers?\b|\bwhether\b|\bsuppose|"
    r"\bassum|\bguess|\bmaybe\b|\bperhaps\b|\bmight\b|\bnot\s+sure\b|\bunsure\b|\bdon'?t\s+know\b|\bwonder",
    re.IGNORECASE,
)
# "option E is correct", "(C) is the right one": an option letter stated correct.
_OPTION_CORRECT_RE = re.compile(
    r"(?:\b(?i:option|choice)\s+)?(?<![\w(])\(?([A-E])\)?\s+is\s+(?:the\s+)?(?i:correct|right|valid)\b"
)
# A response that opens with an option letter ("A. Because B is not valid", "(C) since ...").
_LEADING_OPTION_RE = re.compile(r"\s*\(?([A-E])(?:\)|\.|:)(?:\s|$)")
_NEGATION_RE = re.compile(r"\bnot\b|n't\b|\bnever\b|\bno\s+longer\b", re.IGNORECASE)
_NUMBER_THEN_WORDS_RE = re.compile(r"([-+]?\d[\d,]*(?:\.\d+)?(?:/\d+)?(?:\s*%)?)\s+[A-Za-z][A-Za-z' -]*")
_SENTENCE_CUT_RE = re.compile(r"(?<!\d)\.(?:\s|$)|\.\s|[。；]")


def _first_span_run(sentence: str) -> str | None:
    """The first math span of a sentence with the spans joined to it by connectors only."""
    spans = math_spans(sentence)
    return join_spans(spans, sentence, forward=True) if spans else None


_MAX_LINE_CHARS = 2000  # an answer line is read up to here (no answer is longer; bounded work on junk)


def _from_final_line(text: str) -> str | None:
    matches = list(_FINAL_RE.finditer(text))
    if not matches:
        return None
    anchor = matches[-1]
    sentence_start = max(text.rfind(c, 0, anchor.start()) for c in ".!?\n。") + 1
    # The sentence of the anchor and its value: a doubt there takes the answer back, not one in a
    # later sentence of the same line ("... is $14{,}916$. I hope it is correct. Note: ... assumes").
    value_sentence = re.split(r"(?<=[.!?])\s", text[anchor.start(1) : anchor.end(1)], maxsplit=1)[0]
    if _ANCHOR_HEDGE_RE.search((text[sentence_start : anchor.start(1)] + value_sentence).split("\n")[0]):
        return None
    tail = text[anchor.start(1) :]
    display = _DISPLAY_RE.match(tail)
    if display and display.group(2).strip():  # "\[\n9\n\]": display math over several lines
        return display.group(2).strip()
    rest = tail.split("\n", 1)[0][:_MAX_LINE_CHARS].strip()
    rest = MINERVA_CLOSE_RE.sub("", rest)  # "... is $12$. I hope it is correct." (also glued: "4.I hope")
    boxed = _last_boxed(rest)
    if boxed is not None:
        return boxed
    if re.search(r"\\(?:boxed|fbox)", rest):  # a \boxed{ cut off (truncated response): no answer
        return None
    # Cut at the end of the sentence ("42. I hope it is correct."), not inside decimals or math.
    spans = math_spans(rest)
    masked = list(rest)
    for a, b, _ in spans:
        masked[a:b] = "x" * (b - a)
    masked_text = "".join(masked)
    cut = _SENTENCE_CUT_RE.search(masked_text)
    sentence = rest[: cut.start()] if cut else rest
    # "The volume of $ABC$ is 120": the value follows the last " is ".
    is_m = list(re.finditer(r"\bis\b", masked_text[: len(sentence)]))
    if is_m:
        sentence = sentence[is_m[-1].end() :]
    sentence = sentence.strip().strip("*").strip()
    first_value = re.search(r"[\d$\\]", sentence)
    if _NEGATION_RE.search(sentence[: first_value.start() if first_value else len(sentence)]):
        return None  # "the answer is not $5$"
    if re.match(r"(?:\([A-E]\)|[A-E][.:])\s+\S", sentence) and math_spans(sentence):
        return sentence.rstrip(".")  # "(C) $42$": the option with its value
    option = _OPTION_RE.match(sentence)
    if option and not math_spans(sentence) and not _MORE_OPTIONS_RE.match(sentence[option.end() :]):
        return option.group(1)  # "(B).", "option A", "C, because ..."
    math = _first_span_run(sentence)
    ans = math if math is not None else sentence
    ans = ans.strip().strip("*").strip()
    glued = glued_number(ans) if math is None else None
    if glued is not None:  # "7.2m/s" -> "7.2 m/s"
        return glued
    words = _NUMBER_THEN_WORDS_RE.fullmatch(ans)
    if math is None and words:  # "12 apples": the number; "5 miles": the number and its unit
        unit = unit_after(ans[words.end(1) :])
        ans = f"{words.group(1).strip()} {unit}" if unit else words.group(1)
    elif math is None and len(ans.split()) > 2:  # "Jane started growing it 3 hours ago": its one number
        numbers = prose_numbers(ans)
        if len(numbers) == 1 and len(re.findall(r"\d", ans)) == len(re.findall(r"\d", numbers[0].group(0))):
            after = ans[numbers[0].end() :]
            unit = unit_after(after) if not numbers[0].group("unit") and after[:1].isspace() else None
            return f"{number_text(numbers[0])} {unit}" if unit else number_text(numbers[0])
    return ans or None


def has_answer_line(text: str) -> bool:
    """Whether `text` has a final-answer line ("The final answer is", "Answer:", ...)."""
    return _FINAL_RE.search(text) is not None


def _option_stated_correct(text: str) -> str | None:
    """The letter of the last "option E is correct" that no doubt precedes in its sentence."""
    matches = list(_OPTION_CORRECT_RE.finditer(text))
    if not matches:
        return None
    m = matches[-1]
    sentence_start = max(text.rfind(c, 0, m.start()) for c in ".!?\n。") + 1
    return None if _ANCHOR_HEDGE_RE.search(text[sentence_start : m.start()]) else m.group(1)


def _is_bare_answer(text: str) -> bool:
    """A short one-line answer ("42", "$\\frac{1}{2}$", "x = 3") rather than prose."""
    if "\n" in text.strip() or len(text) > 120 or re.search(r"\\(?:boxed|fbox)", text):
        return False  # (a \boxed left here is unclosed: a truncated response, not an answer)
    t = re.sub(r"\\text\{[^{}]*\}", " ", text)
    spans = math_spans(t)
    if spans and re.search(r"[a-zA-Z]{2,}", t[: spans[0][0]]):
        return False  # "So $\\int_0^1 x^2\\,dx = \\frac{1}{3}$.": words before the math, read as prose
    words = [w for w in _WORD_RE.findall(t) if w.lower() not in _MATH_WORDS]
    return len(words) <= 2 and not re.search(r"[a-zA-Z]\.\s+[A-Z]", t)


_CODE_SPAN_RE = re.compile(r"<code>.*?(?:</code>|$)|```.*?(?:```|$)", re.DOTALL)


def _strip_template(response: str) -> str:
    if "<" not in response and "[" not in response and ":" not in response:
        return response
    # A token written inside code (print('<|im_end|>')) is program text, not the chat template.
    code = [(m.start(), m.end()) for m in _CODE_SPAN_RE.finditer(response)]
    think_end = response.rfind("</think>")
    for m in _SPECIAL_RE.finditer(response):
        if any(a <= m.start() < b for a, b in code):
            continue
        if m.group(0).startswith("\n") and m.start() < think_end:
            continue  # "User: ..." quoted while thinking is no turn of its own
        if response[: m.start()].strip():
            return response[: m.start()]
    return response


_LAST_LINE_NUMBER_RE = re.compile(
    r"[*$\s]*(?:(?:\\\(|\\\[)\s*)?([-+]?\d[\d,]*(?:\.\d+)?(?:/\d+)?|[-+]?\\[dt]?frac\{\d+\}\{\d+\})"
    r"(?:\s*(?:\\\)|\\\]))?[*$\s]*"
)


def _last_line_number(text: str) -> str | None:
    """A number alone on the last line after some working ("... so 15 times 7.\n\n105"); not a
    list marker ("3."), not the output of code (a response ending in code concluded nothing)."""
    body = _CODE_SPAN_RE.sub("\n<code>\n", text).rstrip()
    lines = [line for line in body.split("\n") if line.strip()]
    if len(lines) < 2:
        return None
    m = _LAST_LINE_NUMBER_RE.fullmatch(lines[-1])
    return m.group(1) if m else None


# An option letter stated in prose: "I think it's B", "so I'd go with B", "I choose (D)".
_OPTION_IN_PROSE_RE = re.compile(
    r"\b(?:it'?s|it\s+is|is|go(?:ing)?\s+with|choose|chose|pick|select|option|choice|answer)(?:\s*:)?\s*"
    r"(?:\*\*)?\(?([A-E])\)?(?:\*\*)?(?=[\s.,!;:]|$)"
)


def option_in_prose(response: str) -> str | None:
    """The option letter the last sentence of a response states, for a gold that is a letter
    ("Option A fails and C is too large. I think it's B." -> "B"); None when that sentence
    hedges or negates ("Maybe it's B", "It is not B") or names no letter."""
    text = _strip_template(response)
    close = text.rfind("</think>")
    if close >= 0 and text[close + len("</think>") :].strip():
        text = text[close + len("</think>") :]
    tail = text[-2000:]
    matches = list(_OPTION_IN_PROSE_RE.finditer(tail))
    if not matches:
        leading = _LEADING_OPTION_RE.match(text)  # "A. Because B is not valid": the letter it opens with
        return leading.group(1) if leading and not _MORE_OPTIONS_RE.match(text[leading.end() - 1 :]) else None
    m = matches[-1]
    sentence_start = max(tail.rfind(c, 0, m.start()) for c in ".!?\n。") + 1
    before = tail[sentence_start : m.start()]
    after = tail[m.end() :]
    if _ANCHOR_HEDGE_RE.search(before) or _NEGATION_RE.search(before + m.group(0)) or len(after.strip()) > 80:
        return None
    if _MORE_OPTIONS_RE.match(after):
        return None  # "B and C": several options
    return m.group(1)


def _extract_in(text: str, boxed_only: bool) -> str | None:
    tags = _ANSWER_TAG_RE.findall(text)
    if tags and tags[-1].strip():
        block = tags[-1]
        boxed = _last_boxed(block)
        if boxed is not None or boxed_only:
            return boxed
        line = _from_final_line(block)
        return line if line is not None else block.strip()
    boxed = _last_boxed(text)
    if boxed is not None and not boxed_only:
        # A final-answer line after the last box states the answer the box worked towards
        # ("... = \\boxed{255}. So she has $10,455. The final answer is $10,455$.").
        after = text[_find_boxed(text)[-1][1] :]
        line = _from_final_line(after) if _FINAL_ANSWER_RE.search(after) else None
        if line is not None and re.search(r"\d", line):
            return line
    if boxed is not None or boxed_only:
        return boxed
    line = _from_final_line(text)
    if line is not None:
        return line
    option = _option_stated_correct(text)
    if option is not None:
        return option
    stripped = text.strip()
    whole = _DISPLAY_RE.fullmatch(stripped)
    if whole and whole.group(2).strip() and len(stripped) <= 400:
        return whole.group(2).strip()
    if stripped and _is_bare_answer(stripped):
        return stripped
    if _BOXED_RE.search(text):  # a \boxed{ left unclosed: a truncated response concluded nothing
        return None
    last = _last_line_number(text)
    if last is not None:
        return last
    return answer_in_prose(text)


def extract_answer(response: str, *, boxed_only: bool = False) -> str | None:
    """The final answer in a response, or None when there is none (steps: module docstring)."""
    if not response:
        return None
    text = _strip_template(response)
    close = text.rfind("</think>")
    if close >= 0:
        after = text[close + len("</think>") :]
        answer = _extract_in(after, boxed_only)
        if answer is not None or after.strip():
            return answer  # text after the thinking, without an answer: the thinking's is not final
        text = text[:close]
    return _extract_in(text, boxed_only)


# Words between two boxes that take the earlier one back ("\\boxed{5}, but actually \\boxed{7}").
_CORRECTION_RE = re.compile(
    r"\b(?:but|however|actually|instead|wait|wrong|mistake|no|not|correct(?:ion|ed)?|re-?check|"
    r"final(?:ly)?|in\s+the\s+end|rather|hmm|oops|sorry)\b",
    re.IGNORECASE,
)


def _one_tuple(value: str) -> bool:
    return value[:1] == "(" and value[-1:] == ")" and value.count("(") == 1 and value.count(")") == 1


def boxed_set(response: str, n: int) -> str | None:
    """The last `n` boxes of a response as one answer ("The first root is \\boxed{-1}. The second
    root is \\boxed{3}." -> "-1, 3"), for a gold that is a set of `n` solutions: each box one
    value, the boxes distinct, and no text between them that takes one back (a correction, a
    doubt) or runs longer than a sentence. None when they do not form such an answer."""
    if n < 2:
        return None
    text = _strip_template(response)
    close = text.rfind("</think>")
    if close >= 0 and text[close + len("</think>") :].strip():
        text = text[close + len("</think>") :]
    boxes = _find_boxed(text)[-n:]
    if len(boxes) < n:
        return None
    values = [b[2].strip() for b in boxes]
    if len(set(values)) < n or any(("," in v or ";" in v) and not _one_tuple(v) or not v for v in values):
        return None  # (a box that lists several values is no one value; a tuple "(3, 3)" is one)
    for a, b in zip(boxes, boxes[1:]):
        between = text[a[1] : b[0]]
        if len(between) > 200 or _CORRECTION_RE.search(between) or _ANCHOR_HEDGE_RE.search(between):
            return None
    return ", ".join(values)
