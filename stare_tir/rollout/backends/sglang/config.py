"""Settings of the SGLang backends (`rollout.sglang.*`), checked when built."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

# Tags of SGLang's memory saver (python/sglang/srt/constants.py GPU_MEMORY_ALL_TYPES): releasing
# only weights and KV cache would leave the captured CUDA graphs' memory held on the shared GPUs.
MEMORY_TAGS = ("weights", "kv_cache", "cuda_graph")


@dataclass
class SGLangConfig:
    """Settings of the SGLang backends."""

    # Base URLs of the SGLang servers (or of one sglang-router), e.g. ["http://10.0.0.5:30000"].
    urls: list[str] = field(default_factory=list)
    # Servers that receive control calls (weight updates, flush, memory release). Empty: `urls`.
    # Behind a sglang-router, list the workers here: the router forwards generation only (a
    # router given as a control URL is detected and refused).
    weight_urls: list[str] = field(default_factory=list)
    # Seconds a control call (weight update, flush, memory, group set-up) may take.
    timeout_s: float = 600.0
    # Seconds the start-up checks wait for servers that are still loading (connection refused, or
    # HTTP 503 while they warm up) before the run fails naming the URL; progress is logged every
    # 30 s. A 7B server takes minutes to load, and the launch lines in the README start it in the
    # background and the trainer at once. A server that answers as something else fails at once.
    # 0: ask each server once.
    startup_timeout_s: float = 900.0
    # Seconds to open a connection to a server (a dead server fails fast and is routed around).
    connect_timeout_s: float = 30.0
    # Seconds a /generate may wait for its answer; None: no limit. Finite by default so that a
    # server that never answers (left paused by a trainer killed mid-push, or hung) ends the
    # request with an error naming the cause instead of holding the run forever. Far above any
    # real turn (a 8k-token turn at 10 tokens/s takes ~15 min): a tight limit would drop exactly
    # the long turns of a loaded server and bias the batch toward short answers.
    generate_timeout_s: float | None = 3600.0
    # Retries of a request whose connection could not be opened (on the next-least-loaded server).
    retries: int = 2
    # Which server each /generate goes to (several `urls`; see routing.py). "affinity": a turn goes
    # to the server that answered its trajectory's previous turn (its prefix is in that server's
    # radix cache), a first turn to the server that already got the same prompt (the group's
    # samples); "least_loaded": the server with the fewest requests in flight.
    routing: Literal["affinity", "least_loaded"] = "affinity"
    # Affinity's load bound: a request leaves its server when that server has more than
    # affinity_slack + affinity_slack_frac x (the least-loaded server's count) requests in flight
    # beyond the least-loaded server; it then goes there and its trajectory follows it. A move
    # prefills the whole context again while a few more requests in a server's batch cost little,
    # so only a clear imbalance moves a turn (sglang-router's cache_aware balances past 64 and 1.5x).
    affinity_slack: int = 16
    affinity_slack_frac: float = 0.5
    # Open connections per trainer rank for generation (one per request in flight; more requests
    # wait for a free one). The process's open-file limit is raised to fit when it can be.
    max_connections: int = 256
    # Seconds an idle keep-alive connection is reused. Below the server's own keep-alive (uvicorn
    # in SGLang: SGLANG_TIMEOUT_KEEP_ALIVE, 5 s): otherwise a request can be written onto a
    # connection the server is closing, and fail as "sent" (never retried, a lost trajectory).
    keepalive_s: float = 4.0
    # Send per-request seeds (`sampling_seed`). SGLang uses them only when the server runs with
    # --enable-deterministic-inference (not on CPU; GPU only), and servers before it refuse the key.
    send_seed: bool = False
    # How `update_weights(named_tensors)` reaches the servers (see the package docstring).
    weight_sync: Literal["disk", "tensor", "distributed"] = "disk"
    # Colocated layout: servers release their GPU memory while the learner computes and resume
    # it for the weight push (servers need --enable-memory-saver). Needs weight_sync disk or tensor.
    colocate: bool = False
    # Tensors per weight-update request, in MB (bounds the serialized payload / broadcast bucket).
    bucket_mb: float = 512.0
    # Tensor-parallel ranks per server. 0: read from each server's /server_info (the
    # default); a value >= 1 must equal what every server reports, or the run is refused.
    tp_size: int = 0
    # Distributed sync: rendezvous address of this (rank 0) process, which every server's TP ranks
    # connect to. "": the address this host uses to reach the servers (127.0.0.1 for local ones).
    master_address: str = ""
    # Distributed sync: rendezvous port; 0 picks a free one.
    master_port: int = 0
    # Distributed sync: torch.distributed backend of the weight-update group ("gloo" for tests).
    dist_backend: str = "nccl"
    # Distributed sync: prefix of the weight-update group's name; each group gets a unique suffix
    # (a server keeps a group after its trainer dies, and 0.5.1 cannot destroy one).
    group_name: str = "stare_tir_weights"
    # "disk" sync: a directory every server can read (shared file system across nodes), owned
    # by the trainer; it holds at most one checkpoint (model.safetensors), replaced atomically.
    sync_dir: str | None = None

    def __post_init__(self) -> None:
        for name in ("timeout_s", "connect_timeout_s", "keepalive_s", "bucket_mb"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be > 0")
        if self.startup_timeout_s < 0:
            raise ValueError(f"startup_timeout_s={self.startup_timeout_s!r}: must be >= 0 (0: ask once)")
        if self.generate_timeout_s is not None and self.generate_timeout_s <= 0:
            raise ValueError(f"generate_timeout_s={self.generate_timeout_s!r}: must be > 0 or null")
        if self.tp_size < 0:
            raise ValueError(f"tp_size={self.tp_size!r}: must be >= 1, or 0 to read it from the servers")
        if self.max_connections < 1:
            raise ValueError(f"max_connections={self.max_connections!r}: must be >= 1")
        if self.retries < 0:
            raise ValueError(f"retries={self.retries!r}: must be >= 0")
        if self.routing not in ("affinity", "least_loaded"):
            raise ValueError(f"routing={self.routing!r}: must be affinity or least_loaded")
        if self.affinity_slack < 0 or self.affinity_slack_frac < 0:
            raise ValueError(
                f"affinity_slack={self.affinity_slack!r}, affinity_slack_frac={self.affinity_slack_frac!r}: "
                "must be >= 0"
            )
        if self.weight_sync not in ("disk", "tensor", "distributed"):
            raise ValueError(f"weight_sync={self.weight_sync!r}: must be disk, tensor or distributed")
        if self.colocate and self.weight_sync == "distributed":
            raise ValueError(
                "rollout.sglang.colocate=true with weight_sync=distributed: colocated servers share "
                "the learner's GPUs, and one NCCL group cannot hold two ranks on one GPU. Use "
                "rollout.sglang.weight_sync=tensor (or disk) when colocated"
            )
        for url in self.urls + self.weight_urls:
            if not url.startswith("http://"):
                raise ValueError(f"urls: {url!r} must start with http://")


def prepare_trainer_env(cfg: SGLangConfig) -> None:
    """Process environment for an NCCL weight-update group, set before NCCL first initialises.

    SGLang's own weight-update test sets both on the trainer side "to avoid unexpected behaviors
    of CUDA and NCCL" (test/srt/test_update_weights_from_distributed.py, init_process_hf).
    """
    if cfg.weight_sync == "distributed" and cfg.dist_backend == "nccl":
        for key in ("NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE"):
            os.environ.setdefault(key, "0")
