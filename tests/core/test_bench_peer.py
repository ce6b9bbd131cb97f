"""scripts/bench/bench_peer.py without running either trainer: its arguments, the missing-TRL line,
and its command line for this trainer (every key it overrides must exist)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench" / "bench_peer.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_peer", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_defaults_fit_the_prompt_pool():
    bench = load_bench()
    args = bench.parse_args([])
    assert (args.steps, args.warmup, args.repeats, args.tools, args.child) == (2, 1, 2, False, None)
    assert (args.steps + args.warmup) * bench.PROMPTS_PER_STEP <= bench.TRAIN_SIZE


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "0"], "--steps=0: must be >= 1"),
        (["--repeats", "0"], "--repeats=0: must be >= 1"),
        (["--warmup", "-1"], "--warmup=-1: must be >= 0"),
        (["--steps", "20"], "at most 16 steps"),
    ],
)
def test_bad_arguments_name_the_problem(argv, message, capsys):
    bench = load_bench()
    with pytest.raises(SystemExit) as stop:
        bench.parse_args(argv)
    assert stop.value.code == 2
    assert message in capsys.readouterr().err


def test_without_trl_one_line_says_how_to_install_it():
    # sys.modules["trl"] = None makes find_spec("trl") None: TRL looks absent whether or not it is installed.
    code = (
        "import runpy, sys; sys.modules['trl'] = None; "
        f"sys.argv = [{str(SCRIPT)!r}, '--steps', '1']; runpy.run_path({str(SCRIPT)!r}, run_name='__main__')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "TRL is not installed" in lines[0]
    assert "pip install -e '.[peer]'" in lines[0] and "trl==1.16.0" in lines[0]
    assert done.stdout == ""


def test_this_trainers_side_uses_only_existing_keys(tmp_path, capsys):
    from stare_tir.app.cli import train_main

    bench = load_bench()
    assert train_main([*bench.ours_argv(tmp_path / "run", 3), "--print-config"]) == 0
    printed = capsys.readouterr().out
    for line in ("name: grpo", "loss_agg: token-mean", "max_tool_calls: 0", "n_per_prompt: 4", "max_total_tokens: 64"):
        assert line in printed, line
