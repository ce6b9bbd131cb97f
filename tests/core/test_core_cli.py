"""The three entry points share one convention; a user's mistake ends in one line, not a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stare_tir.algos.policy_loss import POLICY_LOSSES

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = {
    "train": ROOT / "scripts" / "train_tir.py",
    "sft": ROOT / "scripts" / "sft_coldstart.py",
    "eval": ROOT / "scripts" / "eval_aime.py",
}


def run(script: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPTS[script]), *args], capture_output=True, text=True, timeout=240, cwd=cwd
    )


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_help_lists_the_shared_dotted_keys(script):
    out = run(script, "--help").stdout
    for key in (
        "--config",
        "--debug",
        "--print-config",
        "KEY=VALUE",
        "model.path=",
        "model.tokenizer=",
        "rollout.temperature=",
        "sandbox.backend=",
    ):
        assert key in out, (script, key)
    section = "eval.n=" if script == "eval" else "sft.train.epochs="
    assert section in out


def test_sft_and_train_read_the_same_config(tmp_path):
    train = run("train", "--print-config", "sft.train.epochs=5", "model.path=tiny-random").stdout
    sft = run("sft", "--print-config", "sft.train.epochs=5", "--model", "tiny-random").stdout
    assert train == sft and "epochs: 5" in train and "path: tiny-random" in train


@pytest.mark.parametrize(
    "args,message",
    [
        (["model.path=./no/such/model"], "error: model.path='./no/such/model': no such directory"),
        (["data.train=missing.jsonl"], "error: data.train='missing.jsonl'"),
        (
            ["algo.policy_loss=ppo"],
            f"error: algo.policy_loss='ppo': unknown policy loss; choose one of {', '.join(POLICY_LOSSES.names())}\n",
        ),
    ],
)
def test_train_start_up_errors_are_one_clean_line(tmp_path, monkeypatch, capsys, args, message):
    from loguru import logger

    from stare_tir.app.cli import train_main

    # loguru's default sink is the stderr of import time, which an earlier test's capture may have
    # closed: log to this test's stderr instead.
    logger.remove()
    sink = logger.add(sys.stderr, level="INFO")

    monkeypatch.chdir(tmp_path)
    assert train_main([f"trainer.run_dir={tmp_path / 'run'}", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and "--debug" in err
    assert not (tmp_path / "run" / "sft").exists()  # nothing expensive started
    assert not (tmp_path / "run" / "config.yaml").exists()  # written only once the checks passed
    logger.remove(sink)
    logger.add(sys.stderr)


def test_debug_shows_the_traceback(tmp_path):
    r = run("train", "--debug", f"trainer.run_dir={tmp_path / 'run'}", "model.path=./no/such/model", cwd=tmp_path)
    assert r.returncode != 0 and "Traceback" in r.stderr and "StartupError" in r.stderr


def test_sft_aliases_and_a_missing_traces_file(tmp_path, capsys):
    from stare_tir.app.cli import sft_main

    assert sft_main(["--model", "tiny", "--data", str(tmp_path / "none.jsonl"), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "error: sft.traces=" in err and "no such JSONL file" in err and "Traceback" not in err


def test_eval_missing_dataset_is_reported_before_the_model_loads(tmp_path, capsys):
    from stare_tir.app.cli import eval_main

    assert eval_main(["model.path=tiny", "eval.datasets=[nope.jsonl]", f"out_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "error: eval.datasets: 'nope.jsonl'" in err and "Traceback" not in err


def help_values(text: str) -> dict[str, str]:
    """`key=value  # comment` lines of a --help epilog -> {key: value text}."""
    out = {}
    for line in text.splitlines():
        if line.startswith("  ") and "=" in line and not line.lstrip().startswith("-"):
            key, _, rest = line.strip().partition("=")
            if "." in key or key in ("backend", "out_dir", "plugins"):
                out[key] = rest.split("  # ")[0]
    return out


def test_help_shows_the_values_a_plain_run_uses_with_one_comment_line_per_key():
    import json

    import yaml

    from stare_tir.config import field_comments, flatten
    from stare_tir.train_config import TrainConfig

    shown = help_values(run("train", "--help").stdout)
    assert yaml.safe_load(run("train", "--print-config").stdout)["trainer"]["steps"] == 40
    plain = flatten(_resolved_plain())
    assert set(shown) == set(plain)
    for key, value in plain.items():
        expected = repr(value) if isinstance(value, str) else json.dumps(value)
        assert shown[key] == expected, (key, shown[key], expected)
    # The defaults tiny_cpu.yaml sets, shown as a plain run uses them (not the schema's).
    assert (
        shown["trainer.steps"] == "40"
        and shown["sft.num_traces"] == "16000"
        and shown["data.arithmetic_eval_size"] == "512"
    )
    comments = field_comments(TrainConfig)
    mine = ("model.", "data.", "sft.", "trainer.")  # sections whose dataclasses live in stare_tir
    undocumented = [k for k in comments if k.startswith(mine) and not comments[k]]
    assert not undocumented, f"add a comment above these fields in their dataclass: {undocumented}"
    text = run("train", "--help").stdout
    assert "  trainer.steps=40  # RL steps (one optimizer step per PPO epoch each)." in text.splitlines()


def _resolved_plain():
    from stare_tir.app.cli import DEFAULT_TRAIN_CONFIG
    from stare_tir.config import load_config
    from stare_tir.train_config import TrainConfig

    return load_config(TrainConfig, None, (), default_base=DEFAULT_TRAIN_CONFIG)


def test_an_empty_or_partial_yaml_keeps_the_default_config(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    partial = tmp_path / "partial.yaml"
    partial.write_text("trainer:\n  steps: 7\n")
    plain = run("train", "--print-config").stdout
    assert run("train", "--config", str(empty), "--print-config").stdout == plain
    assert run("train", "--config", str(partial), "--print-config").stdout == plain.replace("steps: 40", "steps: 7")


def _interrupt_during_sft(tmp_path, monkeypatch, capsys, *args: str) -> tuple[int, str, list]:
    """train_main with a pipeline that is interrupted during its SFT stage."""
    import stare_tir.app.pipeline as pipeline
    from stare_tir.app.cli import train_main

    calls = []

    def interrupted(cfg, **kw):
        calls.append(kw)
        e = KeyboardInterrupt()
        e.stage = "sft"
        raise e

    monkeypatch.setattr(pipeline, "run_pipeline", interrupted)
    monkeypatch.chdir(tmp_path)
    rc = train_main([f"trainer.run_dir={tmp_path / 'run'}", *args])
    return rc, capsys.readouterr().err.strip().splitlines()[-1], calls


def test_the_ctrl_c_hint_names_the_command_the_user_ran(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("MAKELEVEL", raising=False)
    rc, line, _ = _interrupt_during_sft(tmp_path, monkeypatch, capsys, "--resume", "auto")
    assert rc == 130 and line == (
        "interrupted during the SFT stage, before RL step 1; start again with: stare-train --overwrite "
        f"trainer.run_dir={tmp_path / 'run'} (SFT traces and a finished SFT model there are reused)"
    )
    # `make train` runs this command with --resume auto: its user is sent back to `make train`
    monkeypatch.setenv("MAKELEVEL", "1")
    monkeypatch.setattr(sys, "argv", [str(ROOT / "scripts" / "train_tir.py")])
    rc, line, _ = _interrupt_during_sft(tmp_path, monkeypatch, capsys, "--resume", "auto")
    assert rc == 130 and f'start again with: make train ARGS="--overwrite trainer.run_dir={tmp_path / "run"}"' in line
    # ... and that command starts over (--resume auto gives way to --overwrite when nothing can resume)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("{}\n")
    rc, _, calls = _interrupt_during_sft(tmp_path, monkeypatch, capsys, "--resume", "auto", "--overwrite")
    assert rc == 130 and calls[-1]["resume"] is False and calls[-1]["overwrite"] is True


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_help_key_prints_that_keys_whole_comment(script):
    """`--help KEY`: the comment `--help` cuts to its first sentences, whole, with the value a plain run
    uses and the registry's names; a section prints each of its keys; a wrong key is one line, rc 2."""
    from stare_tir.config import field_comments
    from stare_tir.eval.command import EvalRunConfig
    from stare_tir.train_config import TrainConfig

    schema = EvalRunConfig if script == "eval" else TrainConfig
    whole = field_comments(schema)["sandbox.backend"]
    r = run(script, "--help", "sandbox.backend")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "sandbox.backend='local'"
    assert lines[1].strip().startswith("one of: local, docker")
    assert " ".join(x.strip() for x in lines[2:]) == whole  # every word of the comment, in order
    section = run(script, "--help", "sandbox.limits").stdout
    assert "sandbox.limits.wall_time_s=" in section and "sandbox.limits.memory_mb=" in section
    if script == "train":  # a long comment that the one-line view cuts at "..."
        key = next(k for k, c in field_comments(TrainConfig).items() if len(c) > 300)
        out = run(script, "--help", key).stdout
        assert (
            " ".join(x.strip() for x in out.splitlines()[1:] if not x.strip().startswith("one of:"))
            == (field_comments(TrainConfig)[key])
        )
    bad = run(script, "--help", "sandbox.backnd")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().splitlines() == [
        "error: --help sandbox.backnd: no such config key; did you mean sandbox.backend, sandbox.env, sandbox.preload?"
    ]
