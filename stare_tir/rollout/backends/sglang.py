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

Sampled ids and logprobs come from `meta_info.output_token_logprobs` (one entry per sampled
token, the EOS / stop-completing token included). `output_ids` is only cross-checked: SGLang
0.5.0-0.5.4 prefixed it with up to 5 prompt ids (the detokenizer returned its incremental
`decode_ids`, python/sglang/srt/managers/detokenizer_manager.py; upstream issues 10896, 17240).
The finish is classified by `base.classify_finish` from the last token, not only from the
server's reason: older servers checked the token budget before EOS and stop strings
(schedule_batch.py `check_finished`), and a `matched` string that is not one of the request's
stops (e.g. "NaN happened" for an invalid token) fails the call instead of counting as a stop.
SGLang reports logprobs after temperature scaling (unless SGLANG_RETURN_ORIGINAL_LOGPROB=1) but
before top-p/top-k renormalisation; with RL's defaults (top_p=1, top_k=-1) that is the sampling
distribution.

Seeds: `sampling_seed` is used only by servers started with --enable-deterministic-inference
(python/sglang/srt/sampling/sampling_batch_info.py) and is refused by servers that predate it,
so it is sent only with `send_seed`, reduced below 2**31.

Weight sync (`SGLangConfig.weight_sync`). The trainer calls it on ONE process (rank 0) while the
other ranks wait, after every rank has finished its rollouts: no generation runs during a sync.
- "disk": the learner's tensors are written to `sync_dir/model.safetensors` (temp name, then an
  atomic rename; one checkpoint at most) and every server POSTs `/update_weights_from_disk`.
  `sync_dir` must be readable by every server (a shared file system across nodes).
- "tensor" (colocated: same node): `/update_weights_from_tensor` with `serialized_named_tensors`
  = one base64 pickle per TP rank (CUDA tensors travel as IPC handles, CPU tensors by value).
- "distributed" (separate GPUs): once `/init_weights_update_group` (this process is rank 0 of a
  group of 1 + tp_size * servers ranks), then per bucket `/update_weights_from_distributed` while
  rank 0 broadcasts each tensor; a refused request aborts the broadcast at once (no hang).
tensor and distributed run inside `/begin_weight_update` ... `/end_weight_update` on servers that
have it (0.5.23 refuses them otherwise: managers/scheduler_components/weight_updater.py); a 404
marks an older server that needs no session. Updates are sent with flush_cache=false and the
cache is flushed afterwards with `/flush_cache`, retried while it answers 400 (0.5.23 refuses a
flush while a request is still being retired, and then fails the whole update).
`release_memory_occupation` / `resume_memory_occupation` free and restore the servers' GPU memory
(tags "weights", "kv_cache") in the colocated layout (`colocate`).

Routing: each request goes to the server with the fewest requests in flight. Behind a
sglang-router give the router as the only URL and list the workers in `weight_urls`: control
calls (weights, flush, memory) must reach every worker, never the router, and the distributed
group's size counts the workers. A connect failure (nothing sent) is retried on another server;
a failure after the request was sent is raised, never re-run.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Literal

from loguru import logger

from stare_tir.rollout.backends._http import AsyncJSONClient, HTTPError, NotSentError, request_sync
from stare_tir.rollout.backends._weights import (  # noqa: F401  (re-exported: tests, stand-in)
    Posts,
    broadcast_from_rank0,
    buckets,
    dtype_name,
    free_port,
    init_weight_update_group,
    serialize_named_tensors,
)
from stare_tir.rollout.backends.base import Generation, SamplingParams, classify_finish, fast_decoder

if TYPE_CHECKING:
    import torch

SYNC_FILE = "model.safetensors"
SEED_MOD = 2**31 - 1  # SGLang keeps seeds in an int64 tensor, but some kernels take int32


@dataclass
class SGLangConfig:
    """Settings of the SGLang backends."""

    # Base URLs of the SGLang servers (or of one sglang-router), e.g. ["http://10.0.0.5:30000"].
    urls: list[str] = field(default_factory=list)
    # Servers that receive control calls (weight updates, flush, memory release). Empty: `urls`.
    # Behind a sglang-router, list the workers here: the router forwards generation only.
    weight_urls: list[str] = field(default_factory=list)
    # Seconds a control call (weight update, flush, memory, group set-up) may take.
    timeout_s: float = 600.0
    # Seconds to open a connection to a server (a dead server fails fast and is routed around).
    connect_timeout_s: float = 30.0
    # Seconds a /generate may wait for its answer; None: no limit. A limit drops exactly the
    # long turns of a loaded server (and biases the batch to short answers); keep None unless
    # a hung server must be detected.
    generate_timeout_s: float | None = None
    # Retries of a request whose connection could not be opened (on the next-least-loaded server).
    retries: int = 2
    # Send per-request seeds (`sampling_seed`). SGLang uses them only when the server runs with
    # --enable-deterministic-inference (not on CPU; GPU only), and servers before it refuse the key.
    send_seed: bool = False
    # How `update_weights(named_tensors)` reaches the servers (see module docstring).
    weight_sync: Literal["disk", "tensor", "distributed"] = "disk"
    # Colocated layout: servers release their GPU memory while the learner computes and resume
    # it for the weight push (servers need --enable-memory-saver).
    colocate: bool = False
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
    # "disk" sync: a directory every server can read (shared file system across nodes), owned
    # by the trainer; it holds at most one checkpoint (model.safetensors), replaced atomically.
    sync_dir: str | None = None

    def __post_init__(self) -> None:
        for name in ("timeout_s", "connect_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be > 0")
        if self.generate_timeout_s is not None and self.generate_timeout_s <= 0:
            raise ValueError(f"generate_timeout_s={self.generate_timeout_s!r}: must be > 0 or null")
        for name in ("bucket_mb", "tp_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be >= 1")
        if self.retries < 0:
            raise ValueError(f"retries={self.retries!r}: must be >= 0")
        if self.weight_sync not in ("disk", "tensor", "distributed"):
            raise ValueError(f"weight_sync={self.weight_sync!r}: must be disk, tensor or distributed")
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


# ---------------------------------------------------------------------------------- wire format


def sampling_payload(sampling: SamplingParams, stop: list[str], send_seed: bool = True) -> dict:
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
    if send_seed and sampling.seed is not None:
        params["sampling_seed"] = int(sampling.seed) % SEED_MOD
    return params


def parse_generate_output(
    out: dict, stop: list[str] | None = None, eos_ids: Iterable[int] = (), decode=None
) -> Generation:
    """A `Generation` from one SGLang /generate (or Engine.async_generate) answer.

    stop: the request's stop strings; eos_ids / decode (ids -> text) from the policy's tokenizer
    make the finish classification exact (see `base.classify_finish`).
    """
    meta = out.get("meta_info") or {}
    pairs = meta.get("output_token_logprobs")
    if pairs is None:
        raise ValueError("SGLang answer has no meta_info.output_token_logprobs (was return_logprob set?)")
    ids = [int(p[1]) for p in pairs]
    logprobs = [float(p[0]) for p in pairs]
    out_ids = out.get("output_ids")
    if out_ids is not None and list(out_ids) != ids:
        # 0.5.0-0.5.4 prefix output_ids with prompt ids (see module docstring): the sampled ids
        # must still end it; anything else is a real disagreement.
        if not ids or list(out_ids[-len(ids) :]) != ids:
            raise ValueError(
                f"SGLang output_ids ({len(out_ids)} ids) do not end with the "
                f"{len(ids)} ids of output_token_logprobs: they disagree"
            )
    reason = meta.get("finish_reason") or {}
    kind = reason.get("type") if isinstance(reason, dict) else str(reason)
    if kind not in ("stop", "length"):
        message = reason.get("message", "") if isinstance(reason, dict) else ""
        raise RuntimeError(f"SGLang request ended with finish_reason={reason!r} {message}")
    finish, stop_text = classify_finish(
        ids,
        list(stop or []),
        frozenset(eos_ids),
        decode,
        kind,
        reason.get("matched") if isinstance(reason, dict) else None,
        out.get("text"),
    )
    return Generation(ids, logprobs, finish, stop_text)


# ---------------------------------------------------------------------------------- HTTP backend


class SGLangBackend:
    """Client of one or more SGLang HTTP servers (see module docstring).

    tokenizer: the policy's tokenizer; with it the finish of every answer is classified from its
    last token (EOS ids, stop strings decoded exactly as the HF backend does). Without it, EOS is
    taken from the server's `matched` and stop strings are searched in the returned text.
    eos_token_ids: more EOS ids (the model's generation_config ones).
    """

    # One set of servers serves every trainer rank: exactly one rank pushes weights.
    shared_by_ranks = True

    def __init__(
        self,
        urls: list[str] | None = None,
        cfg: SGLangConfig | None = None,
        tokenizer: Any = None,
        eos_token_ids: Iterable[int] = (),
    ) -> None:
        self.cfg = cfg or SGLangConfig()
        urls = list(urls if urls is not None else self.cfg.urls)
        if not urls:
            raise ValueError("SGLangBackend needs at least one server URL")
        self.urls = [u.rstrip("/") for u in urls]
        # control calls (weights, cache, memory) go to the workers, even behind a router
        self.control_urls = [u.rstrip("/") for u in (self.cfg.weight_urls or self.urls)]
        SGLangConfig(urls=self.urls, weight_urls=self.control_urls)  # validates the URLs
        self._client = AsyncJSONClient(
            connect_timeout_s=self.cfg.connect_timeout_s, read_timeout_s=self.cfg.generate_timeout_s
        )
        # EOS ids: the tokenizer's plus `eos_token_ids` (e.g. the model's generation_config ones,
        # which SGLang also stops on: schedule_batch.py `eos_token_ids`)
        eos = set(eos_token_ids)
        self._decode = None
        if tokenizer is not None:
            if tokenizer.eos_token_id is not None:
                eos.add(tokenizer.eos_token_id)
            self._decode = fast_decoder(tokenizer)
        self._eos_ids: frozenset[int] = frozenset(int(e) for e in eos)
        self._inflight = [0] * len(self.urls)
        self._rr = itertools.count()
        self._group = None
        self._has_session: dict[str, bool] = {}  # url -> server has begin/end_weight_update
        self._released: set[str] = set()
        self.weight_version = 0

    # -- data path
    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, stop: list[str]) -> Generation:
        payload = {
            "input_ids": list(prompt_ids),
            "return_logprob": True,
            "sampling_params": sampling_payload(sampling, stop, self.cfg.send_seed),
        }
        tried: set[int] = set()
        for attempt in range(self.cfg.retries + 1):
            i = self._pick(tried)
            self._inflight[i] += 1
            try:
                out = await self._client.request("POST", self.urls[i] + "/generate", payload)
            except NotSentError:
                # Nothing reached the server: another one may take it. Any failure after the
                # request went out is raised: a generate is never silently run twice.
                tried.add(i)
                if attempt == self.cfg.retries:
                    raise
                await asyncio.sleep(0.5 * (attempt + 1))
                continue
            finally:
                self._inflight[i] -= 1
            return parse_generate_output(out, stop, self._eos_ids, self._decode)
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
        deadline = time.monotonic() + timeout_s
        while not all(self.health()):
            if time.monotonic() > deadline:
                bad = [u for u, h in zip(self.urls, self.health()) if not h]
                raise TimeoutError(f"SGLang servers not healthy after {timeout_s}s: {bad}")
            time.sleep(poll_s)

    def flush_cache(self, tries: int = 40, wait_s: float = 0.25) -> None:
        """POST /flush_cache to every server, retried while it answers 400: a server refuses to
        flush while a request is still being retired (http_server.py `flush_cache`)."""
        for url in self.control_urls:
            for attempt in range(tries):
                try:
                    request_sync("POST", url + "/flush_cache", timeout_s=self.cfg.timeout_s)
                    break
                except HTTPError as exc:
                    if exc.status != 400 or attempt == tries - 1:
                        raise RuntimeError(f"{url}/flush_cache refused {attempt + 1} times: {exc}") from exc
                    time.sleep(wait_s)

    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        tags = list(tags or ["weights", "kv_cache"])
        for url in self.control_urls:
            request_sync("POST", url + "/release_memory_occupation", {"tags": tags}, self.cfg.timeout_s)
        self._released |= set(tags)

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        """Resume the released tags among `tags` (all: None); resuming twice is a no-op here."""
        todo = sorted(self._released & set(tags or self._released))
        if not todo:
            return
        for url in self.control_urls:
            request_sync("POST", url + "/resume_memory_occupation", {"tags": todo}, self.cfg.timeout_s)
        self._released -= set(todo)

    def update_weights_from_disk(self, path: str, load_format: str | None = None) -> None:
        self._load_from_disk(path, load_format)
        self.weight_version += 1

    def _load_from_disk(self, path: str, load_format: str | None = None) -> None:
        payload: dict[str, Any] = {"model_path": str(path), "weight_version": str(self.weight_version + 1)}
        if load_format is not None:
            payload["load_format"] = load_format
        posts = Posts(
            self.control_urls, "/update_weights_from_disk", [payload] * len(self.control_urls), self.cfg.timeout_s
        )
        for t in posts.threads:
            t.join()
        # 0.5.23 loads the weights, then fails the call if the flush after it is refused (a
        # request still retiring): the weights are in, and the flush is retried below.
        posts.results = [{"success": True} if _flush_refused(r) else r for r in posts.results]
        posts.join()
        self.flush_cache()

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        mode = self.cfg.weight_sync
        if mode == "disk":
            self._update_via_disk(named_tensors)
        elif mode == "tensor":
            with self.weight_update_session():
                self._update_via_tensor(named_tensors)
            self.flush_cache()
        elif mode == "distributed":
            if self._group is None:
                self.init_weight_update_group()
            with self.weight_update_session():
                self._update_via_distributed(named_tensors)
            self.flush_cache()
        else:
            raise ValueError(f"weight_sync={mode!r}: must be disk, tensor or distributed")
        self.weight_version += 1

    # -- weight-update session (0.5.23: required around tensor / distributed updates)
    @contextlib.contextmanager
    def weight_update_session(self) -> Iterator[None]:
        opened = []
        try:
            for url in self.control_urls:
                if self._begin(url):
                    opened.append(url)
            yield
        finally:
            for url in opened:  # close every session we opened, even after a failed update
                try:
                    request_sync("POST", url + "/end_weight_update", {}, self.cfg.timeout_s)
                except Exception as exc:
                    logger.error(f"{url}/end_weight_update failed: {exc}")

    def _begin(self, url: str) -> bool:
        """Open a session; False for a server without sessions (404: before 0.5.23)."""
        if self._has_session.get(url) is False:
            return False
        for attempt in (0, 1):
            try:
                request_sync("POST", url + "/begin_weight_update", {}, self.cfg.timeout_s)
                self._has_session[url] = True
                return True
            except HTTPError as exc:
                if exc.status == 404:
                    self._has_session[url] = False
                    return False
                if attempt == 0 and "already open" in exc.body:
                    # left open by an update that died half-way: close it, then open ours
                    request_sync("POST", url + "/end_weight_update", {}, self.cfg.timeout_s)
                    continue
                raise RuntimeError(f"{url}/begin_weight_update refused: {exc}") from exc
        raise AssertionError("unreachable")

    def _update_via_disk(self, named_tensors) -> None:
        from safetensors.torch import save_file

        if not self.cfg.sync_dir:
            raise ValueError(
                "rollout.sglang.sync_dir is not set: weight_sync=disk writes the learner's weights "
                "there for the servers to load. Set rollout.sglang.sync_dir to a directory every "
                "SGLang server can read (a shared file system when they run on other nodes)."
            )
        out = Path(self.cfg.sync_dir).resolve()  # the servers get an absolute path
        out.mkdir(parents=True, exist_ok=True)
        foreign = sorted(p.name for p in out.glob("*.safetensors") if p.name != SYNC_FILE)
        if foreign:
            raise ValueError(
                f"rollout.sglang.sync_dir={str(out)!r} holds other checkpoint files "
                f"{foreign[:3]}: the servers would load them too. Point sync_dir at "
                "an empty directory that only the trainer writes."
            )
        # clone: tied weights share storage, which safetensors refuses to save twice
        state = {name: t.detach().to("cpu").clone() for name, t in named_tensors}
        tmp = out / f".{SYNC_FILE}.{os.getpid()}.tmp"  # not *.safetensors: never loaded half-written
        try:
            save_file(state, str(tmp))
            os.replace(tmp, out / SYNC_FILE)  # atomic: the one checkpoint is old or new, never torn
        finally:
            tmp.unlink(missing_ok=True)
        self._load_from_disk(str(out))

    def _update_via_tensor(self, named_tensors) -> None:
        for bucket, _last in buckets(named_tensors, self.cfg.bucket_mb << 20):
            blob = serialize_named_tensors(bucket)
            payload = {
                "serialized_named_tensors": [blob] * self.cfg.tp_size,
                "load_format": None,
                "flush_cache": False,
                "weight_version": str(self.weight_version + 1),
            }
            Posts(
                self.control_urls, "/update_weights_from_tensor", [payload] * len(self.control_urls), self.cfg.timeout_s
            ).join()

    def init_weight_update_group(self) -> None:
        """Create the weight-update group with every server's TP ranks; this process is rank 0.

        World size counts every control URL (the workers, never a router). SGLang's own test
        barriers on the group after init (test_update_weights_from_distributed.py), but 0.5.23's
        server side runs no matching collective (model_runner_components/weight_updater.py
        `init_weights_update_group`), so a barrier would block; instead each server's answer,
        which comes only after its rendezvous, is awaited, and a refusal fails at once.
        """
        cfg = self.cfg
        port = cfg.master_port or free_port()
        world = 1 + cfg.tp_size * len(self.control_urls)
        payloads = [
            {
                "master_address": cfg.master_address,
                "master_port": port,
                "rank_offset": 1 + i * cfg.tp_size,
                "world_size": world,
                "group_name": cfg.group_name,
                "backend": cfg.dist_backend,
            }
            for i in range(len(self.control_urls))
        ]
        posts = Posts(self.control_urls, "/init_weights_update_group", payloads, cfg.timeout_s)
        box: dict[str, Any] = {}

        def rendezvous() -> None:
            try:
                box["group"] = init_weight_update_group(
                    cfg.dist_backend, f"tcp://{cfg.master_address}:{port}", world, 0, cfg.group_name, cfg.timeout_s
                )
            except BaseException as exc:
                box["error"] = exc

        thread = threading.Thread(target=rendezvous, daemon=True)
        thread.start()
        posts.wait_for(thread, "joining the weight-update group", cfg.timeout_s)
        if "error" in box:
            raise RuntimeError(f"weight-update group rendezvous failed: {box['error']}")
        posts.join()
        self._group = box["group"]

    def _update_via_distributed(self, named_tensors) -> None:
        for bucket, _last in buckets(named_tensors, self.cfg.bucket_mb << 20):
            payload = {
                "names": [n for n, _ in bucket],
                "dtypes": [dtype_name(t) for _, t in bucket],
                "shapes": [list(t.shape) for _, t in bucket],
                "group_name": self.cfg.group_name,
                "flush_cache": False,
                "weight_version": str(self.weight_version + 1),
            }
            posts = Posts(
                self.control_urls,
                "/update_weights_from_distributed",
                [payload] * len(self.control_urls),
                self.cfg.timeout_s,
            )
            try:
                for _, t in bucket:  # same order as `names`: the servers receive in that order
                    work = broadcast_from_rank0(self._group, t.detach().contiguous())
                    posts.wait_for(work, "broadcasting weights", self.cfg.timeout_s)
            except BaseException:
                # the group now holds a half-done collective: never reuse it
                self._group = None
                raise
            posts.join()

    def destroy_weight_update_group(self) -> None:
        if self._group is None:
            return
        Posts(
            self.control_urls,
            "/destroy_weights_update_group",
            [{"group_name": self.cfg.group_name}] * len(self.control_urls),
            self.cfg.timeout_s,
        ).join()
        import torch.distributed as dist

        dist.destroy_process_group(self._group)
        self._group = None

    def close(self) -> None:
        try:
            self.destroy_weight_update_group()
        except Exception:  # servers may already be gone
            self._group = None


def _flush_refused(result: Any) -> bool:
    text = (
        result.body
        if isinstance(result, HTTPError)
        else (str(result.get("message", "")) if isinstance(result, dict) and not result.get("success", True) else "")
    )
    return "cache was not flushed" in text


# ---------------------------------------------------------------------------------- in-process


class SGLangEngineBackend:
    """An in-process `sglang.Engine` (GPU only; sglang is imported when this is built).

    engine_kwargs go to `sglang.Engine` (ServerArgs), e.g. tp_size, mem_fraction_static,
    enable_memory_saver=True (needed for release/resume_memory_occupation).
    Weight updates use the Engine's update_weights_from_tensor (colocated, in buckets) and
    update_weights_from_disk.
    """

    def __init__(self, model_path: str, cfg: SGLangConfig | None = None, **engine_kwargs) -> None:
        try:
            import sglang
        except ImportError as exc:
            raise ImportError(
                "the in-process SGLang backend needs sglang on a CUDA machine: pip install 'stare-tir[sglang]'"
            ) from exc
        self.cfg = cfg or SGLangConfig()
        self.engine = sglang.Engine(model_path=model_path, **engine_kwargs)
        self.weight_version = 0

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, stop: list[str]) -> Generation:
        out = await self.engine.async_generate(
            input_ids=list(prompt_ids),
            return_logprob=True,
            sampling_params=sampling_payload(sampling, stop, self.cfg.send_seed),
        )
        return parse_generate_output(out, stop)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        for bucket, last in buckets(named_tensors, self.cfg.bucket_mb << 20):
            res = self.engine.update_weights_from_tensor(named_tensors=bucket, load_format=None, flush_cache=last)
            _check_engine_result(res)
        self.weight_version += 1

    def update_weights_from_disk(self, path: str) -> None:
        _check_engine_result(self.engine.update_weights_from_disk(str(path)))
        self.weight_version += 1

    def flush_cache(self) -> None:
        self.engine.flush_cache()

    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        self.engine.release_memory_occupation(tags=tags)

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        self.engine.resume_memory_occupation(tags=tags)

    def close(self) -> None:
        self.engine.shutdown()


def _check_engine_result(res: Any) -> None:
    """Engine weight calls answer (success, message, ...) or a dict with "success"."""
    if isinstance(res, tuple) and res and res[0] is False:
        raise RuntimeError(f"SGLang weight update failed: {res[1] if len(res) > 1 else res}")
    if isinstance(res, dict) and res.get("success") is False:
        raise RuntimeError(f"SGLang weight update failed: {res.get('message')}")
