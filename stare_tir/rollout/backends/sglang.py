"""SGLang backends: token ids in and out, over HTTP (one or more servers) or in process.

Data path (`/generate`, SGLang's native API, not the OpenAI one, so no chat template or
re-tokenization happens server-side):

    request  {"input_ids": [...], "return_logprob": true,
              "sampling_params": {"temperature", "top_p", "top_k", "max_new_tokens",
                                  "stop": [...], "no_stop_trim": true,
                                  "skip_special_tokens": false, ["sampling_seed"]}}
    response {"text", "output_ids": [...],
              "meta_info": {"finish_reason": {"type": "stop"|"length"|"abort", "matched": ...},
                            "output_token_logprobs": [[logprob, token_id, text|null], ...], ...}}

Sampled ids and logprobs are read from `meta_info.output_token_logprobs` (one entry per sampled
token, the EOS / stop-completing token included). finish "stop" with an int `matched` is an EOS
id, with a str `matched` a stop string. SGLang reports logprobs after temperature scaling (unless
the server runs with SGLANG_RETURN_ORIGINAL_LOGPROB=1) but before top-p/top-k renormalisation;
with RL's defaults (top_p=1, top_k=-1) that is the sampling distribution.

Weight sync (`SGLangConfig.weight_sync`), as SGLang documents it:
- "disk": the learner writes an HF checkpoint; `update_weights_from_disk(path)` POSTs
  `/update_weights_from_disk {"model_path"}` to every server (a shared file system is needed).
  `update_weights(named_tensors)` in this mode writes them to `sync_dir` first.
- "tensor" (colocated: same node, same GPUs): `/update_weights_from_tensor` with
  `serialized_named_tensors` = one base64 pickle per TP rank (CUDA tensors travel as IPC handles,
  CPU tensors by value), sent in buckets of `bucket_mb`.
- "distributed" (separate GPUs, NCCL): once `/init_weights_update_group` (this process is rank
  0, server i's TP ranks follow), then per bucket `/update_weights_from_distributed
  {"names", "dtypes", "shapes", "group_name", "flush_cache"}` while rank 0 broadcasts each tensor.
- `release_memory_occupation` / `resume_memory_occupation` free and restore the servers' GPU
  memory (tags "weights", "kv_cache") when the learner shares their GPUs; `flush_cache` drops the
  radix cache.

Routing across several servers: each request goes to the server with the fewest requests in
flight (a sglang-router URL can be given as the only server instead; then list the workers in
`weight_urls`, since control calls must reach every worker). Connection failures are retried on
another server; HTTP errors are not.
"""

from __future__ import annotations

import asyncio
import base64
import io
import itertools
import pickle
import socket
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Literal, Optional

from stare_tir.rollout.backends._http import AsyncJSONClient, HTTPError, request_sync
from stare_tir.rollout.backends.base import Generation, SamplingParams

if TYPE_CHECKING:
    import torch


@dataclass
class SGLangConfig:
    """Settings of the SGLang backends."""

    # Base URLs of the SGLang servers (or of one sglang-router), e.g. ["http://10.0.0.5:30000"].
    urls: list[str] = field(default_factory=list)
    # Servers that receive control calls (weight updates, flush, memory release). Empty: `urls`.
    # Behind a sglang-router, list the workers here: the router forwards generation only.
    weight_urls: list[str] = field(default_factory=list)
    # Seconds one HTTP request may take (a long generation at low batch priority can be slow).
    timeout_s: float = 600.0
    # Retries of a request whose connection failed (on the next-least-loaded server).
    retries: int = 2
    # How `update_weights(named_tensors)` reaches the servers (see module docstring).
    weight_sync: Literal["disk", "tensor", "distributed"] = "disk"
    # Tensors per weight-update request, in MB (bounds the serialized payload / broadcast bucket).
    bucket_mb: int = 512
    # Tensor-parallel ranks per server (the distributed group has 1 + tp_size * servers ranks,
    # and "tensor" sync sends one payload per rank).
    tp_size: int = 1
    # Distributed sync: rendezvous address/port of this (rank 0) process; port 0 picks a free one.
    master_address: str = "127.0.0.1"
    master_port: int = 0
    # Distributed sync: torch.distributed backend of the weight-update group ("gloo" for tests).
    dist_backend: str = "nccl"
    group_name: str = "weight_update_group"
    # "disk" sync of named tensors: a directory every server can read (None: a local temp dir,
    # only valid when the servers run on this machine).
    sync_dir: Optional[str] = None

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s={self.timeout_s!r}: must be > 0")
        for name in ("bucket_mb", "tp_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be >= 1")
        if self.retries < 0:
            raise ValueError(f"retries={self.retries!r}: must be >= 0")
        for url in self.urls + self.weight_urls:
            if not url.startswith("http://"):
                raise ValueError(f"urls: {url!r} must start with http://")


# ---------------------------------------------------------------------------------- wire format

def sampling_payload(sampling: SamplingParams, stop: list[str]) -> dict:
    """SGLang `sampling_params` for one request (stop strings kept in the output)."""
    params: dict[str, Any] = {
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "max_new_tokens": sampling.max_new_tokens,
        "skip_special_tokens": False,
        "no_stop_trim": True,
    }
    if stop:
        params["stop"] = list(stop)
    if sampling.seed is not None:
        params["sampling_seed"] = int(sampling.seed)
    return params


def parse_generate_output(out: dict) -> Generation:
    """A `Generation` from one SGLang /generate (or Engine.async_generate) answer."""
    meta = out.get("meta_info") or {}
    pairs = meta.get("output_token_logprobs")
    if pairs is None:
        raise ValueError("SGLang answer has no meta_info.output_token_logprobs "
                         "(was return_logprob set?)")
    ids = [int(p[1]) for p in pairs]
    logprobs = [float(p[0]) for p in pairs]
    if "output_ids" in out and out["output_ids"] is not None and list(out["output_ids"]) != ids:
        raise ValueError("SGLang output_ids and output_token_logprobs disagree")
    reason = meta.get("finish_reason") or {}
    kind = reason.get("type") if isinstance(reason, dict) else str(reason)
    if kind == "length":
        return Generation(ids, logprobs, "length")
    if kind == "stop":
        matched = reason.get("matched")
        if isinstance(matched, str):
            return Generation(ids, logprobs, "stop", matched)
        return Generation(ids, logprobs, "eos")
    message = reason.get("message", "") if isinstance(reason, dict) else ""
    raise RuntimeError(f"SGLang request ended with finish_reason={reason!r} {message}")


def serialize_named_tensors(named: list[tuple[str, "torch.Tensor"]]) -> str:
    """Base64 pickle of [(name, tensor)] as SGLang's update_weights_from_tensor reads it.

    CUDA tensors: SGLang's own serializer when importable (IPC handles, device-UUID aware), else
    torch's ForkingPickler (IPC handles). CPU tensors: a plain pickle, by value.
    """
    if any(t.is_cuda for _, t in named):
        try:
            try:
                from sglang.srt.utils import MultiprocessingSerializer
            except ImportError:
                from sglang.srt.utils.common import MultiprocessingSerializer
            return MultiprocessingSerializer.serialize(named, output_str=True)
        except ImportError:
            import torch.multiprocessing  # noqa: F401  (registers the tensor reductions)
            from multiprocessing.reduction import ForkingPickler

            buf = io.BytesIO()
            ForkingPickler(buf).dump(named)
            return base64.b64encode(buf.getvalue()).decode()
    return base64.b64encode(pickle.dumps([(n, t.detach().contiguous()) for n, t in named])).decode()


def buckets(named_tensors: Iterable[tuple[str, "torch.Tensor"]], max_bytes: int
            ) -> Iterator[tuple[list[tuple[str, "torch.Tensor"]], bool]]:
    """Group (name, tensor) pairs into buckets of at most max_bytes; yields (bucket, is_last)."""
    bucket: list = []
    size = 0
    pending: Optional[list] = None
    for name, t in named_tensors:
        nbytes = t.numel() * t.element_size()
        if bucket and size + nbytes > max_bytes:
            if pending is not None:
                yield pending, False
            pending, bucket, size = bucket, [], 0
        bucket.append((name, t))
        size += nbytes
    if pending is not None:
        yield pending, not bucket
    if bucket:
        yield bucket, True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_weight_update_group(backend: str, init_method: str, world_size: int, rank: int,
                             group_name: str):
    """A torch.distributed group outside the default one, as SGLang's servers create theirs.

    Uses SGLang's own helper when importable (identical store layout guaranteed); otherwise the
    same construction: rendezvous on `init_method`, a store prefixed with the group name, and a
    process group registered under `group_name` (works whether or not a default group exists,
    e.g. next to DeepSpeed's).
    """
    try:
        from sglang.srt.utils import init_custom_process_group

        return init_custom_process_group(backend=backend, init_method=init_method,
                                         world_size=world_size, rank=rank, group_name=group_name)
    except ImportError:
        pass
    import inspect
    from datetime import timedelta

    import torch.distributed.distributed_c10d as c10d

    timeout = timedelta(minutes=10)
    store, rank, world_size = next(c10d.rendezvous(init_method, rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    opts = ("backend_options" if "backend_options" in
            inspect.signature(c10d._new_process_group_helper).parameters else "pg_options")
    pg, _ = c10d._new_process_group_helper(
        world_size, rank, [], c10d.Backend(backend), c10d.PrefixStore(group_name, store),
        group_name=group_name, timeout=timeout, **{opts: None})
    c10d._world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


def broadcast_from_rank0(group, tensor: "torch.Tensor") -> None:
    """Broadcast `tensor` from the group's rank 0, in place on the others.

    Called on the ProcessGroup object itself, so it needs no default group in this process.
    """
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    opts.rootTensor = 0
    group.broadcast([tensor], opts).wait()


def _dtype_name(t: "torch.Tensor") -> str:
    return str(t.dtype).removeprefix("torch.")


def _check_success(url: str, answer: Any) -> None:
    if isinstance(answer, dict) and answer.get("success") is False:
        raise RuntimeError(f"{url}: {answer.get('message', 'failed')}")


def _start_posts(urls: list[str], path: str, payloads: list[Any], timeout_s: float):
    """Start one POST per server in background threads; `_join` waits and raises failures.

    Weight-update calls block server-side until the broadcast that feeds them has run, so they
    must be in flight while this process broadcasts."""
    results: list[Any] = [None] * len(urls)

    def call(i: int) -> None:
        try:
            results[i] = request_sync("POST", urls[i] + path, payloads[i], timeout_s)
        except BaseException as exc:  # collected and re-raised below
            results[i] = exc

    threads = [threading.Thread(target=call, args=(i,), daemon=True) for i in range(len(urls))]
    for t in threads:
        t.start()
    return threads, results


def _join(threads, results, urls) -> list[Any]:
    for t in threads:
        t.join()
    for url, r in zip(urls, results):
        if isinstance(r, BaseException):
            if isinstance(r, HTTPError):
                raise RuntimeError(f"{url}: weight update failed: {r}") from r
            raise r
        _check_success(url, r)
    return results


# ---------------------------------------------------------------------------------- HTTP backend

class SGLangBackend:
    """Client of one or more SGLang HTTP servers (see module docstring)."""

    def __init__(self, urls: Optional[list[str]] = None, cfg: Optional[SGLangConfig] = None) -> None:
        self.cfg = cfg or SGLangConfig()
        urls = list(urls if urls is not None else self.cfg.urls)
        if not urls:
            raise ValueError("SGLangBackend needs at least one server URL")
        self.urls = [u.rstrip("/") for u in urls]
        # control calls (weights, cache, memory) go to the workers, even behind a router
        self.control_urls = [u.rstrip("/") for u in (self.cfg.weight_urls or self.urls)]
        SGLangConfig(urls=self.urls, weight_urls=self.control_urls)  # validates the URLs
        self._client = AsyncJSONClient(timeout_s=self.cfg.timeout_s)
        self._inflight = [0] * len(self.urls)
        self._rr = itertools.count()
        self._group = None
        self.weight_version = 0

    # -- data path
    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       stop: list[str]) -> Generation:
        payload = {"input_ids": list(prompt_ids), "return_logprob": True,
                   "sampling_params": sampling_payload(sampling, stop)}
        tried: set[int] = set()
        for attempt in range(self.cfg.retries + 1):
            i = self._pick(tried)
            self._inflight[i] += 1
            try:
                out = await self._client.request("POST", self.urls[i] + "/generate", payload)
                return parse_generate_output(out)
            except (ConnectionError, OSError, asyncio.TimeoutError):
                tried.add(i)
                if attempt == self.cfg.retries:
                    raise
                await asyncio.sleep(0.5 * (attempt + 1))
            finally:
                self._inflight[i] -= 1
        raise AssertionError("unreachable")

    def _pick(self, avoid: set[int]) -> int:
        cands = [i for i in range(len(self.urls)) if i not in avoid] or list(range(len(self.urls)))
        low = min(self._inflight[i] for i in cands)
        ties = [i for i in cands if self._inflight[i] == low]
        return ties[next(self._rr) % len(ties)]

    # -- control path (blocking; called by the trainer between rollout phases)
    def health(self) -> list[bool]:
        """GET /health of every generation URL (servers, or the router)."""
        ok = []
        for url in self.urls:
            try:
                request_sync("GET", url + "/health", timeout_s=30)
                ok.append(True)
            except Exception:
                ok.append(False)
        return ok

    def wait_until_healthy(self, timeout_s: float = 600.0, poll_s: float = 2.0) -> None:
        import time

        deadline = time.monotonic() + timeout_s
        while not all(self.health()):
            if time.monotonic() > deadline:
                bad = [u for u, h in zip(self.urls, self.health()) if not h]
                raise TimeoutError(f"SGLang servers not healthy after {timeout_s}s: {bad}")
            time.sleep(poll_s)

    def flush_cache(self) -> None:
        for url in self.control_urls:
            request_sync("POST", url + "/flush_cache", timeout_s=self.cfg.timeout_s)

    def release_memory_occupation(self, tags: Optional[list[str]] = None) -> None:
        for url in self.control_urls:
            request_sync("POST", url + "/release_memory_occupation", {"tags": tags},
                         self.cfg.timeout_s)

    def resume_memory_occupation(self, tags: Optional[list[str]] = None) -> None:
        for url in self.control_urls:
            request_sync("POST", url + "/resume_memory_occupation", {"tags": tags},
                         self.cfg.timeout_s)

    def update_weights_from_disk(self, path: str, load_format: Optional[str] = None) -> None:
        self._load_from_disk(path, load_format)
        self.weight_version += 1

    def _load_from_disk(self, path: str, load_format: Optional[str] = None) -> None:
        payload: dict[str, Any] = {"model_path": str(path)}
        if load_format is not None:
            payload["load_format"] = load_format
        threads, results = _start_posts(self.control_urls, "/update_weights_from_disk",
                                        [payload] * len(self.control_urls), self.cfg.timeout_s)
        _join(threads, results, self.control_urls)

    def update_weights(self, named_tensors: Iterable[tuple[str, "torch.Tensor"]]) -> None:
        mode = self.cfg.weight_sync
        if mode == "disk":
            self._update_via_disk(named_tensors)
        elif mode == "tensor":
            self._update_via_tensor(named_tensors)
        elif mode == "distributed":
            self._update_via_distributed(named_tensors)
        else:
            raise ValueError(f"weight_sync={mode!r}: must be disk, tensor or distributed")
        self.weight_version += 1

    def _update_via_disk(self, named_tensors) -> None:
        import tempfile
        from pathlib import Path

        from safetensors.torch import save_file

        out = self.cfg.sync_dir or tempfile.mkdtemp(prefix="stare-tir-sync-")
        # clone: tied weights share storage, which safetensors refuses to save twice
        state = {name: t.detach().to("cpu").clone() for name, t in named_tensors}
        Path(out).mkdir(parents=True, exist_ok=True)
        save_file(state, str(Path(out) / "model.safetensors"))
        self._load_from_disk(out)

    def _update_via_tensor(self, named_tensors) -> None:
        max_bytes = self.cfg.bucket_mb << 20
        for bucket, last in buckets(named_tensors, max_bytes):
            blob = serialize_named_tensors(bucket)
            payload = {"serialized_named_tensors": [blob] * self.cfg.tp_size,
                       "load_format": None, "flush_cache": last}
            threads, results = _start_posts(self.control_urls, "/update_weights_from_tensor",
                                         [payload] * len(self.control_urls), self.cfg.timeout_s)
            _join(threads, results, self.control_urls)

    def init_weight_update_group(self) -> None:
        """Create the NCCL (or gloo) group with every server's TP ranks; this process is rank 0."""
        cfg = self.cfg
        port = cfg.master_port or free_port()
        world = 1 + cfg.tp_size * len(self.control_urls)
        payloads = [{"master_address": cfg.master_address, "master_port": port,
                     "rank_offset": 1 + i * cfg.tp_size, "world_size": world,
                     "group_name": cfg.group_name, "backend": cfg.dist_backend}
                    for i in range(len(self.control_urls))]
        threads, results = _start_posts(self.control_urls, "/init_weights_update_group", payloads,
                                     cfg.timeout_s)
        group = init_weight_update_group(cfg.dist_backend, f"tcp://{cfg.master_address}:{port}",
                                         world, 0, cfg.group_name)
        _join(threads, results, self.control_urls)
        self._group = group

    def _update_via_distributed(self, named_tensors) -> None:
        if self._group is None:
            self.init_weight_update_group()
        max_bytes = self.cfg.bucket_mb << 20
        for bucket, last in buckets(named_tensors, max_bytes):
            payload = {"names": [n for n, _ in bucket],
                       "dtypes": [_dtype_name(t) for _, t in bucket],
                       "shapes": [list(t.shape) for _, t in bucket],
                       "group_name": self.cfg.group_name, "flush_cache": last}
            threads, results = _start_posts(self.control_urls, "/update_weights_from_distributed",
                                         [payload] * len(self.control_urls), self.cfg.timeout_s)
            for _, t in bucket:  # same order as `names`: the servers receive in that order
                broadcast_from_rank0(self._group, t.detach().contiguous())
            _join(threads, results, self.control_urls)

    def destroy_weight_update_group(self) -> None:
        if self._group is None:
            return
        threads, results = _start_posts(self.control_urls, "/destroy_weights_update_group",
                                     [{"group_name": self.cfg.group_name}] * len(self.control_urls),
                                     self.cfg.timeout_s)
        _join(threads, results, self.control_urls)
        import torch.distributed as dist

        dist.destroy_process_group(self._group)
        self._group = None

    def close(self) -> None:
        try:
            self.destroy_weight_update_group()
        except Exception:  # servers may already be gone
            self._group = None


# ---------------------------------------------------------------------------------- in-process

class SGLangEngineBackend:
    """An in-process `sglang.Engine` (GPU only; sglang is imported when this is built).

    engine_kwargs go to `sglang.Engine` (ServerArgs), e.g. tp_size, mem_fraction_static,
    enable_memory_saver=True (needed for release/resume_memory_occupation).
    Weight updates use the Engine's update_weights_from_tensor (colocated, in buckets) and
    update_weights_from_disk.
    """

    def __init__(self, model_path: str, cfg: Optional[SGLangConfig] = None, **engine_kwargs) -> None:
        try:
            import sglang
        except ImportError as exc:
            raise ImportError("the in-process SGLang backend needs sglang on a CUDA machine: "
                              "pip install 'stare-tir[sglang]'") from exc
        self.cfg = cfg or SGLangConfig()
        self.engine = sglang.Engine(model_path=model_path, **engine_kwargs)
        self.weight_version = 0

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       stop: list[str]) -> Generation:
        out = await self.engine.async_generate(input_ids=list(prompt_ids),
                                               sampling_params=sampling_payload(sampling, stop),
                                               return_logprob=True)
        return parse_generate_output(out)

    def update_weights(self, named_tensors: Iterable[tuple[str, "torch.Tensor"]]) -> None:
        for bucket, last in buckets(named_tensors, self.cfg.bucket_mb << 20):
            res = self.engine.update_weights_from_tensor(named_tensors=bucket, load_format=None,
                                                         flush_cache=last)
            _check_engine_result(res)
        self.weight_version += 1

    def update_weights_from_disk(self, path: str) -> None:
        _check_engine_result(self.engine.update_weights_from_disk(str(path)))
        self.weight_version += 1

    def flush_cache(self) -> None:
        self.engine.flush_cache()

    def release_memory_occupation(self, tags: Optional[list[str]] = None) -> None:
        self.engine.release_memory_occupation(tags=tags)

    def resume_memory_occupation(self, tags: Optional[list[str]] = None) -> None:
        self.engine.resume_memory_occupation(tags=tags)

    def close(self) -> None:
        self.engine.shutdown()


def _check_engine_result(res: Any) -> None:
    """Engine weight calls answer (success, message, ...) or a dict with "success"."""
    if isinstance(res, tuple) and res and res[0] is False:
        raise RuntimeError(f"SGLang weight update failed: {res[1] if len(res) > 1 else res}")
    if isinstance(res, dict) and res.get("success") is False:
        raise RuntimeError(f"SGLang weight update failed: {res.get('message')}")
