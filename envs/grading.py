"""Final-answer extraction and equivalence checking for math answers.

    grade_answer(response, gold) -> bool      # extract the final answer, compare with gold
    extract_answer(response) -> str | None    # last \\boxed{}/\\fbox{}, <answer>, final-answer line, bare answer
    answers_equivalent(pred, gold) -> bool    # compare two extracted answers

How a comparison runs, cheapest first:
1. Both answers are normalized as LaTeX text (delimiters, spacing commands, \\text{}, \\left/\\right,
   degrees, percent and currency signs, thousands separators, trailing units) and compared as strings.
2. Both are parsed into a light structure (scalar, tuple/interval, set, list, union, matrix,
   relation) and compared item by item. Scalars that are plain numbers (integers, decimals, a/b,
   \\frac, mixed numbers, scientific notation) are compared exactly with `fractions.Fraction`, in this
   process, without sympy. This decides most answers (every DAPO and AIME answer is an integer).
3. Only when some scalar needs algebra (\\sqrt, \\pi, symbols, ...) is the pair sent to a sympy worker
   process (`envs/_symbolic.py`) that re-runs step 2 with symbolic scalars. The worker is killed
   when a call exceeds `timeout_s`, so no answer can hang the caller, from any thread, even inside C
   code; the call then falls back to the string comparison of step 1 (i.e. "not equal").

This module and `envs.equivalence` (steps 1-2) never import sympy or torch: `import envs.grading`
is fast.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import select
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from pathlib import Path

from envs.equivalence import (NeedSymbolic, _match_brace, compare_normalized, fast_relation_eq,
                              fast_scalar_eq, normalize_answer, parse_number)

__all__ = ["grade_answer", "extract_answer", "answers_equivalent", "normalize_answer", "parse_number",
           "Grader"]

# ----------------------------------------------------------------------------- extraction

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*")


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
            found.append((m.start(), k + 1, text[j + 1:k]))
        else:  # "\\boxed 5" form: the next token
            t = re.match(r"[^\s$.,;]+", text[j:j + 200])
            if t:
                found.append((m.start(), j + t.end(), t.group(0)))
    return found


def _last_boxed(text: str) -> str | None:
    boxes = _find_boxed(text)
    if not boxes:
        return None
    # "\boxed{2} and \boxed{3}": boxes separated only by connectors form one multi-part answer.
    parts = [boxes[-1]]
    for b in reversed(boxes[:-1]):
        between = text[b[1]:parts[0][0]]
        if re.fullmatch(r"[\s$,;.]*(?:and|or|,|;)?[\s$,;.]*", between):
            parts.insert(0, b)
        else:
            break
    return ", ".join(p[2].strip() for p in parts)


_FINAL_RE = re.compile(
    r"(?:(?:final\s+answer|the\s+answer)\s*(?:is\s*:?|:|=)|(?:^|\n)\s*answer\b\s*:?)\s*(.+)",
    re.IGNORECASE)
_ANSWER_TAG_RE = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.DOTALL)
_WORD_RE = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]{2,}")
_MATH_WORDS = {"pi", "sqrt", "frac", "sin", "cos", "tan", "log", "ln", "exp", "and", "or",
               "infty", "cup", "cap", "in", "to"}


def _first_math_span(s: str) -> str | None:
    m = re.search(r"\$\$?(.+?)\$\$?|\\\((.+?)\\\)|\\\[(.+?)\\\]", s, re.DOTALL)
    if not m:
        return None
    return next(g for g in m.groups() if g is not None)


def _from_final_line(text: str) -> str | None:
    matches = list(_FINAL_RE.finditer(text))
    if not matches:
        return None
    rest = matches[-1].group(1).strip()
    rest = re.split(r"\n", rest)[0]
    boxed = _last_boxed(rest)
    if boxed is not None:
        return boxed
    if re.search(r"\\(?:boxed|fbox)", rest):  # a \boxed{ cut off (truncated response): no answer
        return None
    # Cut at the end of the sentence ("42. I hope it is correct."), not inside decimals or $...$.
    cut = re.search(r"(?<!\d)\.(?:\s|$)|\.\s", re.sub(r"\$[^$]*\$", lambda m: "x" * len(m.group()), rest))
    sentence = rest[:cut.start()] if cut else rest
    # "The volume of $ABC$ is 120": the value follows the last " is ".
    is_m = list(re.finditer(r"\bis\b", re.sub(r"\$[^$]*\$", lambda m: "x" * len(m.group()), sentence)))
    if is_m:
        sentence = sentence[is_m[-1].end():]
    math = _first_math_span(sentence)
    ans = math if math is not None else sentence
    ans = ans.strip().strip("*").strip()
    return ans or None


def _is_bare_answer(text: str) -> bool:
    """A short one-line answer ("42", "$\\frac{1}{2}$", "x = 3") rather than prose."""
    if "\n" in text.strip() or len(text) > 120 or re.search(r"\\(?:boxed|fbox)", text):
        return False  # (a \boxed left here is unclosed: a truncated response, not an answer)
    t = re.sub(r"\\text\{[^{}]*\}", " ", text)
    words = [w for w in _WORD_RE.findall(t) if w.lower() not in _MATH_WORDS]
    return len(words) <= 2 and not re.search(r"[a-zA-Z]\.\s+[A-Z]", t)


def extract_answer(response: str) -> str | None:
    """The final answer in a response, or None when there is none.

    Order: inside the last <answer>...</answer> block if any (its last \\boxed{}, else its text);
    else the last \\boxed{}/\\fbox{} of the response; else an explicit final-answer line
    ("The final answer is $42$."); else the response itself when it is a bare answer.
    """
    if not response:
        return None
    tags = _ANSWER_TAG_RE.findall(response)
    if tags and tags[-1].strip():
        block = tags[-1]
        boxed = _last_boxed(block)
        if boxed is not None:
            return boxed
        line = _from_final_line(block)
        return line if line is not None else block.strip()
    boxed = _last_boxed(response)
    if boxed is not None:
        return boxed
    line = _from_final_line(response)
    if line is not None:
        return line
    text = response.strip()
    if text and _is_bare_answer(text):
        return text
    return None


def answers_equivalent(pred: str, gold: str, *, timeout_s: float | None = None) -> bool:
    """Equivalence of two extracted answers (see module docstring); never hangs."""
    return _default_grader().equivalent(pred, gold, timeout_s=timeout_s)


# ----------------------------------------------------------------------------- symbolic worker

_PKG_PARENT = str(Path(__file__).resolve().parent.parent)


class _SymbolicWorker:
    """A child Python process that runs the sympy comparison; killed when a call overruns."""

    def __init__(self, startup_timeout_s: float) -> None:
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen | None = None
        self.owner_pid = os.getpid()
        self.ready = False
        self.buf = b""

    def _spawn(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = _PKG_PARENT + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-m", "envs._symbolic"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0, env=env, close_fds=True)
        self.ready, self.buf = False, b""

    def _readline(self, deadline: float) -> bytes | None:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([fd], [], [], left)
            if not r:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:  # the worker died
                return None
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line

    def kill(self) -> None:
        if self.proc is not None and self.owner_pid == os.getpid():
            try:
                self.proc.kill()
                self.proc.wait(timeout=5)
            except Exception:
                pass
        self.proc, self.ready = None, False

    def call(self, pred: str, gold: str, timeout_s: float) -> bool | None:
        """The worker's verdict, or None when it timed out or failed (then it is restarted)."""
        if self.owner_pid != os.getpid():  # we are a forked child: the pipes belong to the parent
            self.proc, self.ready, self.buf, self.owner_pid = None, False, b"", os.getpid()
        if self.proc is None or self.proc.poll() is not None:
            self._spawn()
        if not self.ready:
            if self._readline(time.monotonic() + self.startup_timeout_s) != b"ready":
                self.kill()
                return None
            self.ready = True
        try:
            assert self.proc is not None and self.proc.stdin is not None
            msg = json.dumps({"pred": pred, "gold": gold, "timeout": timeout_s}) + "\n"
            self.proc.stdin.write(msg.encode())
        except (OSError, ValueError):
            self.kill()
            return None
        line = self._readline(time.monotonic() + timeout_s)
        if line is None:
            self.kill()
            self._spawn()  # start the replacement now so the next call finds it warm
            return None
        try:
            return bool(json.loads(line)["equal"])
        except (ValueError, KeyError, TypeError):
            self.kill()  # out of step with the worker: start over rather than misread answers
            return None


class Grader:
    """Answer grader with a bounded sympy fallback and a small result cache.

    timeout_s: hard wall-clock bound of the symbolic step of one call (the worker is killed past it).
    symbolic: False compares with numbers and strings only (no worker process).
    cache_size: remembered (pred, gold) verdicts; GRPO groups repeat the same answers a lot.
    startup_timeout_s: bound on starting the worker (importing sympy), paid once per process.
    """

    def __init__(self, timeout_s: float = 3.0, symbolic: bool = True, cache_size: int = 8192,
                 startup_timeout_s: float = 60.0) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s={timeout_s!r}: must be > 0")
        self.timeout_s = timeout_s
        self.symbolic = symbolic
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple[str, str], bool] = OrderedDict()
        self._lock = threading.Lock()
        self._worker = _SymbolicWorker(startup_timeout_s)
        self.stats = {"calls": 0, "symbolic_calls": 0, "timeouts": 0}

    def equivalent(self, pred: str, gold: str, *, timeout_s: float | None = None) -> bool:
        try:
            p, g = normalize_answer(pred), normalize_answer(gold)
        except Exception:  # (defensive: normalization is regex-only) never crash the caller
            return False
        key = (p, g)
        with self._lock:
            self.stats["calls"] += 1
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        try:
            verdict = compare_normalized(p, g, fast_scalar_eq, fast_relation_eq)
        except NeedSymbolic:
            verdict = False
            if self.symbolic and len(p) + len(g) <= 2000:
                with self._lock:
                    self.stats["symbolic_calls"] += 1
                    res = self._worker.call(p, g, timeout_s or self.timeout_s)
                    if res is None:
                        self.stats["timeouts"] += 1
                        from loguru import logger  # rare path: keep the import off module load
                        logger.warning("grading timed out after {} s (counted as not equal): {!r} vs {!r}",
                                       timeout_s or self.timeout_s, p[:80], g[:80])
                verdict = bool(res)
        except Exception as e:  # a grader bug must never crash training: count it as "not equal"
            from loguru import logger
            logger.warning("grading failed ({!r}); counted as not equal: {!r} vs {!r}", e, p[:80], g[:80])
            verdict = False
        with self._lock:
            if self.cache_size > 0:
                self._cache[key] = verdict
                if len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        return verdict

    def grade(self, response: str, gold: str, *, timeout_s: float | None = None) -> bool:
        pred = extract_answer(response)
        if pred is None:
            return False
        gold_ans = extract_answer(gold) if "\\boxed" in gold or "\\fbox" in gold else gold
        return self.equivalent(pred, gold_ans or gold, timeout_s=timeout_s)

    def close(self) -> None:
        with self._lock:
            self._worker.kill()


_DEFAULT: Grader | None = None  # one shared grader per process: its worker is a process-wide resource
_DEFAULT_LOCK = threading.Lock()


def _default_grader() -> Grader:
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = Grader()
            atexit.register(_DEFAULT.close)
        return _DEFAULT


def grade_answer(response: str, gold: str, *, timeout_s: float | None = None) -> bool:
    """True when the final answer of `response` is equivalent to `gold` (never hangs)."""
    return _default_grader().grade(response, gold, timeout_s=timeout_s)
