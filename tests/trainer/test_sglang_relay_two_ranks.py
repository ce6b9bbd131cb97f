"""Colocated tensor sync fed by every trainer rank (rollout/backends/sglang/relay.py): two gloo
ranks (relay_rank.py) run `sync_weights` against one stand-in server with two TP ranks, each TP
rank opening its own payload in its own process (`--rank-processes`) and reporting digests of what
it received.

The ranks' weights differ (100 * rank + index) and each rank reports a GPU UUID; the server runs
with CUDA_VISIBLE_DEVICES naming two GPUs, read from its process. So the server can tell which
rank serialized the payload of each TP rank: with the map, TP rank r holds trainer rank r's
weights (rank 0 serializing everything, the code before the relay, gives TP rank 1 rank 0's);
without it (a TP rank's GPU hosts no trainer rank) both hold rank 0's and rank 0 logs why. A
refusal on bucket 3, a failed serialize on rank 1, and a rank 0 failing before its first bucket
each end both ranks with the cause within seconds (never a wait in a gather).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stare_tir.rollout.backends._http import request_sync
from stare_tir.rollout.backends._weights import free_port

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "relay_rank.py"
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "rollout"))

from relay_rank import N_WEIGHTS, weight  # noqa: E402
from sglang_standin_cuda import digest  # noqa: E402

SERVER_GPUS = "GPU-aaaa-0000,GPU-bbbb-1111"  # the server's CUDA_VISIBLE_DEVICES: TP rank r on the r-th
MAPPED = "aaaa-0000,bbbb-1111"  # torch's form of the same UUIDs (no "GPU-" prefix)
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def server(standin, tmp_path_factory):
    from stare_tir.model import pretrained_tiny_base

    proc, url = standin.launch_standin(
        str(pretrained_tiny_base()),
        extra_args=["--threads", "1", "--tp-size", "2", "--rank-processes"],
        env={"CUDA_VISIBLE_DEVICES": SERVER_GPUS},
    )
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _stats(url: str) -> dict:
    return request_sync("GET", url + "/standin_stats", timeout_s=10)


def _pushes(url: str) -> int:
    return _stats(url)["counts"].get("/update_weights_from_tensor", 0)


def _two_ranks(url: str, scenario: str, gpus: str, tmp_path: Path, timeout: float = 150) -> tuple[list[dict], str]:
    """Both ranks' results and rank 0's log; fails (never hangs) when a rank does not end."""
    port = free_port()
    procs, outs = [], []
    for rank in (0, 1):
        out = tmp_path / f"rank{rank}.json"
        outs.append(out)
        cmd = [sys.executable, str(SCRIPT), str(rank), str(port), url, scenario, str(out), str(tmp_path), gpus]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV))
    logs = []
    try:
        for proc in procs:
            _, err = proc.communicate(timeout=timeout)
            logs.append(err)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for proc, log in zip(procs, logs):
        assert proc.returncode == 0, log[-3000:]
    return [json.loads(o.read_text()) for o in outs], logs[0]


def _received(url: str) -> list[dict[str, list[int]]]:
    reports = sorted(_stats(url)["rank_reports"], key=lambda r: r["rank"])
    return [r["digests"] for r in reports]


def _expected(rank: int) -> dict[str, list[int]]:
    return {f"w{i}": digest(weight(rank, i)) for i in range(N_WEIGHTS)}


@pytest.mark.slow
def test_each_tp_rank_gets_the_payload_of_the_trainer_rank_on_its_gpu(server, tmp_path):
    before = _pushes(server)
    results, log = _two_ranks(server, "push", MAPPED, tmp_path)
    assert [r["error"] for r in results] == [None, None], results
    assert [r["exported"] for r in results] == [N_WEIGHTS, N_WEIGHTS]
    received = _received(server)
    assert received[0] == _expected(0)
    assert received[1] == _expected(1)  # serialized by trainer rank 1, not by rank 0
    assert _pushes(server) - before == 4  # 4 buckets, one request each: one pusher
    assert "each TP rank reads from the trainer rank on its GPU" in log


@pytest.mark.slow
def test_without_a_trainer_rank_on_every_tp_ranks_gpu_rank_0_serializes_all_and_says_why(server, tmp_path):
    results, log = _two_ranks(server, "push", "aaaa-0000,cccc-2222", tmp_path)  # rank 1 on another GPU
    assert [r["error"] for r in results] == [None, None], results
    received = _received(server)
    assert received[0] == received[1] == _expected(0)
    lines = [line for line in log.splitlines() if "trainer rank 0 serializes every TP rank's payload" in line]
    assert len(lines) == 1, log[-3000:]
    assert "TP rank 1 runs on GPU GPU-bbbb-1111, where no trainer rank runs" in lines[0]


@pytest.mark.slow
def test_a_refusal_on_bucket_3_ends_both_ranks_with_the_cause(server, tmp_path):
    request_sync("POST", server + "/standin_fault", {"refuse_update": 3})
    try:
        before = _pushes(server)
        t0 = time.monotonic()
        results, log = _two_ranks(server, "push", MAPPED, tmp_path)
        took = time.monotonic() - t0
    finally:
        request_sync("POST", server + "/standin_fault", {"refuse_update": 0})
    rank0, rank1 = results
    assert "stand-in refused weight update 3" in rank0["error"]
    assert "failed on another rank" in rank1["error"]
    assert [r["exported"] for r in results] == [N_WEIGHTS, N_WEIGHTS]  # both drained the export
    assert _pushes(server) - before == 3  # nothing after the refused bucket
    assert max(r["elapsed_s"] for r in results) < 20 and took < 120
    assert "weight sync failed on rank 0" in log  # the cause, logged where it happened


@pytest.mark.slow
def test_a_failed_serialize_on_rank_1_ends_both_ranks_with_the_cause(server, tmp_path):
    before = _pushes(server)
    results, _ = _two_ranks(server, "serialize_fails", MAPPED, tmp_path)
    rank0, rank1 = results
    assert "injected serialize failure on rank 1" in rank1["error"]
    assert "trainer rank 1 could not serialize weight bucket 2" in rank0["error"]
    assert "injected serialize failure" in rank0["error"]  # rank 0 names the cause too
    assert _pushes(server) - before == 1  # bucket 1 only
    assert max(r["elapsed_s"] for r in results) < 20


@pytest.mark.slow
def test_rank_0_failing_before_its_first_bucket_releases_rank_1_from_the_gather(server, tmp_path):
    before = _pushes(server)
    results, _ = _two_ranks(server, "early_failure", MAPPED, tmp_path)
    rank0, rank1 = results
    assert "resuming the weights' memory failed" in rank0["error"]
    assert "failed on another rank" in rank1["error"]
    assert [r["exported"] for r in results] == [N_WEIGHTS, N_WEIGHTS]
    assert _pushes(server) - before == 0
    assert max(r["elapsed_s"] for r in results) < 20
