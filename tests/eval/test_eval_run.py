"""`stare-eval` as a command: one output directory per model and settings, a resumed evaluation
that refuses another model or other settings, a training run directory as the model, and the
training task's held-out split as a dataset."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from stare_tir.app.preflight import StartupError
from stare_tir.config import load_config, resolve_config, to_dict
from stare_tir.eval.command import EvalRunConfig, load_eval_datasets, resolve_eval_config, run_eval

ROOT = Path(__file__).resolve().parents[2]

# One AIME problem, one short sample: enough to write rows and a summary in a few seconds.
TINY_EVAL = [
    "eval.datasets=[aime24]",
    "eval.limit=1",
    "eval.n=1",
    "eval.max_turns=1",
    "eval.max_tokens=12",
    "eval.max_tokens_per_turn=12",
    "eval.seed=0",
    "env.prompt=short",
    "rollout.progress=false",
    "sandbox.workers=1",
]


def evaluate(*overrides: str) -> dict:
    return run_eval(load_config(EvalRunConfig, None, [*TINY_EVAL, *overrides]))


def out_dirs(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "runs" / "eval").iterdir())


@pytest.mark.slow
def test_two_models_evaluate_into_two_directories_and_each_resumes_its_own(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    evaluate("model.path=tiny")
    evaluate("model.path=tiny-random")
    dirs = out_dirs(tmp_path)
    assert len(dirs) == 2 and dirs[0].startswith("tiny-") and dirs[1].startswith("tiny-random-"), dirs
    for d in dirs:
        summary = json.loads((tmp_path / "runs" / "eval" / d / "summary.json").read_text())
        assert summary["model"] == d.rsplit("-", 1)[0]  # each directory holds its own model's answers
    again = evaluate("model.path=tiny")  # the same command: the same directory, nothing re-sampled
    assert out_dirs(tmp_path) == dirs and again["datasets"]["aime24"]["new_samples"] == 0
    evaluate("model.path=tiny", "eval.temperature=0.5")  # other sampling settings: a third directory
    assert len(out_dirs(tmp_path)) == 3

    tiny_dir = str(tmp_path / "runs" / "eval" / dirs[0])
    with pytest.raises(StartupError, match=r"holds an evaluation of another model or with other settings \(model:"):
        evaluate("model.path=tiny-random", f"out_dir={tiny_dir}")
    with pytest.raises(StartupError, match=r"sampling.temperature: 1.0 -> 0.5"):
        evaluate("model.path=tiny", f"out_dir={tiny_dir}", "eval.temperature=0.5")
    # Which samples to make may change on a resume: more problems, more samples per problem.
    more = evaluate("model.path=tiny", f"out_dir={tiny_dir}", "eval.limit=2", "eval.n=2")
    assert more["datasets"]["aime24"]["resumed_samples"] == 1 and more["datasets"]["aime24"]["new_samples"] == 3


def test_rows_without_a_record_of_their_model_are_not_resumed(tmp_path):
    (tmp_path / "aime24.jsonl").write_text('{"problem_id": "x", "sample_idx": 0}\n')
    with pytest.raises(StartupError, match=r"holds evaluation rows \(aime24.jsonl\) without a record"):
        evaluate("model.path=tiny", f"out_dir={tmp_path}")


def fake_run_dir(root: Path) -> Path:
    """A training run directory as stare-train leaves it: config.yaml and final/."""
    from stare_tir.train_config import TrainConfig

    run = root / "my_run"
    cfg = resolve_config(
        TrainConfig,
        {},
        [
            f"trainer.run_dir={run}",
            "env.prompt=short",
            "env.max_tool_calls=2",
            "rollout.max_turns=3",
            "rollout.max_total_tokens=77",
            "data.arithmetic_eval_size=5",
            "data.seed=3",
        ],
    )
    (run / "final").mkdir(parents=True)
    (run / "final" / "config.json").write_text("{}")
    (run / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg)))
    return run


def test_a_run_directory_brings_its_final_model_and_its_settings(tmp_path):
    run = fake_run_dir(tmp_path)
    cfg = resolve_eval_config({}, [f"model.path={run}", "eval.datasets=[arithmetic]"])
    assert cfg.model.path == str(run / "final")
    assert (cfg.env.prompt, cfg.env.max_tool_calls) == ("short", 2)  # the prompt it was trained with
    assert (cfg.rollout.max_turns, cfg.rollout.max_total_tokens) == (3, 77)
    # A config file sits under the run's settings, the command line over them.
    cfg = resolve_eval_config({"env": {"prompt": "retool"}}, [f"model.path={run}", "rollout.max_total_tokens=99"])
    assert cfg.env.prompt == "short" and cfg.rollout.max_total_tokens == 99

    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    shutil.copy(run / "config.yaml", unfinished / "config.yaml")
    with pytest.raises(StartupError, match=r"training run without a final model yet"):
        resolve_eval_config({}, [f"model.path={unfinished}"])


def test_the_training_task_is_a_dataset_with_the_runs_held_out_problems(tmp_path):
    from stare_tir.data import load_split
    from stare_tir.train_config import TrainConfig

    run = fake_run_dir(tmp_path)
    cfg = resolve_eval_config({}, [f"model.path={run}", "eval.datasets=[arithmetic,aime24]", "eval.limit=4"])
    problems = load_eval_datasets(cfg)
    train_cfg = resolve_config(TrainConfig, yaml.safe_load((run / "config.yaml").read_text()))
    heldout = load_split(train_cfg.data, "eval")  # what the training run evaluated on
    assert len(heldout) == 5 and problems["arithmetic"] == heldout[:4] and len(problems["aime24"]) == 4


def test_the_eval_command_reads_a_run_directory(tmp_path):
    run = fake_run_dir(tmp_path)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "eval_aime.py"), f"model.path={run}", "--print-config"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    printed = yaml.safe_load(proc.stdout)
    assert printed["model"]["path"] == str(run / "final") and printed["rollout"]["max_total_tokens"] == 77
