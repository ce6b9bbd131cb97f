"""Final-answer extraction: which part of a response is its answer.

    extract_answer(response) -> str | None                    # the builtin grader's extraction
    extract_answer(response, boxed_only=True) -> str | None   # the `boxed` grader: \\boxed{} only

The steps, in order:
1. Chat-template leftovers end the response: text from the first special token that follows
   some text (`<|im_start|>`, `<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, `<|end_of_text|>`,
   `</s>`), outside code blocks, is dropped ("... is $42$.<|im_start|>user ..." -> "... is $42$.").
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

from envs.grading.extract_prose import answer_in_prose, join_spans, math_spans

__all__ = ["extract_answer"]

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*")
_SPECIAL_RE = re.compile(r"<\|(?:im_start|im_end|endoftext|eot_id|end_of_text)\|>|</s>")


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
        else:  # "\\boxed 5" form: the next token
            t = re.match(r"[^\s$.,;]+", text[j : j + 200])
            if t:
                found.append((m.start(), j + t.end(), t.group(0)))
    return found


# What may stand between two boxes of one multi-part answer (a label "x =" included:
# "x = \\boxed{-2} \\text{ or } x = \\boxed{3}").
_BOX_JOIN_RE = re.compile(
    r"(?:\s|\$|,|;|\.|&|\\[,;:! ]|\\q?quad(?![a-zA-Z])|\\(?:text|textrm|mbox)\{\s*(?:and|or|,)?\s*\}"
    r"|\band\b|\bor\b|\\\[|\\\]|\\\(|\\\)|[a-zA-Z](?:_\{?\w+\}?)?\s*=)*"
)


def _last_boxed(text: str) -> str | None:
    boxes = _find_boxed(text)
    if not boxes:
        return None
    parts = [boxes[-1]]
    for b in reversed(boxes[:-1]):
        if _BOX_JOIN_RE.fullmatch(text[b[1] : parts[0][0]]):
            parts.insert(0, b)
        else:
            break
    return ", ".join(p[2].strip() for p in parts)


# Where an answer line starts ("The final answer is", "Answer:", "the answers are", "the correct
# option is", "答案：", "故选", GSM8K's "####"); group 1 is the rest of the text.
_FINAL_RE = re.compile(
    r"(?:\banswers?\s*(?:is|are|was|would\s+be|should\s+be|will\s+be)?\s*[:：=]"
    r"|\banswers?\s+(?:is|are|was|would\s+be|should\s+be|will\s+be)\b\s*:?"
    r"|final\s+answer\s*\*\*\s*:?\s*(?=\n)|(?:^|\n)\s*\**answer\b\**\s*:?"
    r"|\b(?:option|choice)\s+(?:is|would\s+be)\b\s*:?"
    r"|答案\s*(?:是|为|為|应为|應為)?\s*[:：]?|(?:故|所以|因此|应|應)选\s*[:：]?"
    r"|(?:^|\n)[ \t]*####)\s*[:：]?\s*(\S.*)",
    re.IGNORECASE,
)
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
    r"(?:\b(?i:option|choice)\s+)?(?<![\w(])\(?([A-E])\)?\s+is\s+(?:the\s+)?(?i:correct|right)\b"
)
_NEGATION_RE = re.compile(r"\bnot\b|n't\b|\bnever\b|\bno\s+longer\b", re.IGNORECASE)
_NUMBER_THEN_WORDS_RE = re.compile(r"([-+]?\d[\d,]*(?:\.\d+)?(?:/\d+)?\s*%?)\s+[A-Za-z][A-Za-z' -]*")
_SENTENCE_CUT_RE = re.compile(r"(?<!\d)\.(?:\s|$)|\.\s|[。；]")


def _first_span_run(sentence: str) -> str | None:
    """The first math span of a sentence with the spans joined to it by connectors only."""
    spans = math_spans(sentence)
    return join_spans(spans, sentence, forward=True) if spans else None


def _from_final_line(text: str) -> str | None:
    matches = list(_FINAL_RE.finditer(text))
    if not matches:
        return None
    anchor = matches[-1]
    sentence_start = max(text.rfind(c, 0, anchor.start()) for c in ".!?\n。") + 1
    if _ANCHOR_HEDGE_RE.search(text[sentence_start : anchor.end(1)].split("\n")[0]):
        return None
    tail = text[anchor.start(1) :]
    display = _DISPLAY_RE.match(tail)
    if display and display.group(2).strip():  # "\[\n9\n\]": display math over several lines
        return display.group(2).strip()
    rest = tail.split("\n")[0].strip()
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
    words = _NUMBER_THEN_WORDS_RE.fullmatch(ans)
    if math is None and words:  # "12 apples": the number (units are the comparison's business)
        ans = words.group(1)
    return ans or None


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
    words = [w for w in _WORD_RE.findall(t) if w.lower() not in _MATH_WORDS]
    return len(words) <= 2 and not re.search(r"[a-zA-Z]\.\s+[A-Z]", t)


_CODE_SPAN_RE = re.compile(r"<code>.*?(?:</code>|$)|```.*?(?:```|$)", re.DOTALL)


def _strip_template(response: str) -> str:
    if "<|" not in response and "</s>" not in response:
        return response
    # A token written inside code (print('<|im_end|>')) is program text, not the chat template.
    code = [(m.start(), m.end()) for m in _CODE_SPAN_RE.finditer(response)]
    for m in _SPECIAL_RE.finditer(response):
        if any(a <= m.start() < b for a, b in code):
            continue
        if response[: m.start()].strip():
            return response[: m.start()]
    return response


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
