"""Extending without forking: a user's module (`--plugin`, the config's `plugins`) and reward function
(`env.reward`) are used by name, with no library file edited; mistakes are one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = {
    "train": ROOT / "scripts" / "train_tir.py",
    "sft": ROOT / "scripts" / "sft_coldstart.py",
    "eval": ROOT / "scripts" / "eval_aime.py",
}

# A user's module, outside the repository: a token method (a plain function registered with its
# settings) and a reward function.
USER_MODULE = """
from dataclasses import dataclass

from stare_tir.algos.token_methods import TOKEN_METHODS, TokenEffect, TokenInputs


@dataclass
class MyCfg:
    # Factor on positive advantages.
    scale: float = 2.0


@TOKEN_METHODS.register("my_pos_scale", config=MyCfg)
def my_pos_scale(t: TokenInputs, cfg: MyCfg) -> TokenEffect:
    positive = t.advantages > 0
    return TokenEffect(selected=positive, advantages=t.advantages * (1.0 + (cfg.scale - 1.0) * positive.float()))


def parity(response_text: str, sample: dict) -> float:
    assert "answer" in sample and "problem" in sample
    return 1.0 if len(response_text) % 2 else -1.0
"""

# The tiny-run budgets of tests/trainer/test_trainer_e2e.py, without its SFT stage: the reward
# function differs inside groups by itself.
FAST = [
    "sft.enabled=false",
    "data.arithmetic_train_size=200",
    "data.arithmetic_eval_size=8",
    "trainer.prompts_per_step=4",
    "rollout.n_per_prompt=4",
    "rollout.max_total_tokens=64",
    "rollout.max_new_tokens_per_turn=40",
    "trainer.eval_every=0",
    "trainer.save_every=1",
    "algo.dynamic_sampling_rounds=2",
]


def run(script: str, *args: str, cwd: Path = ROOT, timeout: int = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, str(SCRIPTS[script]), *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env
    )


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


@pytest.fixture
def user_module(tmp_path) -> Path:
    path = tmp_path / "mylab_plugin.py"
    path.write_text(textwrap.dedent(USER_MODULE))
    return path


# ---------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "override,key,registry",
    [
        ("trainer.backend=vllm", "trainer.backend='vllm'", ("stare_tir.rollout.backends.base", "ROLLOUT_BACKENDS")),
        ("env.grader=strict", "env.grader='strict'", ("envs.grading", "GRADERS")),
        ("sandbox.backend=gpu", "sandbox.backend='gpu'", ("sandbox", "SANDBOX_BACKENDS")),
    ],
)
def test_an_unknown_name_prints_its_key_once(tmp_path, monkeypatch, capsys, override, key, registry):
    import importlib

    from stare_tir.app.cli import train_main

    reg = getattr(importlib.import_module(registry[0]), registry[1])
    monkeypatch.chdir(tmp_path)
    assert train_main([f"trainer.run_dir={tmp_path / 'run'}", override]) == 2
    err = capsys.readouterr().err
    assert error_lines(err) == [f"error: {key}: unknown {reg.kind}; choose one of {', '.join(reg.names())}"], err
    assert "Traceback" not in err and "preflight" not in err


def test_the_eval_backend_key_is_printed_once(tmp_path, capsys):
    from stare_tir.app.cli import eval_main
    from stare_tir.rollout.backends.base import ROLLOUT_BACKENDS

    assert eval_main(["model.path=tiny", "backend=vllm", f"out_dir={tmp_path}"]) == 2
    names = ", ".join(ROLLOUT_BACKENDS.names())
    assert error_lines(capsys.readouterr().err) == [
        f"error: backend='vllm': unknown rollout backend; choose one of {names}"
    ]


def test_an_unknown_key_is_reported_without_a_preflight_ok_first(tmp_path, monkeypatch, capsys):
    from loguru import logger

    from stare_tir.app.cli import train_main

    sink = logger.add(sys.stderr, level="INFO")
    monkeypatch.chdir(tmp_path)
    try:
        assert train_main([f"trainer.run_dir={tmp_path / 'run'}", "trainer.stepz=3"]) == 2
    finally:
        logger.remove(sink)
    err = capsys.readouterr().err
    assert "unknown key 'trainer.stepz'" in err and "ok" not in err.split("unknown key")[0], err
    assert "preflight:" not in err


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_a_misspelled_plugin_is_one_line(script, tmp_path):
    args = ["--plugin", "mylab.methds", "--print-config"] + (["model.path=tiny"] if script == "eval" else [])
    r = run(script, *args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert error_lines(r.stderr) == [
        "error: plugin 'mylab.methds' cannot be imported (ModuleNotFoundError: No module named 'mylab'); install "
        "it, put its directory on PYTHONPATH, or pass the path of its .py file"
    ], r.stderr
    assert "Traceback" not in r.stderr


def test_a_plugin_that_raises_while_importing_is_one_line(tmp_path):
    bad = tmp_path / "broken_plugin.py"
    bad.write_text("raise RuntimeError('half-written\\nsecond line')\n")
    r = run("train", "--plugin", str(bad), "--print-config", cwd=tmp_path)
    assert r.returncode == 2 and error_lines(r.stderr) == [
        f"error: plugin {str(bad)!r} cannot be imported (RuntimeError: half-written)"
    ], r.stderr


def test_a_misspelled_reward_function_is_one_line(tmp_path, user_module):
    r = run("train", "--plugin", str(user_module), "--print-config", "env.reward=mylab_plugin:parity2", cwd=tmp_path)
    assert r.returncode == 2
    assert error_lines(r.stderr) == ["error: env.reward='mylab_plugin:parity2': mylab_plugin has no 'parity2'"]


# --------------------------------------------------------------------------- plugins and config


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_a_plugins_settings_are_keys_in_help(script, user_module):
    out = run(script, "--plugin", str(user_module), "--help").stdout
    assert "--plugin MODULE" in out
    if script != "eval":
        assert "algo.my_pos_scale.scale=2.0  # Factor on positive advantages." in out
        assert "my_pos_scale]" in out  # among algo.token_methods' names


def test_plugins_in_a_yaml_are_imported_before_its_sections_are_validated(tmp_path, user_module):
    cfg = tmp_path / "mine.yaml"
    cfg.write_text(
        f"plugins: [{user_module}]\nalgo:\n  name: my_pos_scale\n  my_pos_scale: {{scale: 3.0}}\n"
        "env:\n  reward: mylab_plugin:parity\n"
    )
    r = run("train", "--config", str(cfg), "--print-config", "algo.my_pos_scale.scale=4", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"plugins:\n- {user_module}\n" in r.stdout and "scale: 4.0" in r.stdout
    assert "token_methods:\n  - my_pos_scale" in r.stdout and "reward: mylab_plugin:parity" in r.stdout
    # --plugin adds to the file's list (saved with it); a plugin named twice is imported once
    r = run("train", "--config", str(cfg), "--plugin", str(user_module), "--plugin", "json", "--print-config")
    assert r.returncode == 0 and f"plugins:\n- {user_module}\n- json\n" in r.stdout, r.stderr


def test_plugins_survive_the_config_round_trip(tmp_path, user_module):
    code = (
        "import sys; from stare_tir.config import load_config, save_config; from stare_tir.train_config import "
        f"TrainConfig; c = load_config(TrainConfig, None, ['plugins=[{user_module}]', 'algo.name=my_pos_scale']); "
        f"save_config(c, '{tmp_path}/config.yaml'); print(c.algo.token_methods, c.plugins)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip() == f"['my_pos_scale'] ['{user_module}']", r.stderr
    code = (
        "from stare_tir.config import load_config; from stare_tir.train_config import TrainConfig; "
        f"print(load_config(TrainConfig, '{tmp_path}/config.yaml').algo.methods['my_pos_scale'])"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip() == "MyCfg(scale=2.0)", r.stderr  # imported from the file's list


# ----------------------------------------------------------------------------------- end to end


def metric_rows(run_dir: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows if "entropy/batch" in r}


@pytest.mark.slow
def test_a_users_method_and_reward_train_and_resume_with_no_library_edit(tmp_path, user_module):
    """The issue's acceptance: a method and a reward function in the user's own file train two tiny
    CPU steps, the method's metrics are logged under its name, and --resume imports the plugin again
    from config.yaml."""
    run_dir = tmp_path / "run"
    common = [f"trainer.run_dir={run_dir}", *FAST, "algo.name=my_pos_scale", "env.reward=mylab_plugin:parity"]
    r = run("train", "--plugin", str(user_module), *common, "trainer.steps=2", cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = metric_rows(run_dir)
    assert sorted(rows) == [1, 2]
    for row in rows.values():
        assert "algo/my_pos_scale/selected_frac" in row and 0.0 <= row["algo/my_pos_scale/selected_frac"] <= 1.0
        assert row["grade/error_rate"] == 0.0 and row["grade/timeout_rate"] == 0.0
    assert any(row["algo/my_pos_scale/selected_frac"] > 0 for row in rows.values())
    saved = (run_dir / "config.yaml").read_text()
    assert f"plugins:\n- {user_module}\n" in saved and "reward: mylab_plugin:parity" in saved

    # --resume without --plugin: config.yaml brings the plugin back (one more step)
    r = run("train", "--resume", f"trainer.run_dir={run_dir}", "trainer.steps=3", "--accept-changes", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = metric_rows(run_dir)
    assert sorted(rows) == [1, 2, 3] and "algo/my_pos_scale/selected_frac" in rows[3]
