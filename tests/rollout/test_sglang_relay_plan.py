"""Which trainer rank feeds which TP rank in the colocated per-rank tensor push (relay.py), and
which GPU a server's TP rank runs on (devices.py `server_gpus`), without processes or servers.
The protocol itself, over two real ranks: tests/trainer/test_sglang_relay_two_ranks.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stare_tir.rollout.backends.sglang.devices import server_gpus
from stare_tir.rollout.backends.sglang.layout import ServerLayout
from stare_tir.rollout.backends.sglang.relay import TensorRelay, map_sources, plan_relay

PORT = 30007


def fake_proc(root: Path, visible: str | None, port: int = PORT) -> Path:
    """A /proc with one process (pid 42) listening on `port`, its CUDA_VISIBLE_DEVICES `visible`."""
    (root / "net").mkdir(parents=True)
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    row = f"   0: 0100007F:{port:04X} 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000 0 777 1\n"
    (root / "net" / "tcp").write_text(header + row)
    (root / "42" / "fd").mkdir(parents=True)
    os.symlink("socket:[777]", root / "42" / "fd" / "3")
    env = b"PATH=/bin\0" + (f"CUDA_VISIBLE_DEVICES={visible}".encode() + b"\0" if visible is not None else b"")
    (root / "42" / "environ").write_bytes(env)
    return root


URL = f"http://127.0.0.1:{PORT}"
NVIDIA_SMI = {"0": "GPU-a", "1": "GPU-b", "2": "GPU-c", "3": "GPU-d"}.copy


@pytest.mark.parametrize(
    ("visible", "base", "expected"),
    [
        ("GPU-a,GPU-b,GPU-c,GPU-d", 2, ["GPU-c", "GPU-d"]),  # UUIDs, from the base GPU on
        ("3,1", 0, ["GPU-d", "GPU-b"]),  # indices: nvidia-smi's numbering
        (None, 1, ["GPU-b", "GPU-c"]),  # unset: every GPU of the node
    ],
)
def test_a_tp_ranks_gpu_is_the_base_plus_its_rank_among_the_servers_visible_gpus(tmp_path, visible, base, expected):
    proc = fake_proc(tmp_path, visible)
    lay = ServerLayout(url=URL, tp_size=2, base_gpu_id=base)
    assert server_gpus(URL, lay, proc=proc, index_to_uuid=NVIDIA_SMI) == (expected, "")


def test_a_gpu_step_skips_gpus(tmp_path):
    lay = ServerLayout(url=URL, tp_size=2, base_gpu_id=0, gpu_id_step=2)
    assert server_gpus(URL, lay, proc=fake_proc(tmp_path, ""), index_to_uuid=NVIDIA_SMI)[0] == ["GPU-a", "GPU-c"]


@pytest.mark.parametrize(
    ("visible", "layout", "smi", "why"),
    [
        ("GPU-a", ServerLayout(url=URL, tp_size=2, base_gpu_id=0), NVIDIA_SMI, "TP rank 1 uses visible GPU 1"),
        ("GPU-a", ServerLayout(url=URL, tp_size=1), NVIDIA_SMI, "does not report base_gpu_id"),
        ("0", ServerLayout(url=URL, tp_size=1, base_gpu_id=0), lambda: None, "has no UUID here"),
    ],
)
def test_a_gpu_that_cannot_be_read_is_unknown_with_the_reason(tmp_path, visible, layout, smi, why):
    gpus, reason = server_gpus(URL, layout, proc=fake_proc(tmp_path, visible), index_to_uuid=smi)
    assert gpus is None and why in reason


def test_a_server_whose_process_is_not_readable_is_unknown(tmp_path):
    proc = fake_proc(tmp_path, "GPU-a", port=PORT + 1)  # nothing listens on the server's port
    gpus, why = server_gpus(URL, ServerLayout(url=URL, base_gpu_id=0), proc=proc)
    assert gpus is None and "not readable here" in why


def test_server_info_gives_the_base_gpu_and_step():
    lay = ServerLayout.from_info(URL, {"tp_size": 4, "base_gpu_id": 4, "gpu_id_step": 1})
    assert (lay.base_gpu_id, lay.gpu_id_step) == (4, 1)
    assert ServerLayout.from_info(URL, {}).base_gpu_id is None  # not reported: no map, no guess


S1, S2 = ServerLayout(url="http://s1", tp_size=2), ServerLayout(url="http://s2", tp_size=2)


def test_two_servers_of_tp_2_on_four_ranks_each_tp_rank_from_its_gpu():
    ranks = ["aaaa", "bbbb", "cccc", "dddd"]  # torch's UUIDs (no prefix) match nvidia-smi's
    servers = [(["GPU-cccc", "GPU-dddd"], ""), (["GPU-aaaa", "GPU-bbbb"], "")]  # s1 on GPUs 2,3
    assert map_sources([S1, S2], ranks, servers) == ([[2, 3], [0, 1]], "")


@pytest.mark.parametrize(
    ("ranks", "servers", "why"),
    [
        ([None, None], [(["GPU-a", "GPU-b"], "")], "not on a GPU"),
        (["a", "b"], [(["GPU-a", "GPU-c"], "")], "http://s1 TP rank 1 runs on GPU GPU-c, where no trainer rank runs"),
        (["a", "b"], [(None, "its process is not readable")], "its process is not readable"),
    ],
)
def test_no_map_when_a_tp_rank_has_no_trainer_rank_on_its_gpu(ranks, servers, why):
    sources, reason = map_sources([S1], ranks, servers)
    assert sources is None and why in reason


class Peer:
    """Rank 0 of a 2-rank world whose peer reports `peer_gpu` and contributes nothing else."""

    rank, world_size = 0, 2

    def __init__(self, peer_gpu: str) -> None:
        self.peer_gpu = peer_gpu

    def gather_object(self, obj):
        return [obj, self.peer_gpu]

    def all_reduce_sum(self, x):
        return x


def test_a_rank_feeding_two_servers_serializes_one_payload_for_each(monkeypatch):
    """Two tp-1 servers on rank 0's GPU: rank 0 makes two payloads per bucket, one per server
    (each opened exactly once: CUDA-IPC refcounts)."""
    import stare_tir.rollout.backends.sglang.relay as relay_mod

    monkeypatch.setattr(relay_mod, "this_gpu", lambda: "aaaa")
    relay = plan_relay(Peer("bbbb"), lambda gpus: [[0], [0]] if gpus == ["aaaa", "bbbb"] else None, 1 << 20)
    assert isinstance(relay, TensorRelay) and relay.mine == 2
    assert relay.picks == [[(0, 0)], [(0, 1)]]
    assert plan_relay(Peer("bbbb"), lambda gpus: None, 1 << 20) is None  # no map: one pusher
