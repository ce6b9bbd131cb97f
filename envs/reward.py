"""A user's reward function in place of the grader: `env.reward=package.module:function`.

The function is plain Python, as TRL's `reward_funcs` are:

    def my_reward(response_text: str, sample: dict) -> float:            # or -> dict
        return 1.0 if sample["answer"] in response_text else -1.0

response_text: what the model wrote (interpreter output removed, as the grader sees it); sample: the
problem's row as the data loader read it ({"id", "problem", "answer", ...the row's other fields},
envs/data.py; a dataset's own columns come through, whatever its field mapping). It returns the
reward, or a dict with a "reward" key and optionally "correct" (bool; default: reward > 0, what
evaluation's accuracy counts), "pred" (the extracted answer, for maj@N and the samples) and any
other values (kept in the trajectory's info). It replaces the grader for training rewards and for
evaluation's correctness alike; `env.format_penalty` still applies on top.

Bounded like the grader's symbolic stage (envs/grading/_worker.py): the function runs in a child
process (`python -m envs.reward SPEC`, one per environment factory, started on first use) under a
soft SIGALRM bound, and the parent kills it at the hard bound (`env.reward_timeout_s`) and starts
another. A function that raises, hangs, or returns something else than a number or such a dict
never fails the step: the trajectory gets `env.reward_wrong`, `grade_error` (or `grade_timeout`)
is set in its info, counted in grade/error_rate (grade/timeout_rate), and one log line says why.
The request and reply travel as JSON: the sample's values must be JSON-representable (a JSONL or
parquet row is; others are sent as their `str`).
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from loguru import logger

from envs.line_worker import LineWorker

RewardFn = Callable[[str, dict], Any]

# Seconds a new worker may take to import the function's module before the call counts as failed.
STARTUP_TIMEOUT_S = 60.0


def load_reward_fn(spec: str) -> RewardFn:
    """The callable `spec` ("package.module:function") names; ValueError (one line) otherwise."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"reward={spec!r}: expected MODULE:FUNCTION, e.g. mylab.rewards:exact_match")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - any failure of a user's module is one line
        cause = (str(e).strip().splitlines() or [""])[0]
        raise ValueError(
            f"reward={spec!r}: module {module_name!r} cannot be imported ({type(e).__name__}: {cause}); put it on "
            "PYTHONPATH or name its file in `plugins`"
        ) from None
    fn = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise ValueError(f"reward={spec!r}: {module_name} has no {attr!r}")
    if not callable(fn):
        raise ValueError(f"reward={spec!r}: {attr} is not callable")
    return fn  # type: ignore[return-value]


@dataclass
class RewardResult:
    """What one call gave: the reward and verdict, or `error` (then `reward` is None)."""

    reward: float | None
    correct: bool = False
    pred: str | None = None
    extra: dict = field(default_factory=dict)
    error: str = ""
    timed_out: bool = False
    seconds: float = 0.0


def interpret(value: Any) -> RewardResult:
    """A function's return value as a RewardResult (an unusable one as an error)."""
    if isinstance(value, dict):
        if "reward" not in value:
            return RewardResult(None, error=f"returned a dict without a 'reward' key: {sorted(value)}")
        extra = {k: v for k, v in value.items() if k not in ("reward", "correct", "pred")}
        result = interpret(value["reward"])
        if result.error:
            return result
        result.extra = extra
        if "correct" in value:
            result.correct = bool(value["correct"])
        if value.get("pred") is not None:
            result.pred = str(value["pred"])
        return result
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return RewardResult(None, error=f"returned {type(value).__name__} {value!r:.80}, not a number")
    reward = float(value)
    if reward != reward or reward in (float("inf"), float("-inf")):
        return RewardResult(None, error=f"returned {reward}, not a finite number")
    return RewardResult(reward, correct=reward > 0)


class RewardFunction:
    """`spec`'s function, called in a child process with a hard time bound (see the module docstring).

    One call at a time (the rollout engine calls rewards from its one event loop thread)."""

    def __init__(self, spec: str, timeout_s: float) -> None:
        load_reward_fn(spec)  # fail at start, in this process, with one line
        self.spec, self.timeout_s = spec, timeout_s

        def environment() -> dict[str, str]:  # plugins' directories too
            return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}

        # stderr inherited: the function's own prints and tracebacks reach the run's log
        self.worker = LineWorker(["envs.reward", spec], environment, stderr=None, startup_timeout_s=STARTUP_TIMEOUT_S)

    def __call__(self, response_text: str, sample: dict) -> RewardResult:
        start = time.monotonic()
        reply = self._call({"text": response_text, "sample": sample})
        seconds = time.monotonic() - start
        if reply is None:
            result = RewardResult(None, error=f"no answer within env.reward_timeout_s={self.timeout_s}", timed_out=True)
        elif "error" in reply:
            result = RewardResult(None, error=str(reply["error"]), timed_out=bool(reply.get("timeout")))
        else:
            result = interpret(reply.get("value"))
        result.seconds = seconds
        if result.error:
            logger.warning(f"reward function {self.spec} on problem {sample.get('id')!r}: {result.error}")
        return result

    def close(self) -> None:
        self.worker.kill()

    def _call(self, request: dict) -> dict | None:
        """The worker's reply; None when it overran the bound (the soft bound inside fires first)."""
        reply, why = self.worker.call({**request, "timeout": self.timeout_s}, self.timeout_s + 1.0)
        if reply is not None or why == "timeout":
            return reply
        if why.startswith("start: "):
            return {"error": f"cannot start the reward worker: {why.removeprefix('start: ')}"}
        if why == "not ready":
            return {"error": "the reward worker did not start (its module failed to import? see the log)"}
        if why.startswith("gone: "):
            return {"error": f"the reward worker is gone ({why.removeprefix('gone: ')})"}
        return {"error": "the reward worker's answer was unreadable"}


class _Timeout(BaseException):
    pass


def _on_alarm(signum: int, frame: Any) -> None:
    raise _Timeout()


def main(spec: str) -> None:
    """The worker: import the function, then answer one JSON request per line."""
    out, sys.stdout = sys.stdout, sys.stderr  # the function's prints must not corrupt the protocol
    fn = load_reward_fn(spec)
    signal.signal(signal.SIGALRM, _on_alarm)
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        try:
            req = json.loads(line)
            signal.setitimer(signal.ITIMER_REAL, max(0.05, float(req.get("timeout", 10.0))))
            reply: dict = {"value": fn(str(req["text"]), dict(req["sample"]))}
        except _Timeout:
            reply = {"error": f"timed out after {req.get('timeout')} s (env.reward_timeout_s)", "timeout": True}
        except Exception as e:  # noqa: BLE001 - the function's failure is an answer, not the worker's end
            cause = (str(e).strip().splitlines() or [""])[0]
            reply = {"error": f"raised {type(e).__name__}: {cause}"}
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        try:
            text = json.dumps(reply, default=str)
        except ValueError as e:
            text = json.dumps({"error": f"returned something not JSON-representable ({e})"})
        out.write(text + "\n")
        out.flush()


if __name__ == "__main__":
    main(sys.argv[1])
