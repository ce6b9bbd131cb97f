"""scripts/eval_aime.py (= stare-eval): alias flags -> config, a light --help, and a CPU smoke run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stare_tir.app.cli import EVAL_ALIASES, alias_overrides, eval_parser
from stare_tir.config import ConfigError, load_config
from stare_tir.eval.command import EvalRunConfig
from stare_tir.eval.evaluate import read_rows

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "eval_aime.py"


def test_alias_flags_become_config_values() -> None:
    args = eval_parser().parse_args(
        [
            "--model",
            "some/model",
            "--datasets",
            "aime24,math500",
            "--n",
            "3",
            "--limit",
            "2",
            "--temperature",
            "0.6",
            "--top-p",
            "0.95",
            "--max-turns",
            "4",
            "--max-tokens",
            "512",
            "--max-tokens-per-turn",
            "128",
            "--seed",
            "7",
            "--backend",
            "sglang",
            "--sglang-url",
            "http://a:1,http://b:2",
            "--sglang-url",
            "http://c:3",
            "--sandbox",
            "local",
            "--sandbox-timeout",
            "2.5",
            "--sandbox-memory-mb",
            "256",
            "--sandbox-workers",
            "3",
            "--out",
            "some dir",
            "rollout.max_concurrency=7",
        ]
    )
    cfg = load_config(
        EvalRunConfig, str(ROOT / "configs" / "eval_aime.yaml"), alias_overrides(args, EVAL_ALIASES) + args.overrides
    )
    e = cfg.eval
    assert cfg.model.path == "some/model" and cfg.out_dir == "some dir" and cfg.backend == "sglang"
    assert e.datasets == ["aime24", "math500"] and e.n == 3 and e.limit == 2 and e.seed == 7
    assert (e.temperature, e.top_p, e.max_turns, e.max_tokens, e.max_tokens_per_turn) == (0.6, 0.95, 4, 512, 128)
    assert cfg.rollout.sglang.urls == ["http://a:1", "http://b:2", "http://c:3"]
    assert cfg.env.code_timeout_s == 2.5 and cfg.sandbox.limits.wall_time_s == 2.5
    assert cfg.sandbox.limits.memory_mb == 256 and cfg.sandbox.workers == 3
    assert cfg.rollout.max_concurrency == 7
    # Unset flags keep the YAML's values.
    args = eval_parser().parse_args(["--model", "m"])
    cfg = load_config(EvalRunConfig, str(ROOT / "configs" / "eval_aime.yaml"), alias_overrides(args, EVAL_ALIASES))
    assert cfg.eval.max_tokens == 16384 and cfg.sandbox.workers == 16


def test_bad_settings_fail_with_the_key_named() -> None:
    with pytest.raises(ConfigError, match="eval.top_p"):
        load_config(EvalRunConfig, None, ["eval.top_p=1.5"])
    with pytest.raises(ConfigError, match="eval.nn"):
        load_config(EvalRunConfig, None, ["eval.nn=3"])
    with pytest.raises(ConfigError, match="sglang"):
        load_config(EvalRunConfig, None, ["backend=sglang"])


def test_help_lists_every_flag_without_importing_torch() -> None:
    code = (
        "import runpy, sys\n"
        f"sys.argv = [{str(SCRIPT)!r}, '--help']\n"
        "try:\n"
        f"    runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('TORCH_IMPORTED' if 'torch' in sys.modules else 'TORCH_NOT_IMPORTED')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT).stdout
    assert "TORCH_NOT_IMPORTED" in out
    for flag in [
        "--model",
        "--datasets",
        "--n",
        "--limit",
        "--temperature",
        "--top-p",
        "--max-turns",
        "--max-tokens",
        "--max-tokens-per-turn",
        "--seed",
        "--backend",
        "--sglang-url",
        "--sandbox",
        "--sandbox-timeout",
        "--sandbox-memory-mb",
        "--sandbox-workers",
        "--config",
        "--out",
        "KEY=VALUE",
    ]:
        assert flag in out, flag


@pytest.mark.slow
def test_cpu_smoke_run_on_the_tiny_model_writes_summary_and_resumes(tmp_path: Path) -> None:
    out = tmp_path / "eval"
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--model",
        "tiny",
        "--datasets",
        "aime24",
        "--limit",
        "2",
        "--n",
        "2",
        "--max-turns",
        "2",
        "--max-tokens",
        "48",
        "--max-tokens-per-turn",
        "32",
        "--seed",
        "0",
        "--out",
        str(out),
        "env.grader=boxed",
        "env.prompt=short",
        "rollout.progress=false",
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    m = summary["datasets"]["aime24"]
    assert m["problems"] == 2 and m["samples"] == 4 and m["n"] == 2
    assert 0.0 <= m["avg@2"] <= 1.0 and "pass@1" in m and "pass@4" not in m
    assert summary["model"] == "tiny" and summary["six_benchmark_avg"] is None
    assert summary["grader"] == "boxed"  # the grader that produced these numbers is on record
    rows = read_rows(out / "aime24.jsonl")
    assert len(rows) == 4 and all(0 < r["response_tokens"] <= 48 for r in rows)
    assert {r["problem_id"] for r in rows} == {"aime2024-I-1", "aime2024-I-2"}
    assert (out / "config.yaml").is_file()
    assert "avg@N" in first.stderr  # the console table

    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    m2 = json.loads((out / "summary.json").read_text())["datasets"]["aime24"]
    assert m2["resumed_samples"] == 4 and m2["new_samples"] == 0
    assert m2["avg@2"] == m["avg@2"] and len(read_rows(out / "aime24.jsonl")) == 4


def test_missing_model_is_an_error() -> None:
    r = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2 and "--model" in r.stderr and "model.path=" in r.stderr


@pytest.mark.slow
def test_sglang_backend_run_against_the_standin_server(tmp_path: Path, standin) -> None:
    # The GPU path (backend=sglang) end to end on CPU: SGLang's HTTP API served by the stand-in.
    from stare_tir.eval.command import run_eval
    from stare_tir.model import ensure_tiny_checkpoint

    proc, url = standin.launch_standin(str(ensure_tiny_checkpoint()))
    try:
        cfg = load_config(
            EvalRunConfig,
            None,
            [
                "model.path=tiny",
                "backend=sglang",
                f"rollout.sglang.urls=[{json.dumps(url)}]",
                "eval.datasets=[aime25]",
                "eval.limit=1",
                "eval.n=2",
                "eval.max_turns=2",
                "eval.max_tokens=40",
                "eval.max_tokens_per_turn=24",
                f"out_dir={json.dumps(str(tmp_path))}",
                "env.prompt=short",
                "rollout.progress=false",
            ],
        )
        summary = run_eval(cfg)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    m = summary["datasets"]["aime25"]
    assert summary["backend"] == "sglang" and m["problems"] == 1 and m["samples"] == 2
    rows = read_rows(tmp_path / "aime25.jsonl")
    assert len(rows) == 2 and all(0 < r["generated_tokens"] <= 40 for r in rows)
