"""The three entry points share one convention; a user's mistake ends in one line, not a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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
        (["algo.policy_loss=ppo"], "error: algo.policy_loss='ppo': policy loss 'ppo' unknown; choose one of ['clip',"),
    ],
)
def test_train_start_up_errors_are_one_clean_line(tmp_path, monkeypatch, capsys, args, message):
    from stare_tir.cli import train_main

    monkeypatch.chdir(tmp_path)
    assert train_main([f"trainer.run_dir={tmp_path / 'run'}", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and "--debug" in err
    assert not (tmp_path / "run" / "sft").exists()  # nothing expensive started


def test_debug_shows_the_traceback(tmp_path):
    r = run("train", "--debug", f"trainer.run_dir={tmp_path / 'run'}", "model.path=./no/such/model", cwd=tmp_path)
    assert r.returncode != 0 and "Traceback" in r.stderr and "StartupError" in r.stderr


def test_sft_aliases_and_a_missing_traces_file(tmp_path, capsys):
    from stare_tir.cli import sft_main

    assert sft_main(["--model", "tiny", "--data", str(tmp_path / "none.jsonl"), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "error: sft.traces=" in err and "no such JSONL file" in err and "Traceback" not in err


def test_eval_missing_dataset_is_reported_before_the_model_loads(tmp_path, capsys):
    from stare_tir.cli import eval_main

    assert eval_main(["model.path=tiny", "eval.datasets=[nope.jsonl]", f"out_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "error: eval.datasets: 'nope.jsonl'" in err and "Traceback" not in err
