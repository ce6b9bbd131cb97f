"""A reward function of one's own, in place of the grader:

    stare-train --plugin docs/examples/my_reward.py env.reward=my_reward:exact_answer
    stare-eval  --plugin docs/examples/my_reward.py env.reward=my_reward:exact_answer model.path=...

A plain function `(response_text, sample) -> float`, or a dict with "reward" (and "correct",
"pred", anything else). `sample` is the problem's row: "id", "problem", "answer" and the row's other
fields. It runs in a worker process bounded by env.reward_timeout_s: raising or hanging costs the
trajectory env.reward_wrong and counts in grade/error_rate (grade/timeout_rate), never the step.
"""

from __future__ import annotations

import re

_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def exact_answer(response_text: str, sample: dict) -> dict:
    """+1 when the last \\boxed{} holds exactly the gold answer, -1 otherwise."""
    found = _BOXED.findall(response_text)
    pred = found[-1].strip() if found else None
    correct = pred is not None and pred == str(sample["answer"]).strip()
    return {"reward": 1.0 if correct else -1.0, "correct": correct, "pred": pred, "boxed_count": len(found)}


def length_parity(response_text: str, sample: dict) -> float:
    """A toy reward that differs inside most groups (for smoke runs): +1 for an odd length."""
    return 1.0 if len(response_text) % 2 else -1.0
