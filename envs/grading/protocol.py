"""The graders' seam: what a grader (an entry of `GRADERS`, `env.grader`) is, and what it may use.

    @GRADERS.register("mine")
    class MyGrading:                       # a GradingMethod
        needs = None                       # or (module, pip requirement) it cannot run without
        def check(self, ctx: GradingContext, response, gold, timeout_s) -> Verdict: ...
        def equivalent(self, ctx: GradingContext, pred, gold, timeout_s) -> bool: ...

A grader sees the process-wide `Grader` only through `GradingContext`: the builtin comparison of
two extracted answers (`compare`: units, normalization, the structure walk, the bounded worker;
what `answers_equivalent` runs) and a request to the bounded worker process (`ask_worker`). Both
are public and never hang past their time bound; the `Grader` keeps the cache, the worker and the
statistics to itself.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol, runtime_checkable

__all__ = ["GradingContext", "GradingMethod", "Verdict"]


class Verdict(NamedTuple):
    """A grader's verdict on one response (a tuple, so `correct, stage, pred = ...` reads it)."""

    correct: bool
    stage: str  # fast | cache | symbolic | math_verify | timeout | none | budget
    pred: str | None  # the answer the grader read from the response (None: it found none)


@runtime_checkable
class GradingContext(Protocol):
    """What a grader may use of the `Grader` that runs it."""

    @property
    def finer_decimals(self) -> bool:
        """The decimal rule's switch (`envs.grading.numbers.numbers_equal`)."""
        ...

    def compare(self, pred: str, gold: str, timeout_s: float | None) -> tuple[bool, str]:
        """The builtin stages on two extracted answers: (equal, the stage that decided)."""
        ...

    def ask_worker(self, request: dict, timeout_s: float | None) -> dict:
        """One request to the worker process (`envs/grading/_worker.py`): its reply
        {"equal", "stage"[, "pred"]}, or {"equal": False, "stage": "timeout"} past the bound."""
        ...


@runtime_checkable
class GradingMethod(Protocol):
    """An entry of `GRADERS`: grades a response, and compares two extracted answers (maj@N)."""

    needs: tuple[str, str] | None  # (module, pip requirement) this grader cannot run without

    def check(self, ctx: GradingContext, response: str, gold: str, timeout_s: float | None) -> Verdict: ...

    def equivalent(self, ctx: GradingContext, pred: str, gold: str, timeout_s: float | None) -> bool: ...
