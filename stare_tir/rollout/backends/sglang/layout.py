"""What each server really is, read once from `/server_info` before the first weight push.

0.5.23 answers `/server_info` (and the deprecated `/get_server_info`) with its resolved server
arguments (python/sglang/srt/entrypoints/http_server.py `server_info`, utils/common.py
`build_server_info`): `tp_size`, `dp_size`, `pp_size`, `nnodes`, `enable_memory_saver`,
`base_gpu_id`, `gpu_id_step`, ... Each weight-sync mode needs
some layouts and cannot work with others; a mismatch is refused here with one line naming the
key and the fix, instead of a crash inside the server:

- tensor: SGLang's scheduler gives TP rank r the payload `serialized_named_tensors[r]`
  (managers/tp_worker.py `deserialize_own_rank`): fewer payloads than TP ranks raise IndexError
  in the scheduler, which kills the server. CUDA IPC handles only open on the same node.
- distributed: TP rank r of a server joins the group as rank `rank_offset + r`
  (model_executor/model_runner_components/weight_updater.py `init_weights_update_group`), so the
  group's size and every offset depend on each server's tp_size; PP stages share tp ranks.
- tensor and distributed: data-parallel replicas are refused by an assert in the tokenizer
  manager (managers/tokenizer_control_mixin.py: "data-parallel replicas are not supported"),
  which answers a bare 500.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from stare_tir.rollout.backends._http import HTTPError, request_sync

# sglang-router (sgl-model-gateway) answers these with its worker list; an SGLang server 404s.
ROUTER_PATHS = ("/list_workers", "/workers")


@dataclass(frozen=True)
class ServerLayout:
    """One server's parallel layout, as it reported it."""

    url: str
    tp_size: int = 1
    dp_size: int = 1
    pp_size: int = 1
    nnodes: int = 1
    memory_saver: bool | None = None  # None: not reported
    version: str = ""
    # TP rank r runs on the server's visible device base_gpu_id + r * gpu_id_step (None: not
    # reported; `devices.server_gpus`)
    base_gpu_id: int | None = None
    gpu_id_step: int = 1

    def describe(self) -> str:
        """One line: "tp 2" (and dp/pp/nnodes when not 1, the version when reported)."""
        parts = [f"tp {self.tp_size}"]
        parts += [
            f"{k} {v}" for k, v in (("dp", self.dp_size), ("pp", self.pp_size), ("nnodes", self.nnodes)) if v != 1
        ]
        if self.version:
            parts.append(f"sglang {self.version}")
        return ", ".join(parts)

    @classmethod
    def from_info(cls, url: str, info: dict[str, Any]) -> ServerLayout:
        return cls(
            url=url,
            tp_size=int(info.get("tp_size") or 1),
            dp_size=int(info.get("dp_size") or 1),
            pp_size=int(info.get("pp_size") or 1),
            nnodes=int(info.get("nnodes") or 1),
            memory_saver=info.get("enable_memory_saver"),
            version=str(info.get("version", "")),
            base_gpu_id=int(info["base_gpu_id"]) if info.get("base_gpu_id") is not None else None,
            gpu_id_step=int(info.get("gpu_id_step") or 1),
        )


def is_router(url: str, timeout_s: float) -> bool:
    """True when `url` answers like a sglang-router (a worker list), not like a server."""
    for path in ROUTER_PATHS:
        try:
            request_sync("GET", url + path, timeout_s=timeout_s)
            return True
        except HTTPError:
            continue
    return False


def read_layout(url: str, timeout_s: float) -> ServerLayout:
    """GET /server_info of one control URL (a router there is refused)."""
    if is_router(url, timeout_s):
        raise ValueError(
            f"rollout.sglang control URL {url} is a sglang-router (it lists workers): weight updates "
            "must reach every worker, and the router does not forward them. List the workers' URLs "
            "in rollout.sglang.weight_urls"
        )
    info = get_info(url, "server_info", timeout_s)
    return ServerLayout.from_info(url, info if isinstance(info, dict) else {})


def get_info(url: str, name: str, timeout_s: float) -> dict:
    """GET /<name> (0.5.23), else the older /get_<name> that 0.5.23 still answers but logs as
    deprecated on every call; {} when neither exists (one TP rank and no version are assumed)."""
    for path in (f"/{name}", f"/get_{name}"):
        try:
            info = request_sync("GET", url + path, timeout_s=timeout_s)
            return info if isinstance(info, dict) else {}
        except HTTPError as exc:
            if exc.status != 404:
                raise
    return {}


def check_layouts(layouts: list[ServerLayout], weight_sync: str, tp_size: int, colocate: bool) -> list[ServerLayout]:
    """Refuse layouts `weight_sync` cannot serve; return them unchanged otherwise.

    tp_size: the configured value (0: adopt what each server reports).
    """
    for lay in layouts:
        if tp_size and lay.tp_size != tp_size:
            raise ValueError(
                f"rollout.sglang.tp_size={tp_size} but {lay.url} reports tp_size={lay.tp_size}: set "
                "rollout.sglang.tp_size=0 (read it from the servers) or to the servers' --tp"
            )
        if weight_sync == "disk":
            continue
        if lay.dp_size > 1:
            raise ValueError(
                f"{lay.url} reports dp_size={lay.dp_size}: SGLang refuses weight_sync={weight_sync} "
                "with data-parallel replicas. Start one server per replica (--dp-size 1) and list "
                "every URL in rollout.sglang.urls, or use rollout.sglang.weight_sync=disk"
            )
        if lay.pp_size > 1:
            raise ValueError(
                f"{lay.url} reports pp_size={lay.pp_size}: weight_sync={weight_sync} addresses TP "
                "ranks only (pipeline stages would share them). Use rollout.sglang.weight_sync=disk "
                "or servers with --pp-size 1"
            )
        if weight_sync == "tensor" and lay.nnodes > 1:
            raise ValueError(
                f"{lay.url} reports nnodes={lay.nnodes}: weight_sync=tensor passes CUDA IPC handles, "
                "which open only on this node. Use rollout.sglang.weight_sync=distributed or disk"
            )
    if colocate:
        for lay in layouts:
            if lay.memory_saver is False:
                raise ValueError(
                    f"rollout.sglang.colocate=true but {lay.url} runs without the memory saver: "
                    "start it with --enable-memory-saver (or set rollout.sglang.colocate=false)"
                )
    return layouts


def host_of(url: str) -> str:
    return urlsplit(url).hostname or ""


def is_local_host(host: str) -> bool:
    """True when `host` resolves to an address of this machine (loopback, or one it can bind)."""
    try:
        addrs = {a[4][0] for a in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except OSError:
        return False
    for addr in addrs:
        if ipaddress.ip_address(addr.split("%")[0]).is_loopback:
            return True
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            try:
                s.bind((addr, 0))  # only this machine's own addresses can be bound
                return True
            except OSError:
                continue
    return False


def route_address(host: str) -> str:
    """The address of this machine that packets to `host` leave from (no packet is sent)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))  # a UDP connect only picks the route
        return s.getsockname()[0]


def master_address(configured: str, urls: list[str]) -> str:
    """The rendezvous address the servers' TP ranks connect to (see `SGLangConfig.master_address`).

    A loopback address with a server on another host is refused: that server's ranks would
    connect to themselves and time out after `timeout_s`.
    """
    remote = [u for u in urls if not is_local_host(host_of(u))]
    if configured:
        loopback = _is_loopback(configured)
        if loopback and remote:
            raise ValueError(
                f"rollout.sglang.master_address={configured} is a loopback address but {remote[0]} "
                "runs on another host: set it to this node's address that the servers can reach "
                "(or leave it empty to pick the route to the servers)"
            )
        return configured
    if not remote:
        return "127.0.0.1"
    return route_address(host_of(remote[0]))


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
