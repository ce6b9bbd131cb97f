"""scripts/study/study_neutral_choice.py: the code-style classifier and the per-step choice numbers."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "study"))

from study_neutral_choice import choice_stats, code_style  # noqa: E402

from envs.arithmetic import tool_turn  # noqa: E402

OBS = "\n<interpreter>\n287663\n</interpreter>\n\\boxed{287663}<|im_end|>"
PROBLEM = {"expr": "347*829"}


@pytest.mark.parametrize(
    ("text", "style"),
    [
        (tool_turn(PROBLEM, "print") + OBS, "print"),
        (tool_turn(PROBLEM, "assign") + OBS, "assign"),
        # the model may name its variable otherwise: still the assign style
        ("<code>\n```python\ny = 347*829\nprint(y)\n```\n</code>" + OBS, "assign"),
        # a name printed that was not the one bound, two statements, or prose: neither style
        ("<code>\n```python\nx = 347*829\nprint(y)\n```\n</code>" + OBS, "other"),
        ("<code>\n```python\nx = 347*829\ny = x\nprint(y)\n```\n</code>", "other"),
        ("<code>\n```python\n347*829\n```\n</code>", "other"),
        ("347*829 = 287663\n\\boxed{287663}<|im_end|>", None),
        # only the first code block counts
        (tool_turn(PROBLEM, "assign") + OBS + tool_turn(PROBLEM, "print"), "assign"),
    ],
)
def test_code_style(text, style):
    assert code_style(text) == style


def test_choice_stats_counts_tool_responses_only():
    def row(style, correct, tool_calls=1):
        text = tool_turn(PROBLEM, style) + OBS if style else "287663\n\\boxed{287663}"
        return {"text": text, "tool_calls": tool_calls, "correct": correct}

    rows = [row("print", True)] * 3 + [row("assign", True), row("assign", False), row(None, False, 0)]
    rows.append({"text": tool_turn(PROBLEM, "print"), "tool_calls": 0, "correct": False})  # a block never run
    s = choice_stats(rows)
    assert (s["n"], s["n_tool"], s["n_print"], s["n_assign"], s["n_other"]) == (7, 5, 3, 2, 0)
    assert s["assign_share"] == pytest.approx(0.4) and s["minority_share"] == pytest.approx(0.4)
    assert s["choice_entropy"] == pytest.approx(-(0.4 * math.log(0.4) + 0.6 * math.log(0.6)))
    assert (s["acc_print"], s["acc_assign"]) == (1.0, 0.5)
    collapsed = choice_stats([row("print", True)] * 4)
    assert collapsed["minority_share"] == 0.0 and collapsed["choice_entropy"] == 0.0
    assert choice_stats([row(None, True, 0)])["choice_entropy"] is None


def test_linear_drift_of_a_line_and_of_a_flat_series():
    from study_neutral_choice import linear_drift

    drift, se = linear_drift([0.5 - 0.01 * i for i in range(11)])
    assert drift == pytest.approx(-0.1) and se == pytest.approx(0.0, abs=1e-12)
    flat, flat_se = linear_drift([0.5, 0.52, 0.48, None, 0.5, 0.5])
    assert abs(flat) < 0.03 and flat_se > 0
    assert linear_drift([0.5, None]) == (None, None)
