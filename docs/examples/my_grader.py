"""A grader of one's own: how a final answer is extracted and compared with the gold one.

    stare-train --plugin docs/examples/my_grader.py env.grader=last_number

A grader is a class registered in `envs.grading.GRADERS`; `envs.grading.Grader(name)` builds it
and calls its `check(grader, response, gold, timeout_s) -> (correct, stage, pred)`: `response` is
the model's text (interpreter output removed), `stage` a short label of what decided (logged as
grade_stage), `pred` the extracted answer or None (maj@N votes over it). `equivalent(grader, pred,
gold, timeout_s)` says whether two extracted answers are the same (maj@N groups answers with it);
`needs` names a (module, pip requirement) the grader cannot run without, or None. `grader` is the
calling `Grader` (its worker, cache and settings), for graders that reuse the builtin stages.
"""

from __future__ import annotations

import re

from envs.grading import GRADERS

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@GRADERS.register("last_number")
class LastNumberGrading:
    """The last number written in the response, compared numerically with the gold answer."""

    needs = None  # nothing to install

    def check(self, grader, response: str, gold: str, timeout_s: float | None) -> tuple[bool, str, str | None]:
        numbers = _NUMBER.findall(response)
        pred = numbers[-1] if numbers else None
        try:
            correct = pred is not None and float(pred) == float(gold)
        except ValueError:  # a gold that is no number
            correct = pred == gold.strip()
        return correct, "last_number", pred

    def equivalent(self, grader, pred: str, gold: str, timeout_s: float | None) -> bool:
        return self.check(grader, pred, gold, timeout_s)[0]
