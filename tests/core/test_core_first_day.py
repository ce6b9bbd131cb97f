"""A new user's first commands: every input checked before anything loads, all problems at once,
learner settings checked when the config loads, and `--resume auto` for requeued jobs."""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "scripts" / "train_tir.py"
SFT = ROOT / "scripts" / "sft_coldstart.py"
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}

# Added to the shared tiny-run budgets (tests/conftest.py `tiny_run`): a checkpoint every step.
MINE = ("trainer.eval_every=0", "trainer.save_every=1", "algo.dynamic_sampling_rounds=2")
GOOD_TRACE = {
    "messages": [
        {"role": "user", "content": "What is 2 + 3?"},
        {
            "role": "assistant",
            "content": "<code>\n```python\nprint(2 + 3)\n```\n</code>\n<interpreter>\n5\n</interpreter>\n"
            "The answer is \\boxed{5}.",
        },
    ]
}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run(script: Path, *args: str, timeout: int = 300, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(script), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=ENV)


# ----------------------------------------------------------------------------------------------
# All problems of a command at once, one line each, nothing written


def test_three_problems_in_one_command_are_three_lines_rc2_and_nothing_written(tmp_path):
    user_turn_last = {"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": "again"}]}
    traces = write_jsonl(tmp_path / "traces.jsonl", [GOOD_TRACE, user_turn_last])
    data = write_jsonl(tmp_path / "train.jsonl", [{"problem": "1 + 1?", "solution": "2"}])
    run_dir = tmp_path / "run"
    r = run(
        TRAIN,
        f"trainer.run_dir={run_dir}",
        "model.path=tiny",
        f"sft.traces={traces}",
        f"data.train={data}",
        "trainer.stepz=3",
    )
    assert r.returncode == 2, r.stderr[-2000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 3, r.stderr
    assert "Traceback" not in r.stderr
    assert "did you mean `trainer.steps`" in errors[0]
    assert any("sft.traces=" in e and "row 2" in e and "role 'assistant'" in e for e in errors), errors
    assert any("data.train" in e and "data.fields={answer: solution}" in e for e in errors), errors
    assert not run_dir.exists()  # nothing written: the retry is a plain start


@pytest.mark.slow
def test_a_fixed_retry_starts_into_a_directory_a_failed_start_left(tmp_path, tiny_run):
    """A start that failed after writing its config (here: killed before step 1) leaves a directory
    that counts as free: the same command again starts, without --overwrite."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("trainer: {steps: 1}\n")  # what a start writes first
    (run_dir / "train.log").write_text("a failed start\n")
    r = run(TRAIN, f"trainer.run_dir={run_dir}", *tiny_run(*MINE), "trainer.steps=1", timeout=420)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert (run_dir / "summary.json").is_file()


# ----------------------------------------------------------------------------------------------
# Learner settings: what the config accepts is what DeepSpeed 0.19.8 accepts


def deepspeed_accepts(stage: int, dtype: str, accum: str, offload: str) -> bool:
    """The README's table ("The DeepSpeed learner"), each "yes" a test in tests/learner/test_learner_paths.py."""
    bf16 = dtype != "fp32"  # auto is bf16 on a GPU
    effective_accum = ("bf16" if stage == 0 else "fp32") if accum == "auto" else accum
    if stage == 0 and bf16 and effective_accum == "fp32":
        return False
    if offload == "optimizer" and stage == 0:
        return False
    if offload == "param" and stage != 3:
        return False
    return True


OFFLOAD = {
    "none": {},
    "optimizer": {"zero_optimization": {"offload_optimizer": {"device": "cpu"}}},
    "param": {"zero_optimization": {"offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}},
}


def test_every_learner_setting_the_config_accepts_is_one_deepspeed_accepts():
    from stare_tir.config import ConfigError, resolve_config
    from stare_tir.train_config import TrainConfig

    for stage, dtype, accum, offload in itertools.product(
        (0, 1, 2, 3), ("auto", "fp32", "bf16"), ("auto", "fp32", "bf16"), OFFLOAD
    ):
        learner = {"zero_stage": stage, "dtype": dtype, "grad_accum_dtype": accum, "deepspeed": OFFLOAD[offload]}
        try:
            resolve_config(TrainConfig, {"learner": learner})
            accepted = True
        except ConfigError as e:
            accepted = False
            assert "\n" not in str(e) and str(e).startswith("learner."), str(e)
        assert accepted == deepspeed_accepts(stage, dtype, accum, offload), (stage, dtype, accum, offload)


def test_auto_accumulation_follows_an_override_of_the_stage():
    from stare_tir.config import load_config
    from stare_tir.train_config import TrainConfig

    cfg = load_config(TrainConfig, ROOT / "configs" / "retool_qwen2.5_7b_stare.yaml", ["learner.zero_stage=0"])
    assert cfg.learner.dtype == "bf16" and cfg.learner.accum_dtype() == "bf16"
    assert load_config(TrainConfig, None, ["learner.zero_stage=3"]).learner.accum_dtype() == "fp32"


def readme_one_gpu_commands() -> list[list[str]]:
    """The stare-sft and stare-train commands of the README's one-GPU quick start, as argument lists."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### One GPU") :]
    block = section[section.index("```bash") + len("```bash") : section.index("```\n", section.index("```bash") + 7)]
    commands = [shlex.split(c.replace("\\\n", " ")) for c in re.split(r"\n(?=\S)", block.strip())]
    return [c for c in commands if c and c[0] in ("stare-sft", "stare-train")]


@pytest.mark.slow
def test_the_readme_one_gpu_commands_are_accepted_on_cpu_with_the_tiny_model(tmp_path):
    """The commands as printed, with the tiny model and a small traces file: stare-sft runs to the
    end (bf16 on CPU), stare-train's config and learner settings load (its data is a hub dataset)."""
    sft, train = readme_one_gpu_commands()
    assert sft[0] == "stare-sft" and train[0] == "stare-train"
    traces = write_jsonl(tmp_path / "traces.jsonl", [GOOD_TRACE] * 4)

    def local(args: list[str]) -> list[str]:
        out = []
        for a in args[1:]:
            key = a.split("=", 1)[0]
            if key == "model.path":
                a = "model.path=tiny"
            elif key == "sft.traces":
                a = f"sft.traces={traces}"
            elif key in ("sft.output", "trainer.run_dir"):
                a = f"{key}={tmp_path / key.replace('.', '_')}"
            elif key == "sft.train.batch_size":
                a = "sft.train.batch_size=4"
            elif key == "sft.train.epochs":
                a = "sft.train.epochs=1"
            out.append(a)
        return out

    r = run(SFT, *local(sft), timeout=420)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert (tmp_path / "sft_output" / "config.json").is_file()
    r = run(TRAIN, *local(train), "--print-config")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "zero_stage: 1" in r.stdout


# ----------------------------------------------------------------------------------------------
# --resume auto


def test_resume_auto_decides_by_what_the_directory_holds(tmp_path):
    from stare_tir.app.preflight import StartupError
    from stare_tir.app.run_dir import auto_resume, run_under_way

    d = tmp_path / "run"
    assert auto_resume(d) is False  # nothing there: start
    d.mkdir()
    (d / "config.yaml").write_text("{}\n")
    (d / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval/acc": 0.1}) + "\n")
    assert not run_under_way(d) and auto_resume(d) is False  # a start that failed before step 1
    with open(d / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"step": 1, "entropy/batch": 0.4}) + "\n")
    with pytest.raises(StartupError, match="no checkpoint to continue from"):
        auto_resume(d)  # steps ran but nothing saved: neither resume nor start over silently
    (d / "checkpoints" / "step_000001").mkdir(parents=True)
    (d / "checkpoints" / "latest").write_text("step_000001")
    assert auto_resume(d) is True


def test_resume_takes_an_override_after_it_and_only_auto_as_its_value():
    from stare_tir.app.cli import build_parser, parse_train_args
    from stare_tir.train_config import TrainConfig

    p = build_parser("stare-train", "", TrainConfig, resume=True, overwrite=True)
    args = parse_train_args(p, ["--resume", "trainer.run_dir=x"])
    assert args.resume is True and args.overrides == ["trainer.run_dir=x"]
    assert parse_train_args(p, ["--resume", "auto", "trainer.steps=2"]).resume == "auto"
    assert parse_train_args(p, ["trainer.steps=2"]).resume is False


@pytest.mark.slow
def test_kill_9_then_the_same_command_with_resume_auto_continues(tmp_path, tiny_run):
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        str(TRAIN),
        "--resume",
        "auto",
        f"trainer.run_dir={run_dir}",
        *tiny_run(*MINE),
        "trainer.steps=3",
    ]
    child = subprocess.Popen(
        cmd, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    latest = run_dir / "checkpoints" / "latest"
    deadline = time.time() + 400
    while time.time() < deadline and not latest.is_file() and child.poll() is None:
        time.sleep(0.5)
    assert child.poll() is None, "the run ended before it could be killed"
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    saved = latest.read_text().strip()
    r = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = sorted({row["step"] for row in rows if "entropy/batch" in row})
    assert steps == [1, 2, 3]
    assert "resum" in (run_dir / "train.log").read_text().lower(), saved
    # A third time, the run is finished and checkpointed: it resumes (and ends) again, no refusal.
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 3


def test_rl_from_a_hub_model_with_sft_off_says_so(monkeypatch):
    """The 7B configs ship model.path=Qwen/Qwen2.5-7B with SFT off: left as shipped, RL would start
    on the base model without a word."""
    from loguru import logger

    from stare_tir.app import pipeline
    from stare_tir.config import load_config
    from stare_tir.train_config import TrainConfig

    for name in ("check_model", "check_trackers", "check_backend", "check_sandbox", "check_sft_traces", "check_data", "gpu_recipe_without_gpu"):  # fmt: skip
        monkeypatch.setattr(pipeline, name, lambda *a: None)  # no hub, no servers: only the warning is under test
    monkeypatch.setattr(pipeline, "check_sync_dir", lambda *a: None)
    monkeypatch.setattr(pipeline, "check_router", lambda *a: None)
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="WARNING")
    try:
        cfg = load_config(TrainConfig, ROOT / "configs" / "retool_qwen2.5_7b_stare.yaml")
        assert pipeline.preflight_problems(cfg) == []
        cfg_local = load_config(TrainConfig, ROOT / "configs" / "retool_qwen2.5_7b_stare.yaml", ["model.path=tiny"])
        pipeline.preflight_problems(cfg_local)
    finally:
        logger.remove(sink)
    assert len(lines) == 1 and "model.path='Qwen/Qwen2.5-7B'" in lines[0] and "sft.enabled=true" in lines[0]


def test_stare_sft_reports_every_problem_at_once(tmp_path):
    r = run(SFT, "--model", "./no/model", "--data", str(tmp_path / "none.jsonl"), "sft.train.epochz=1", cwd=tmp_path)
    assert r.returncode == 2
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 3 and "did you mean `sft.train.epochs`" in errors[0], r.stderr
    assert "model.path='./no/model'" in errors[1] and "sft.traces=" in errors[2]
