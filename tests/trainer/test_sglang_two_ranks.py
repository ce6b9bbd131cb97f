"""Two data-parallel ranks (`torchrun --nproc_per_node 2`) training against two SGLang stand-in
servers, for each weight-sync mode and version behaviour.

What a sync must do, checked on the servers' own counters: exactly one push per sync per server
(rank 0 pushes, rank 1 waits), no /generate arrives while a weight update is in progress, the
disk sync dir holds one checkpoint, and no rollout is lost to a version quirk. The same run
against the real SGLang server lives in the real-server tests.
"""

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
STEPS = 2

# GRPO without dynamic sampling: every step updates even when the tiny base's rewards tie, so
# each step syncs once; tiny budgets keep a step at a few seconds.
FAST = [
    "model.path=tiny",
    "sft.enabled=false",
    "algo.name=grpo",
    "trainer.backend=sglang",
    "data.arithmetic_train_size=64",
    "data.arithmetic_eval_size=2",
    "trainer.eval_n=1",
    "trainer.prompts_per_step=2",
    "rollout.n_per_prompt=2",
    "rollout.max_total_tokens=48",
    "rollout.max_new_tokens_per_turn=24",
    "trainer.eval_every=0",
    f"trainer.save_every={STEPS}",
    f"trainer.steps={STEPS}",
    "learner.zero_stage=2",
]


@pytest.fixture
def two_servers(request, standin):
    from stare_tir.tiny import pretrained_tiny_base

    compat = request.param
    procs, urls = [], []
    try:
        for _ in range(2):
            proc, url = standin.launch_standin(
                str(pretrained_tiny_base()), extra_args=["--threads", "1", "--compat", compat]
            )
            procs.append(proc)
            urls.append(url)
        yield compat, urls
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)


def _train(
    run_dir: Path, urls: list[str], *extra: str, nproc: int = 2, timeout: int = 600
) -> subprocess.CompletedProcess:
    launcher = (
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc)]
        if nproc > 1
        else [sys.executable]
    )
    cmd = [
        *launcher,
        str(SCRIPT),
        f"trainer.run_dir={run_dir}",
        *FAST,
        f"rollout.sglang.urls={json.dumps(urls)}",
        *extra,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "two_servers"),
    [
        ("disk", "0.5.2"),
        ("tensor", "0.5.23"),
        ("distributed", "0.5.23"),
        ("distributed", "0.5.2"),
    ],
    indirect=["two_servers"],
)
def test_two_ranks_push_once_per_sync_and_never_during_generation(mode, two_servers, tmp_path):
    compat, urls = two_servers
    sync_dir = tmp_path / "sync"
    run_dir = tmp_path / "run"
    proc = _train(
        run_dir,
        urls,
        f"rollout.sglang.weight_sync={mode}",
        f"rollout.sglang.sync_dir={sync_dir}",
        "rollout.sglang.dist_backend=gloo",
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    for r in steps:  # every step trained, and no rollout was lost to a version quirk
        assert r.get("update/skipped_empty", 0.0) == 0.0 and "update/loss" in r
        assert r["dropped/rollout_error"] == 0 and r["finish/error"] == 0.0

    syncs = 1 + STEPS  # the initial one (servers start from the base) + one per step
    push_path = {
        "disk": "/update_weights_from_disk",
        "tensor": "/update_weights_from_tensor",
        "distributed": "/update_weights_from_distributed",
    }[mode]
    for url in urls:
        stats = request_sync("GET", url + "/standin_stats")
        counts = stats["counts"]
        assert counts.get(push_path) == syncs, (url, counts)  # one pusher, not one per rank
        assert stats["generate_during_sync"] == 0, (url, stats)
        assert counts.get("/generate", 0) > 0
        if mode == "distributed":
            assert counts.get("/init_weights_update_group") == 1
        if mode == "disk":  # no session around disk loads
            assert "/begin_weight_update" not in counts and "/end_weight_update" not in counts
        elif compat == "0.5.23":  # one session per sync
            assert counts["/begin_weight_update"] == counts["/end_weight_update"] == syncs
        else:  # probed once, answered 404, never again
            assert counts["/begin_weight_update"] == 1 and "/end_weight_update" not in counts
        assert stats["weight_version"] == str(syncs)
    if mode == "disk":
        assert sorted(p.name for p in sync_dir.iterdir()) == ["model.safetensors"]


@pytest.mark.slow
@pytest.mark.parametrize("two_servers", ["0.5.2"], indirect=True)
def test_a_run_that_never_updates_exits_non_zero_naming_the_cause(two_servers, tmp_path):
    """0.5.2 refuses sampling_seed: with send_seed on, every rollout fails; the run must stop
    after trainer.max_empty_steps steps with a non-zero exit that says so, not exit 0."""
    _, urls = two_servers
    proc = _train(
        tmp_path / "run",
        urls,
        "rollout.sglang.send_seed=true",
        f"rollout.sglang.sync_dir={tmp_path / 'sync'}",
        "trainer.steps=6",
        "trainer.max_empty_steps=2",
        nproc=1,
        timeout=300,
    )
    assert proc.returncode != 0
    assert "2 consecutive steps (up to step 2) updated nothing" in proc.stderr
    assert "all rollouts failed" in proc.stderr and "rollout_error=4" in proc.stderr
    assert "sampling_params" in proc.stderr  # the first error says what the server refused
