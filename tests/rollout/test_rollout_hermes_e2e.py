"""Native tool calling end to end on the tiny model, through the real scripts: cold-start SFT on
hermes-format traces -> RL steps whose tool calls run in the sandbox -> stare-eval with tool
statistics. And the one-line refusal of a template that cannot call tools."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from stare_tir.model import TINY_TEMPLATES

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "scripts" / "train_tir.py"
EVAL = ROOT / "scripts" / "eval_aime.py"
TEMPLATE = TINY_TEMPLATES / "tiny_tools.jinja"  # absolute: the run's config.yaml records it as given

# The fast tiny-run overrides of tests/trainer/test_trainer_e2e.py, with what the JSON format needs:
# a larger SFT (the tiny base has never seen a <tool_call>, 8 pieces of its vocabulary) and room
# in the budget for a call, its tool turn and the answer. Sampling at 0.5 (learner alike): at 1.0 a
# third of this small SFT's calls are well-formed JSON, and 32 trajectories may hold none. A format
# penalty gives rewards spread inside groups (the tiny model rarely copies the result right), so
# the steps update.
HERMES = [
    "env.tool_format=hermes",
    f"model.chat_template={TEMPLATE}",
    "sft.num_traces=600",
    "sft.tool_fraction=0.8",
    "sft.train.epochs=6",
    "sft.train.batch_size=16",
    "data.arithmetic_train_size=200",
    "data.arithmetic_eval_size=8",
    "trainer.prompts_per_step=4",
    "rollout.n_per_prompt=4",
    "rollout.max_total_tokens=160",
    "rollout.max_new_tokens_per_turn=80",
    "trainer.eval_every=0",
    "trainer.save_every=1",
    "algo.dynamic_sampling_rounds=2",
    "algo.stare.target_entropy=100",
    "env.format_penalty=0.5",
    "rollout.temperature=0.5",
    "learner.temperature=0.5",
]


def rows_by_step(run_dir: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows if "rollout/tool_calls" in r}


@pytest.mark.slow
def test_hermes_sft_then_rl_with_tool_calls_then_eval_with_tool_statistics(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, str(TRAIN), f"trainer.run_dir={run_dir}", *HERMES, "trainer.steps=2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    traces = [json.loads(line) for line in (run_dir / "sft" / "traces.jsonl").read_text().splitlines()]
    tool_trace = next(t for t in traces if t["uses_tool"])
    assert [m["role"] for m in tool_trace["messages"]][2:] == ["assistant", "tool", "assistant"]
    assert tool_trace["messages"][2]["tool_calls"][0]["function"]["name"] == "python"
    steps = rows_by_step(run_dir)
    assert sorted(steps) == [1, 2]
    assert sum(r["rollout/tool_calls"] for r in steps.values()) > 0  # calls ran in the sandbox
    assert all("rollout/tool_format_errors" in r for r in steps.values())
    assert any(math.isfinite(r.get("update/loss", float("nan"))) for r in steps.values())
    config = (run_dir / "config.yaml").read_text()
    assert "tool_format: hermes" in config and str(TEMPLATE) in config
    for stage in ("sft/model", "final"):  # model.chat_template reached every stage's tokenizer
        assert (run_dir / stage / "chat_template.jinja").read_text() == TEMPLATE.read_text()

    out = tmp_path / "eval"
    cmd = [
        sys.executable,
        str(EVAL),
        "--model",
        str(run_dir),
        "--datasets",
        "arithmetic",
        "--limit",
        "8",
        "--temperature",
        "0.5",
    ]
    proc = subprocess.run(
        [*cmd, "--n", "2", "--out", str(out), "rollout.progress=false"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())["datasets"]["arithmetic"]
    assert summary["samples"] == 16 and summary["mean_tool_calls"] > 0
    eval_config = (out / "config.yaml").read_text()
    assert "tool_format: hermes" in eval_config and str(TEMPLATE) in eval_config


def test_hermes_with_a_template_that_cannot_call_tools_is_refused_in_one_line(tmp_path):
    cmd = [
        sys.executable,
        str(TRAIN),
        f"trainer.run_dir={tmp_path / 'run'}",
        "env.tool_format=hermes",
        "sft.enabled=false",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "cannot call tools" in errors[0] and "env.tool_format=retool" in errors[0]
    assert "tiny_tools.jinja" in errors[0]
