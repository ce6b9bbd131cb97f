"""Asynchronous training (trainer.max_staleness=1) with two data-parallel ranks (`torchrun`, gloo,
ZeRO-3 as in the 7B configs) against an SGLang stand-in whose generation is slow enough to still run
when the learner pushes: every push after the start pauses the server (retract), loads, flushes and
continues; nothing is generated while the weights change; each step trains one version behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stare_tir.rollout.backends._http import request_sync

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "train_tir.py"
STEPS = 3


@pytest.mark.slow
def test_two_ranks_train_one_version_behind_while_the_server_generates(standin, tmp_path):
    from stare_tir.model import pretrained_tiny_base

    proc, url = standin.launch_standin(
        str(pretrained_tiny_base()), extra_args=["--threads", "1", "--token-delay-s", "0.02"]
    )
    try:
        run_dir = tmp_path / "run"
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(SCRIPT),
            f"trainer.run_dir={run_dir}", "model.path=tiny", "sft.enabled=false", "algo.name=grpo",
            "trainer.backend=sglang", f"rollout.sglang.urls={json.dumps([url])}", "rollout.sglang.weight_sync=tensor",
            "data.arithmetic_train_size=64", "data.arithmetic_eval_size=2", "trainer.prompts_per_step=4",
            "rollout.n_per_prompt=2", "rollout.max_total_tokens=48", "rollout.max_new_tokens_per_turn=24",
            "trainer.eval_every=0", f"trainer.save_every={STEPS}", f"trainer.steps={STEPS}",
            "learner.zero_stage=3", "learner.dtype=fp32", "trainer.max_staleness=1", "algo.off_policy.mode=tis",
        ]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
        assert done.returncode == 0, done.stderr[-4000:]
        stats = request_sync("GET", url + "/standin_stats")
    finally:
        proc.terminate()
        proc.wait(timeout=30)

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    assert [r["async/lag_max"] for r in steps] == [0.0] + [1.0] * (STEPS - 1)  # never beyond eta
    for r in steps:
        assert r["update/synced"] == 1.0 and r["dropped/stale"] == 0 and r["dropped/rollout_error"] == 0
        assert "offpolicy/weight_mean" in r  # the behaviour weights entered the loss
    # Tokens sampled before each mid-generation push carry the old version: they train one behind.
    assert all(r["offpolicy/lag1/frac"] > 0 for r in steps[1:]), [r.get("offpolicy/lag1/frac") for r in steps]
    counts = stats["counts"]
    assert counts["/update_weights_from_tensor"] == 1 + STEPS  # rank 0 alone pushes: start + each step
    assert stats["pauses"]["retract"] == STEPS  # every push while generating paused the server
    # one per pause, and one at start (clears any pause a killed trainer left)
    assert counts["/continue_generation"] == STEPS + 1
    assert stats["tokens_during_update"] == 0 and stats["weight_version"] == str(STEPS)
    # Both ranks' rounds were saved with the last checkpoint? None is scheduled past the last step.
    ckpt = run_dir / "checkpoints" / f"step_{STEPS:06d}"
    assert sorted(p.name for p in ckpt.glob("async_rounds_rank*.pt")) == [
        "async_rounds_rank0.pt",
        "async_rounds_rank1.pt",
    ]
