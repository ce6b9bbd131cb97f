"""Two data-parallel ranks (`torchrun --nproc_per_node 2`, ZeRO-3 as in the 7B configs) training
against two SGLang stand-in servers, for each weight-sync mode and version behaviour, and the
faults a run meets.

What a sync must do, checked on the servers' own counters: exactly one push per sync per server
(rank 0 pushes, rank 1 waits), no /generate arrives while a weight update is in progress, the
disk sync dir holds one checkpoint, and no rollout is lost to a version quirk. Faults: a server
refusing a push part-way through ZeRO-3's gathered export ends the run on both ranks within
seconds with the refusal in the log; a server restarted mid-run gets the weights again and the
run finishes; a trainer killed with its update group open is resumed against the server that
kept it. The same runs against the real SGLang server live in the real-server tests.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
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
    "learner.zero_stage=3",
    "learner.dtype=fp32",
]


@pytest.fixture
def two_servers(request, standin):
    from stare_tir.model import pretrained_tiny_base

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


def _command(run_dir: Path, urls: list[str], *extra: str, nproc: int = 2) -> list[str]:
    launcher = (
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc)]
        if nproc > 1
        else [sys.executable]
    )
    return [
        *launcher,
        str(SCRIPT),
        f"trainer.run_dir={run_dir}",
        *FAST,
        f"rollout.sglang.urls={json.dumps(urls)}",
        *extra,
    ]


ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _train(
    run_dir: Path, urls: list[str], *extra: str, nproc: int = 2, timeout: int = 600
) -> subprocess.CompletedProcess:
    cmd = _command(run_dir, urls, *extra, nproc=nproc)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=ENV)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "two_servers"),
    [
        ("disk", "0.5.2"),
        ("tensor", "0.5.23"),
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
        assert stats["weight_version"] == str(STEPS)  # the learner's applied steps name the weights
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


def _stats(url: str) -> dict:
    return request_sync("GET", url + "/standin_stats", timeout_s=10)


@pytest.mark.slow
@pytest.mark.parametrize("two_servers", ["0.5.23"], indirect=True)
def test_zero3_run_whose_server_refuses_a_push_ends_on_both_ranks_with_the_refusal(two_servers, tmp_path):
    """ZeRO-3 exports weights as one all-gather per parameter, on every rank. The second server
    refuses the 3rd update request: the first push's 3rd bucket, while the export is half done.
    Rank 0 must log the refusal, keep taking part in the gathers, and both ranks must stop
    within seconds (before the fix: mismatched collectives until the 120-minute timeout)."""
    _, urls = two_servers
    request_sync("POST", urls[1] + "/standin_fault", {"refuse_update": 3})
    t0 = time.monotonic()
    proc = _train(
        tmp_path / "run",
        urls,
        "rollout.sglang.weight_sync=tensor",
        "rollout.sglang.bucket_mb=0.05",  # many buckets: the refusal lands mid-export
        "learner.dist_timeout_minutes=30",
        timeout=300,
    )
    took = time.monotonic() - t0
    assert proc.returncode != 0
    assert took < 240, f"{took:.0f} s: a refused push must end the run at once"
    log = proc.stderr
    assert "stand-in refused weight update 3" in log
    cause = log.index("weight sync failed on rank 0")
    assert cause < log.index("weight sync failed on another rank")  # the cause is logged first
    assert _stats(urls[1])["counts"]["/update_weights_from_tensor"] == 3  # nothing after the refusal


@pytest.mark.slow
@pytest.mark.parametrize("two_servers", ["0.5.23"], indirect=True)
def test_a_server_restarted_mid_run_gets_the_weights_again(two_servers, tmp_path):
    """One server "restarts" during step 1's rollouts (start-up weights, no update group): its
    answers are re-run on the other server, the next step pushes to it again before it is used
    (a new group: it lost the old one), the run trains every step, and the metrics count it."""
    _, urls = two_servers
    request_sync("POST", urls[0] + "/standin_fault", {"restart_after_generates": 3})
    run_dir = tmp_path / "run"
    proc = _train(
        run_dir, urls, "rollout.sglang.weight_sync=distributed", "rollout.sglang.dist_backend=gloo", "trainer.steps=3"
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(r.get("update/skipped_empty", 0.0) == 0.0 for r in steps)
    assert sum(r.get("weights/stale_servers", 0) + r.get("weights/stale_answers", 0) for r in steps) >= 1
    restarted = _stats(urls[0])
    assert restarted["restarts"] == 1 and restarted["weight_version"] == "3"
    assert restarted["counts"]["/init_weights_update_group"] == 2  # joined a new group after it


@pytest.mark.slow
@pytest.mark.parametrize("two_servers", ["0.5.23"], indirect=True)
def test_resume_against_servers_that_kept_the_killed_trainers_group(two_servers, tmp_path):
    """A trainer SIGKILLed after its first checkpoint leaves its update group in the servers;
    `--resume` makes a new group (its own name) and finishes the run."""
    _, urls = two_servers
    run_dir = tmp_path / "run"
    extra = ["rollout.sglang.weight_sync=distributed", "rollout.sglang.dist_backend=gloo", "trainer.steps=3"]
    first = subprocess.Popen(
        _command(run_dir, urls, *extra, "trainer.save_every=1", nproc=1),
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not (run_dir / "checkpoints" / "latest").exists():
            assert first.poll() is None and time.monotonic() < deadline, "no checkpoint was written"
            time.sleep(0.2)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    assert "/destroy_weights_update_group" not in _stats(urls[0])["counts"]  # the old group stays
    proc = _train(run_dir, urls, *extra, "trainer.save_every=1", "--resume", nproc=1, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward/mean" in r][-1] == 3
    for url in urls:
        assert _stats(url)["counts"]["/init_weights_update_group"] == 2
