"""env.reward: a user's plain reward function replaces the grader; a raising or hanging one is
bounded and counted, never a crash."""

from __future__ import annotations

import sys
import textwrap
import time

import pytest

from envs.retool import RetoolConfig, RetoolEnv
from envs.reward import RewardFunction, interpret, load_reward_fn

REWARDS = """
import time


def exact(response_text, sample):
    return 1.0 if "\\\\boxed{" + sample["answer"] + "}" in response_text else -1.0


def rich(response_text, sample):
    return {"reward": 0.5, "correct": True, "pred": "42", "source": sample.get("source")}


def raises(response_text, sample):
    raise KeyError("no such field")


def hangs(response_text, sample):
    while True:
        time.sleep(0.01)


def not_a_number(response_text, sample):
    return "yes"


def prints(response_text, sample):
    print("a stray print must not break the protocol")
    return -0.25
"""


@pytest.fixture(scope="module")
def module(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rewards")
    (folder / "user_rewards.py").write_text(textwrap.dedent(REWARDS))
    sys.path.insert(0, str(folder))
    yield "user_rewards"
    sys.path.remove(str(folder))
    sys.modules.pop("user_rewards", None)


SAMPLE = {"id": "p1", "problem": "6*7?", "answer": "42", "source": "mine"}


def env_with(spec: str, timeout: float = 5.0, **kw) -> RetoolEnv:
    cfg = RetoolConfig(reward=spec, reward_timeout_s=timeout, **kw)
    return RetoolEnv(SAMPLE, None, cfg, RewardFunction(spec, timeout))


def test_a_float_reward_replaces_the_grader(module):
    env = env_with(f"{module}:exact")
    r, info = env.reward("so \\boxed{42}")
    assert r == 1.0 and info["correct"] and info["grade_stage"] == "reward_fn" and info["gold"] == "42"
    r, info = env.reward("<interpreter>\n\\boxed{42}\n</interpreter> so \\boxed{41}")  # tool output is not the model's
    assert r == -1.0 and not info["correct"] and not info["grade_error"] and not info["grade_timeout"]


def test_a_dict_reward_gives_correct_pred_and_extra_values(module):
    r, info = env_with(f"{module}:rich").reward("anything")
    assert r == 0.5 and info["correct"] and info["pred"] == "42" and info["reward_extra"] == {"source": "mine"}


def test_format_penalty_still_applies(module):
    r, _ = env_with(f"{module}:exact", format_penalty=0.5).reward("<code>\nprint(1)\n")  # unclosed code, no answer
    assert r == -1.5


@pytest.mark.parametrize(
    "name,error,counter",
    [
        ("raises", "raised KeyError: 'no such field'", "grade_error"),
        ("not_a_number", "returned str 'yes', not a number", "grade_error"),
        ("hangs", "timed out after 1.0 s (env.reward_timeout_s)", "grade_timeout"),
    ],
)
def test_a_failing_reward_function_is_graded_wrong_and_counted(module, name, error, counter, capfd):
    env = env_with(f"{module}:{name}", timeout=1.0)
    start = time.monotonic()
    r, info = env.reward("\\boxed{42}")
    assert time.monotonic() - start < 5.0  # bounded
    assert r == RetoolConfig().reward_wrong and not info["correct"] and info[counter]
    assert info["reward_error"] == error
    # the worker serves the next call (a hung one was replaced)
    assert env_with(f"{module}:exact").reward("\\boxed{42}")[0] == 1.0
    env.reward_fn.close()


def test_a_function_that_prints_keeps_the_protocol(module):
    fn = RewardFunction(f"{module}:prints", 5.0)
    assert [fn("x", SAMPLE).reward for _ in range(3)] == [-0.25] * 3
    fn.close()


def test_a_hard_hang_in_c_code_is_killed_at_the_hard_bound(module, tmp_path):
    (tmp_path / "c_hang.py").write_text(
        "import signal\ndef f(t, s):\n    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])\n    while True: pass\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        fn = RewardFunction("c_hang:f", 0.5)
        start = time.monotonic()
        got = fn("x", SAMPLE)
        assert got.timed_out and got.reward is None and time.monotonic() - start < 5.0
        fn.close()
    finally:
        sys.path.remove(str(tmp_path))


@pytest.mark.parametrize(
    "spec,message",
    [
        ("no_colon", "reward='no_colon': expected MODULE:FUNCTION"),
        ("no_such_module_xyz:f", "reward='no_such_module_xyz:f': module 'no_such_module_xyz' cannot be imported"),
        ("json:nope", "reward='json:nope': json has no 'nope'"),
    ],
)
def test_a_bad_spec_is_refused_when_the_config_is_built(spec, message):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(")):
        load_reward_fn(spec)
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(")):
        RetoolConfig(reward=spec)


def test_interpret_rejects_what_is_no_reward():
    assert interpret(True).error and interpret(float("nan")).error and interpret({"correct": True}).error
    assert interpret(3).reward == 3.0 and interpret(3).correct and not interpret(-1).correct
    assert interpret({"reward": -1, "correct": True}).correct  # the function's own verdict wins


def test_a_dataset_without_gold_answers_reaches_the_reward_function_whole(tmp_path):
    """fields={"answer": ""}: rows without an answer column load (answer ""), every other column
    kept for the reward function; a grader-only config refuses such data."""
    import json

    from envs.data import load_problems

    path = tmp_path / "tests.jsonl"
    rows = [{"prompt": "Write f(x) = 2x.", "tests": ["assert f(2) == 4"]}, {"prompt": "Write g.", "tests": []}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    problems = load_problems(str(path), fields={"problem": "prompt", "answer": ""})
    assert [p["answer"] for p in problems] == ["", ""] and problems[0]["tests"] == ["assert f(2) == 4"]
    assert problems[0]["problem"] == "Write f(x) = 2x." and "prompt" not in problems[0]

    from stare_tir.config import ConfigError, resolve_config
    from stare_tir.train_config import TrainConfig

    with pytest.raises(ConfigError, match=r"^data.fields.answer='' \(rows without a gold answer\) with no env.reward"):
        resolve_config(TrainConfig, {"data": {"fields": {"answer": ""}}})
    cfg = resolve_config(TrainConfig, {"data": {"fields": {"answer": ""}}, "env": {"reward": "json:dumps"}})
    assert cfg.env.reward == "json:dumps"
