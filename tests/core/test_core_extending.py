"""docs/extending.md's worked examples (docs/examples/) do what the page says: each extension point
from a file of one's own, imported as a plugin, selectable by name, its settings keys.

Each runs in its own process: what a plugin registers stays out of this test process's registries.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "docs" / "examples").glob("*.py"))
PLUGINS = [arg for path in EXAMPLES for arg in ("--plugin", str(path.relative_to(ROOT)))]


def python(code: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, *args] if not code else [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
        env=env,
    )


def test_the_page_names_every_example_and_the_examples_exist():
    page = (ROOT / "docs" / "extending.md").read_text()
    assert len(EXAMPLES) >= 4
    for path in EXAMPLES:
        assert f"examples/{path.name}" in page, path.name


def test_every_example_is_selected_by_name_with_its_settings():
    selections = [
        "algo.name=my_pos_scale",
        "algo.my_pos_scale.scale=1.5",
        "algo.advantage=rank",
        "algo.policy_loss=plain_pg",
        "env.grader=last_number",
        "env.reward=my_reward:exact_answer",
        "trainer.backend=canned",
        "rollout.canned.text=hello",
        "sandbox.backend=subprocess",
        "sandbox.subprocess.python=python3",
    ]
    r = python("", str(ROOT / "scripts" / "train_tir.py"), *PLUGINS, "--print-config", *selections)
    assert r.returncode == 0, r.stderr
    for text in (
        "name: my_pos_scale",
        "scale: 1.5",
        "advantage: rank",
        "policy_loss: plain_pg",
        "grader: last_number",
        "reward: my_reward:exact_answer",
        "backend: canned",
        "text: hello",
        "backend: subprocess",
        "python: python3",
    ):
        assert text in r.stdout, text
    help_text = python("", str(ROOT / "scripts" / "train_tir.py"), *PLUGINS, "--help").stdout
    for key in ("algo.my_pos_scale.scale=", "rollout.canned.text=", "sandbox.subprocess.python="):
        assert key in help_text, key
    for listed in ("| rank]", "| plain_pg]", "| last_number]", "| canned]", "| subprocess]"):
        assert listed in help_text, listed


def test_every_example_works():
    code = """
    import asyncio
    import torch
    from stare_tir.plugins import import_plugins

    import_plugins(%r)

    from stare_tir.algos.token_methods import TOKEN_METHODS, TokenInputs
    cfg = TOKEN_METHODS.config_of("my_pos_scale")(scale=3.0)
    t = TokenInputs(logprobs=torch.zeros(4), entropy=torch.ones(4), advantages=torch.tensor([1.0, -1.0, 0.0, 2.0]))
    e = TOKEN_METHODS.get("my_pos_scale")(t, cfg)
    assert e.advantages.tolist() == [3.0, -1.0, 0.0, 6.0] and e.selected.tolist() == [True, False, False, True]

    from stare_tir.algos.advantage import ADVANTAGE_ESTIMATORS
    adv, _ = ADVANTAGE_ESTIMATORS.get("rank")(torch.tensor([1.0, 0.0, 0.5, 3.0, 3.0]), torch.tensor([0, 0, 0, 1, 1]))
    assert adv.tolist() == [1.0, -1.0, 0.0, 0.0, 0.0], adv

    from stare_tir.algos.policy_loss import POLICY_LOSSES, LossInputs
    lp = torch.zeros(2, 3, requires_grad=True)
    x = LossInputs(lp, torch.zeros(2, 3), torch.tensor([[1.0] * 3, [-1.0] * 3]), torch.tensor([[1, 1, 0], [1, 0, 0]]))
    loss, _ = POLICY_LOSSES.get("plain_pg")(x)
    loss.backward()
    assert abs(float(loss) - (-1.0 / 3)) < 1e-6 and lp.grad is not None

    from envs.grading import Grader
    g = Grader("last_number", symbolic=False)
    assert g.grade("41, then 42", "42") and not g.grade("42, then 41", "42")

    from envs.reward import load_reward_fn
    got = load_reward_fn("my_reward:exact_answer")("so \\\\boxed{42}", {"answer": "42"})
    assert got["reward"] == 1.0 and got["correct"] and got["pred"] == "42", got

    from sandbox import SandboxConfig, SyncSandbox
    cfg = SandboxConfig(backend="subprocess", limits={"wall_time_s": 1.0, "max_output_bytes": 256})
    with SyncSandbox(cfg) as box:
        assert "isolation" in box.sandbox.info["not_enforced"]
        r = box.run("print(6 * 7)")
        assert r.status == "ok" and r.stdout == "42\\n", r
        r = box.run("raise ValueError('x')")
        assert r.status == "error" and r.exit_code == 1 and r.stderr.strip().endswith("ValueError: x"), r
        r = box.run("while True: pass")
        assert r.status == "timeout", r
        r = box.run("print('y' * 1000)")
        assert r.stdout_truncated and len(r.stdout) == 256, r
    from stare_tir.app.preflight import check_sandbox
    assert check_sandbox(SandboxConfig(backend="subprocess"))["backend"] == "subprocess"  # the start-up check

    from stare_tir.components import make_backend
    from stare_tir.rollout.backends.base import SamplingParams
    from stare_tir.rollout.engine import RolloutConfig
    tok = lambda text, add_special_tokens=False: {"input_ids": [ord(c) for c in text]}
    back = make_backend("canned", "no/model", tok, RolloutConfig(backends={"canned": {"text": "hi"}}))
    gen = asyncio.run(back.generate([1], SamplingParams(max_new_tokens=1), []))
    assert gen.token_ids == [104] and gen.finish_reason == "length"
    gen = asyncio.run(back.generate([1], SamplingParams(max_new_tokens=8), []))
    assert gen.token_ids == [104, 105] and gen.finish_reason == "eos"
    print("ok")
    """ % [str(p) for p in EXAMPLES]
    r = python(code)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_each_example_imports_on_its_own_without_torch(path):
    r = python(
        f"import sys; from stare_tir.plugins import import_plugins; import_plugins([{str(path)!r}]); "
        "print('torch' in sys.modules)"
    )
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr
