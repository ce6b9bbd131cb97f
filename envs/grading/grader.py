"""Grading a response against a gold answer: the reward and every reported accuracy.

    grade_answer(response, gold, mode="builtin") -> bool   # extract the final answer, compare
    Grader(mode).check(response, gold) -> GradeResult       # verdict + answer + seconds + timeout
    extract_answer(response) -> str | None                 # envs.grading.extract (documented there)
    answers_equivalent(pred, gold) -> bool                 # compare two extracted answers

Modes (`env.grader`; training and evaluation use the same one, summary.json records it; maj@N
groups answers with the same one):
- `builtin` (default): our extraction (`envs.grading.extract`), then the stages below, cheapest first.
  Two readings depend on the gold: a gold that is a set of n solutions also accepts n boxes that
  together state it ("The first root is \\boxed{-1}. The second root is \\boxed{3}.",
  `envs.grading.extract.boxed_set`), and a gold that is an option letter also accepts a letter
  stated in prose ("I think it's B", `envs.grading.extract.option_in_prose`).
- `math_verify`: Hugging Face math-verify alone (its extraction and comparison, as papers grade),
  run in the same killable worker; for numbers comparable with published ones.
- `boxed`: like builtin, but only a \\boxed{}/\\fbox{} answer counts (no prose, no bare answers).

The builtin stages:
0. Units (`envs.grading.units`): when both answers are a number with a unit, they are equal only
   when they state the same quantity ("10 m" = "1000 cm", "36 km/h" = "10 m/s"; "10 m" is not
   "10 cm", "5 kg" is not "5 g", "12 cm^2" is not "12 cm"); this verdict is final. A unit on one
   side only is dropped ("0.8 V" against "0.8").
1. Both answers are normalized as LaTeX text (`envs.grading.normalize`: delimiters, spacing commands,
   \\text{}, \\left/\\right, degrees (inside a trig function: radians), percent and currency signs,
   thousands separators, trailing units, superscript digits) and compared as strings. The percent
   convention: a percent equals the number it writes ("25\\%" = "25", as MATH golds often drop
   the sign) and the rate it names ("25\\%" = "0.25", both ways; `envs.grading.forms`), and nothing
   else ("25\\%" is not "2.5"; "0.25" is not "25").
2. Both are parsed into a light structure (scalar, tuple/interval, set, list, labelled values,
   union, matrix, relation, option letter; `envs.grading.structure`) and compared item by item, in any
   order for sets and lists of solutions ("p=5,q=2;p=7,q=2" = "(5,2),(7,2)", "\\pm 3" = "3, -3").
   Plain numbers (integers, decimals, a/b, \\frac, mixed numbers, scientific notation) are compared
   exactly with `fractions.Fraction`, in this process, without sympy; so are the forms of
   `envs.grading.forms` (numerals in a base, clock times, numbers in words, "f(x) =" against "y ="),
   formulas that differ only in the order of commuting factors and terms (`envs.grading.commutative`:
   "\\sum_{k=0}^{n} a_k b_{n-k}" = "\\sum_{k=0}^{n} b_{n-k} a_k"), an operation stated with its value
   against the value ("\\lim_{x\\to0} f(x) = 1", "\\det M = 3", "\\frac{d}{dx}x^3 = 3x^2"), and a sum of
   written matrices against the matrix it evaluates to. Two expressions whose complex-float values
   clearly differ at a random point are not equal (`envs.grading.latex_expr`: an evaluation that
   only rejects; equality is never decided by values). This decides most answers (every DAPO and AIME answer is an integer); its "equal" and "not equal"
   are final.
3. Only a part step 2 cannot decide (a scalar needing algebra to be proved equal, an expression of matrices, an
   equation or inequality against its solutions) sends the pair to a worker process
   (`envs/grading/_worker.py`): step 2 again with sympy scalars (our own LaTeX translator,
   `envs.grading._symbolic`), conditions on one variable compared by their solution sets
   (`envs.grading._solution_sets`); when our translator cannot read a side, math-verify parses both
   answers and its "equal" counts only after our exact re-check of the objects it parsed
   (`envs/grading/_mv_stage.py`). Every "equal" of this stage is exact (`envs.grading._exact`): numerical
   evaluation only rejects, equality needs a proof (a zero difference after sympy's
   simplifications, exact values at random rational points), so two different exact values are
   never accepted for being close ("99999999/10^8" is not "99999998/99999999"; 2^{1/2^{1000}} is
   not 1), whatever math-verify said.
   The worker is killed when a call exceeds `timeout_s`, so no answer can hang the caller, from any
   thread, even inside C code; a timed-out call counts as "not equal" and as a timeout in
   `Grader.stats` and in `GradeResult.timed_out`.

Steps 0-2 run in the caller's process (the trainer's main process), outside the worker's kill
bound, so they are bounded by construction: no pattern they run on model text has nested or
adjacent quantifiers that can match the same characters (each text has one way to match, or a
lookbehind lets a search start once per run of spaces), scans have length caps (answers over
`MAX_ANSWER_CHARS` compare as text, labels over 80 characters are no labels, an answer line is
read up to 2000 characters, prose from the last 4000), and the comparison as a whole has a budget
(`IN_PROCESS_BUDGET_S`): past it, what is undecided goes to the worker, or counts as not equal
(stage "budget") where the worker may not run. A slow answer is never accepted for being slow.

The decimal rule (`envs.grading.numbers.numbers_equal`): two exact forms compare exactly. Two decimals
are equal when their values are ("1.60" = "1.6"), or, by default, when the prediction states more
digits and rounds to a gold of two or more decimals (a gold rounded to "27.39" accepts
"27.3912", not "27.4"; "6.02e23" accepts "6.022e23"; a gold "0.5" is exact and does not accept
"0.54"): the convention of a grader who reads a gold "27.39" as "the value, rounded to two
decimals". The switch `finer_decimals=False` (`env.grade_finer_decimals: false`) takes the other
convention: the gold is the value, and "27.3912" is not "27.39". A decimal against an exact value
(1/3, \\pi) is accepted only when it is that value rounded at the last digit it states and it
states at least 12 significant digits (a calculator or float print): "0.0833333333333333" is 1/12,
while "0.333" is not 1/3, "1.4142" is not \\sqrt{2}, and the truncation "0.666666666666666" is not 2/3.

This module, `envs.grading.extract` and `envs.grading.equivalence` never import sympy, math-verify or torch:
`import envs.grading` is fast.
"""

from __future__ import annotations

import atexit
import os
import re
import subprocess
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from envs.grading.equivalence import (
    NeedSymbolic,
    compare_normalized,
    fast_relation_eq,
    fast_scalar_eq,
    normalize_answer,
    solution_count,
)
from envs.grading.extract import boxed_set, boxed_values, extract_answer, has_answer_line, option_in_prose
from envs.grading.forms import percent_rate_equal
from envs.grading.protocol import GradingContext, GradingMethod, Verdict
from envs.grading.units import compare_quantities
from envs.line_worker import LineWorker
from registry import Registry

__all__ = [
    "GRADERS",
    "GradeResult",
    "Grader",
    "GradingContext",
    "GradingMethod",
    "Verdict",
    "answers_equivalent",
    "get_grader",
    "grade_answer",
]


@dataclass(frozen=True)
class GradeResult:
    """One graded response: the verdict, the extracted answer, and what it cost."""

    correct: bool
    pred: str | None
    timed_out: bool
    seconds: float
    stage: str  # the stage that decided: fast | cache | symbolic | math_verify | timeout | budget | none


def answers_equivalent(pred: str, gold: str, *, timeout_s: float | None = None) -> bool:
    """Equivalence of two extracted answers (builtin stages, see module docstring); never hangs."""
    return get_grader("builtin").equivalent(pred, gold, timeout_s=timeout_s)


# ----------------------------------------------------------------------------- the graders

# env.grader: which grader scores rewards and evaluations (one setting for both). Each entry is
# a `GradingMethod` (envs.grading.protocol): its `check` grades a response and its `equivalent`
# compares two extracted answers (maj@N groups answers with it); both see the `Grader` that holds
# the cache and the worker through its public `GradingContext` (compare, ask_worker).
GRADERS: Registry[type[GradingMethod]] = Registry("grader")


_OPTION_LETTER_RE = re.compile(r"\(?[A-E]\)?")


@GRADERS.register("builtin")
class BuiltinGrading:
    """Our extraction (`envs.grading.extract`), then the builtin stages, cheapest first."""

    boxed_only = False
    needs: tuple[str, str] | None = None  # (module, pip requirement) this grader cannot run without

    def check(self, ctx: GradingContext, response: str, gold: str, timeout_s: float | None) -> Verdict:
        pred = extract_answer(response, boxed_only=self.boxed_only)
        if pred is None and not self.boxed_only and _OPTION_LETTER_RE.fullmatch(gold.strip()):
            pred = option_in_prose(response)  # a letter gold: "I think it's B" states B
        if pred is None:
            return Verdict(False, "none", None)
        gold_ans = gold_answer(gold)
        verdict, stage = ctx.compare(pred, gold_ans, timeout_s)
        if not verdict and stage not in ("timeout", "budget"):
            # A gold set of n solutions, answered in n boxes that other text separates ("The
            # first root is \\boxed{-1}. The second root is \\boxed{3}."): the boxes are the set.
            joined = boxed_set(response, solution_count(gold_ans))
            if joined is not None and joined != pred:
                verdict, stage = ctx.compare(joined, gold_ans, timeout_s)
                pred = joined if verdict else pred
        return Verdict(verdict, stage, pred)

    def equivalent(self, ctx: GradingContext, pred: str, gold: str, timeout_s: float | None) -> bool:
        return ctx.compare(pred, gold, timeout_s)[0]


@GRADERS.register("math_verify")
class MathVerifyGrading:
    """Hugging Face math-verify alone (its extraction and comparison, as papers grade), in the worker."""

    needs: tuple[str, str] | None = ("math_verify", "math-verify>=0.9,<0.10")

    def check(self, ctx: GradingContext, response: str, gold: str, timeout_s: float | None) -> Verdict:
        reply = ctx.ask_worker({"mode": "math_verify", "response": response, "gold_raw": gold}, timeout_s)
        return Verdict(reply["equal"], reply["stage"], reply.get("pred"))

    def equivalent(self, ctx: GradingContext, pred: str, gold: str, timeout_s: float | None) -> bool:
        return ctx.ask_worker({"mode": "math_verify_pair", "pred": pred, "gold_raw": gold}, timeout_s)["equal"]


@GRADERS.register("boxed")
class BoxedGrading(BuiltinGrading):
    """Like builtin, but only a \\boxed{}/\\fbox{} answer counts (no prose, no bare answers)."""

    boxed_only = True


# ----------------------------------------------------------------------------- worker

_PKG_PARENT = str(Path(__file__).resolve().parents[2])  # the folder holding the envs package


def _symbolic_worker(startup_timeout_s: float) -> LineWorker:
    """The child that runs the sympy and math-verify stages (`python -m envs.grading._worker`),
    killed when a call overruns and started again at once, so the next call finds it warm."""

    def environment() -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": _PKG_PARENT + os.pathsep + os.environ.get("PYTHONPATH", "")}

    return LineWorker(
        ["envs.grading._worker"],
        environment,
        stderr=subprocess.DEVNULL,
        startup_timeout_s=startup_timeout_s,
        warm_restart=True,
    )


def _symbolic_reply(worker: LineWorker, request: dict, timeout_s: float) -> dict | None:
    """The worker's reply {"equal", "stage"[, "pred"]}, or None when it timed out or failed (then it
    is restarted)."""
    reply, _why = worker.call({**request, "timeout": timeout_s}, timeout_s)
    if reply is None:
        return None
    try:
        return {**reply, "equal": bool(reply["equal"]), "stage": str(reply.get("stage", "symbolic"))}
    except (KeyError, TypeError):
        worker.kill()  # out of step with the worker: start over rather than misread answers
        return None


# ----------------------------------------------------------------------------- grader

MAX_WORKER_CHARS = 2000  # longer answer pairs are compared by the in-process stages only
MAX_ANSWER_CHARS = 4000  # longer answer pairs are compared as whitespace-split text only
# The in-process comparison of one pair stops past this many seconds: what it has not decided by
# then goes to the worker (killed past its own bound), or, where the worker may not run, counts as
# not equal (stage "budget"). Every pattern it runs is linear or bounded by a length cap, so this
# is a backstop, not the rule; a real answer takes well under a millisecond.
IN_PROCESS_BUDGET_S = 0.25


class OverBudget(NeedSymbolic):
    """The in-process stage ran past `IN_PROCESS_BUDGET_S`: the worker decides, or nobody does."""


def _within(eq, deadline: float):
    """`eq` (a scalar or relation comparator) that raises OverBudget once `deadline` has passed."""

    def call(*args):
        if time.monotonic() > deadline:
            raise OverBudget("in-process grading budget spent")
        return eq(*args)

    return call


MAX_GOLD_CHARS = 300  # a longer gold is a worked solution (MATH's), not an answer: its answer is read


def gold_answer(gold: str) -> str:
    """The answer a gold states: all its boxes when it has several ("\\boxed{1} papers and
    \\boxed{2} bins" -> "1, 2"), its box, the final answer of a worked solution, else the gold."""
    if "\\boxed" in gold or "\\fbox" in gold:
        joined = boxed_set(gold, len(boxed_values(gold)))  # (None when words take a box back: "no no")
        return joined or extract_answer(gold) or gold
    if len(gold) > MAX_GOLD_CHARS and has_answer_line(gold):  # (a long formula stays whole)
        return extract_answer(gold) or gold
    return gold


class Grader:
    """Answer grader (one of GRADERS) with a bounded worker stage and a small result cache.

    mode: a name of GRADERS: "builtin" | "math_verify" | "boxed" (module docstring).
    timeout_s: hard wall-clock bound of the worker stage of one call (the worker is killed past it).
    symbolic: False compares with numbers and strings only (no worker process; builtin/boxed only).
    cache_size: remembered (pred, gold) verdicts; GRPO groups repeat the same answers a lot.
    startup_timeout_s: bound on starting the worker (importing sympy, math-verify), once per process.
    finer_decimals: the decimal rule's switch (module docstring): True accepts a decimal that states
        more digits than a rounded decimal gold and rounds to it; False demands the gold's value.
    stats: calls, symbolic_calls (worker calls), timeouts (worker calls that ran out of time), seconds (grading time).
    """

    def __init__(
        self,
        mode: str = "builtin",
        timeout_s: float = 3.0,
        symbolic: bool = True,
        cache_size: int = 8192,
        startup_timeout_s: float = 60.0,
        finer_decimals: bool = True,
    ) -> None:
        GRADERS.check(mode, "grader")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s={timeout_s!r}: must be > 0")
        self._grading: GradingMethod = GRADERS.get(mode)()
        if self._grading.needs is not None:
            import importlib.util

            module, requirement = self._grading.needs
            if importlib.util.find_spec(module) is None:
                raise ImportError(f"grader={mode!r} needs the {module} package: pip install '{requirement}'")
        self.mode = mode
        self.timeout_s = timeout_s
        self.symbolic = symbolic
        self.cache_size = cache_size
        self._finer_decimals = bool(finer_decimals)
        self._scalar_eq = partial(fast_scalar_eq, finer_decimals=self._finer_decimals)
        self._cache: OrderedDict[tuple[str, str], bool] = OrderedDict()
        self._lock = threading.Lock()
        self._worker = _symbolic_worker(startup_timeout_s)
        self.stats = {"calls": 0, "symbolic_calls": 0, "timeouts": 0, "seconds": 0.0}

    # -- public API
    def check(self, response: str, gold: str, *, timeout_s: float | None = None) -> GradeResult:
        """Grade one response; never raises, never hangs past the time bound."""
        t0 = time.perf_counter()
        verdict, stage, pred = self._grading.check(self, response, gold, timeout_s)
        seconds = time.perf_counter() - t0
        with self._lock:
            self.stats["seconds"] += seconds
        return GradeResult(bool(verdict), pred, stage == "timeout", seconds, stage)

    def grade(self, response: str, gold: str, *, timeout_s: float | None = None) -> bool:
        return self.check(response, gold, timeout_s=timeout_s).correct

    def equivalent(self, pred: str, gold: str, *, timeout_s: float | None = None) -> bool:
        """This grader's comparison of two extracted answers (maj@N groups answers with it):
        math-verify's own for `math_verify`, the builtin stages for `builtin` and `boxed`."""
        return self._grading.equivalent(self, pred, gold, timeout_s)

    def close(self) -> None:
        with self._lock:
            self._worker.kill()

    # -- the GradingContext a grader sees (envs.grading.protocol)
    @property
    def finer_decimals(self) -> bool:
        return self._finer_decimals

    def ask_worker(self, request: dict, timeout_s: float | None) -> dict:
        """One request to the bounded worker process (`GradingContext.ask_worker`)."""
        bound = timeout_s or self.timeout_s
        with self._lock:
            self.stats["symbolic_calls"] += 1
            res = _symbolic_reply(self._worker, {**request, "finer_decimals": self.finer_decimals}, bound)
            if res is None or res["stage"] == "timeout":
                self.stats["timeouts"] += 1
        if res is None or res["stage"] == "timeout":
            from loguru import logger  # rare path: keep the import off module load

            logger.warning(
                "grading timed out after {} s (counted as not equal): {!r}",
                bound,
                str(request.get("pred", request.get("response", "")))[-80:],
            )
            return {"equal": False, "stage": "timeout"}
        return res

    def compare(self, pred: str, gold: str, timeout_s: float | None) -> tuple[bool, str]:
        """The builtin stages on two extracted answers (`GradingContext.compare`, module docstring)."""
        deadline = time.monotonic() + IN_PROCESS_BUDGET_S
        with self._lock:
            self.stats["calls"] += 1
        if len(pred) + len(gold) > MAX_ANSWER_CHARS:  # junk, not an answer: spare the regex passes
            return pred.split() == gold.split(), "fast"
        try:
            # Both state a unit: the same quantity, or not equal ("10 m", "10 cm"); a unit on one
            # side only is dropped ("0.8 V" against "0.8": golds often omit units).
            units, pred, gold = compare_quantities(pred, gold, finer_decimals=self.finer_decimals)
            if units is not None:
                return units, "fast"
            if percent_rate_equal(pred, gold, finer_decimals=self.finer_decimals):
                return True, "fast"  # "25\\%" vs a plain rate "0.25" (the signs are gone after normalizing)
            p, g = normalize_answer(pred), normalize_answer(gold)
        except Exception:  # (defensive: normalization is regex-only) never crash the caller
            return False, "fast"
        key = (p, g)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key], "cache"
        stage = "fast"
        try:
            # A "not equal" here is final: the worker runs the same structure walk, and its
            # comparators defer to these fast ones wherever these decide.
            scalar_eq, relation_eq = _within(self._scalar_eq, deadline), _within(fast_relation_eq, deadline)
            verdict, escalate = compare_normalized(p, g, scalar_eq, relation_eq), False
        except OverBudget:
            verdict, escalate, stage = False, True, "budget"
        except NeedSymbolic:
            verdict, escalate = False, True
        except Exception as e:  # a grader bug must never crash training: count it as "not equal"
            from loguru import logger

            logger.warning("grading failed ({!r}); counted as not equal: {!r} vs {!r}", e, p[:80], g[:80])
            verdict, escalate = False, False
        if escalate and self.symbolic and len(pred) + len(gold) <= MAX_WORKER_CHARS:
            reply = self.ask_worker({"pred": p, "gold": g, "pred_raw": pred, "gold_raw": gold}, timeout_s)
            verdict, stage = reply["equal"], reply["stage"]
        if stage not in ("timeout", "budget"):  # a timeout may pass next time (a cold machine): not remembered
            with self._lock:
                if self.cache_size > 0:
                    self._cache[key] = verdict
                    if len(self._cache) > self.cache_size:
                        self._cache.popitem(last=False)
        return verdict, stage

    # The names graders called before the seam was public (kept for callers written against them).
    _equivalent = compare
    _ask_worker = ask_worker


_INSTANCES: dict[tuple[str, bool], Grader] = {}  # one per setting and process: its worker is a process resource
_INSTANCES_LOCK = threading.Lock()


def get_grader(mode: str = "builtin", *, finer_decimals: bool = True) -> Grader:
    """The process-wide grader of `mode` and decimal rule (created on first use, closed at exit)."""
    key = (mode, bool(finer_decimals))
    with _INSTANCES_LOCK:
        if key not in _INSTANCES:
            _INSTANCES[key] = Grader(mode, finer_decimals=finer_decimals)
            atexit.register(_INSTANCES[key].close)
        return _INSTANCES[key]


def grade_answer(
    response: str, gold: str, *, timeout_s: float | None = None, mode: str = "builtin", finer_decimals: bool = True
) -> bool:
    """True when the final answer of `response` is equivalent to `gold` (never hangs)."""
    return get_grader(mode, finer_decimals=finer_decimals).grade(response, gold, timeout_s=timeout_s)
