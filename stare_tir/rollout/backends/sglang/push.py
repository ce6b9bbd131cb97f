"""The three ways weights reach SGLang servers, the session around them, and the update group.

Every function here runs on the one pushing process and raises on the first refusal: a caller
that stops iterating its tensors must still let its peers finish theirs (see
`stare_tir.trainer.weight_sync`). The one exception, `push_tensor_relayed`, is rank 0's side of a
protocol every trainer rank runs (`relay.py`). Upstream references (python/sglang/srt/ of 0.5.23):
managers/scheduler_components/weight_updater.py (sessions, the loads, flush after an update),
managers/tp_worker.py (one tensor payload per TP rank), model_executor/model_runner_components/
weight_updater.py (the server's side of the group and the broadcast), entrypoints/http_server.py.

Pushes while generation is in flight (asynchronous training, `generation_paused`): every server
is paused with `/pause_generation {"mode": "retract"}`, the weights are pushed and the prefix cache
flushed, then `/continue_generation`. Why retract (managers/scheduler.py `pause_generation`,
managers/io_struct.py `PauseGenerationReqInput`): the running requests go back to the waiting
queue with their output ids and log-probs kept and their KV cache freed, so the flush after the
update succeeds (`flush_cache` ignores the waiting queue while paused: scheduler.py
`is_fully_idle(ignore_waiting=...)`) and no cache entry of the old weights survives; on continue
each request is prefilled again (prompt + its tokens so far) under the new weights and goes on
decoding. Token-in/token-out holds on the server (it keeps the ids; nothing is re-tokenized), a
stop string split across the pause is still caught (the stop check reads the output's tail,
tokens from before the pause included), and the answer reports which tokens each version sampled
(`meta_info.weight_versions`: the scheduler records a version change for every live request,
scheduler.py `record_weight_version_change`). The alternatives: "abort" ends the requests (the
client would resubmit the tokens so far and split stop strings itself); "in_place" keeps their KV
cache from the old weights and refuses the flush; an update without a pause waits for every
request in flight (tokenizer_manager.py: the update takes `model_update_lock` as a writer), which
idles the learner for the longest turn. Requests sent during the pause wait in the tokenizer
manager until continue. Modes exist from 0.5.6 on (0.5.5 and older abort whatever is asked:
tokenizer_manager.py `pause_generation` takes no mode there), so older servers are refused.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from loguru import logger

from stare_tir.rollout.backends._http import HTTPError, request_sync
from stare_tir.rollout.backends._weights import (
    Posts,
    broadcast_from_rank0,
    buckets,
    dtype_name,
    free_port,
    init_weight_update_group,
    serialize_named_tensors,
)
from stare_tir.rollout.backends.sglang.config import SGLangConfig
from stare_tir.rollout.backends.sglang.layout import ServerLayout, master_address

if TYPE_CHECKING:
    import torch

    from stare_tir.rollout.backends.sglang.relay import TensorRelay

SYNC_FILE = "model.safetensors"
# Seconds a clean-up call (closing a session, destroying a group) may take once a push has
# failed: the run is ending and must not wait timeout_s per server.
CLEANUP_TIMEOUT_S = 30.0


def bucket_bytes(cfg: SGLangConfig) -> int:
    return max(1, int(cfg.bucket_mb * 2**20))


def flush_refused(result: Any) -> bool:
    """0.5.23 loads the weights, then fails the call when the flush after it is refused (a
    request still retiring): the weights are in, and the flush is retried afterwards."""
    text = (
        result.body
        if isinstance(result, HTTPError)
        else (str(result.get("message", "")) if isinstance(result, dict) and not result.get("success", True) else "")
    )
    return "cache was not flushed" in text


def flush_cache(urls: list[str], timeout_s: float, tries: int = 40, wait_s: float = 0.25) -> None:
    """POST /flush_cache to every server, retried while it answers 400: a server refuses to
    flush while a request runs or is still being retired (http_server.py `flush_cache`), so a
    flush that succeeded also says the server is idle."""
    for url in urls:
        for attempt in range(tries):
            try:
                request_sync("POST", url + "/flush_cache", timeout_s=timeout_s)
                break
            except HTTPError as exc:
                if exc.status != 400 or attempt == tries - 1:
                    raise RuntimeError(f"{url}/flush_cache refused {attempt + 1} times: {exc}") from exc
                time.sleep(wait_s)


# ------------------------------------------------------------------------- pause while pushing

PAUSE_MODES_SINCE = (0, 5, 6)  # /pause_generation honours "mode" (retract) from this version on


def parse_version(text: str) -> tuple[int, ...] | None:
    """(0, 5, 23) from "0.5.23" or "0.5.15.post1"; None when it is not a release number."""
    parts = []
    for piece in text.strip().split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit()) if piece[:1].isdigit() else ""
        if not digits:
            return None
        parts.append(int(digits))
    return tuple(parts) if len(parts) == 3 else None


def check_pause_support(layouts: list[ServerLayout]) -> None:
    """Refuse servers whose /pause_generation cannot retract (it would abort every request)."""
    for lay in layouts:
        version = parse_version(lay.version)
        if version is None or version < PAUSE_MODES_SINCE:
            raise ValueError(
                f"trainer.max_staleness > 0 pushes weights while {lay.url} generates, which needs "
                f"/pause_generation with mode=retract (SGLang >= 0.5.6); that server reports version "
                f"{lay.version!r}. Upgrade the server, or set trainer.max_staleness=0"
            )


@contextlib.contextmanager
def generation_paused(urls: list[str], timeout_s: float) -> Iterator[None]:
    """Pause every server (retract), run the block (the push), continue every paused server, also
    after a failed push: a server left paused would hold every later request."""
    paused: list[str] = []
    try:
        for url in urls:
            request_sync("POST", url + "/pause_generation", {"mode": "retract"}, timeout_s)
            paused.append(url)
        yield
    finally:
        failed = [f for f in Posts(paused, "/continue_generation", [{}] * len(paused), timeout_s).failures()]
        if failed:
            message = f"continuing generation failed: {failed[0]}"
            logger.error(message)
            if sys.exc_info()[0] is None:  # never hide the push's own error behind this one
                raise RuntimeError(message)


# ------------------------------------------------------------------------------------- session


class Sessions:
    """Which servers have the begin/end weight-update session (0.5.23; older ones answer 404)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.has_session: dict[str, bool] = {}

    @contextlib.contextmanager
    def around(self, urls: list[str]) -> Iterator[None]:
        """Open a session on every server that has one, run the block, close every opened one
        (in parallel, with a short timeout, even after a failed update)."""
        opened: list[str] = []
        try:
            for url in urls:
                if self._begin(url):
                    opened.append(url)
            yield
        finally:
            if opened:
                for failure in Posts(opened, "/end_weight_update", [{}] * len(opened), CLEANUP_TIMEOUT_S).failures():
                    logger.error(f"closing the weight-update session failed: {failure}")

    def _begin(self, url: str) -> bool:
        if self.has_session.get(url) is False:
            return False
        for attempt in (0, 1):
            try:
                request_sync("POST", url + "/begin_weight_update", {}, self.timeout_s)
                self.has_session[url] = True
                return True
            except HTTPError as exc:
                if exc.status == 404:
                    self.has_session[url] = False
                    return False
                if attempt == 0 and "already open" in exc.body:
                    # left open by an update that died half-way: close it, then open ours
                    request_sync("POST", url + "/end_weight_update", {}, self.timeout_s)
                    continue
                raise RuntimeError(f"{url}/begin_weight_update refused: {exc}") from exc
        raise AssertionError("unreachable")


# ---------------------------------------------------------------------------------------- disk


def load_from_disk(urls: list[str], path: str, version: str, timeout_s: float, load_format: str | None = None) -> None:
    """Every server loads the HF checkpoint at `path` (which each of them must be able to read)."""
    payload: dict[str, Any] = {"model_path": str(path), "weight_version": version}
    if load_format is not None:
        payload["load_format"] = load_format
    posts = Posts(urls, "/update_weights_from_disk", [payload] * len(urls), timeout_s)
    for t in posts.threads:
        t.join()
    posts.results = [{"success": True} if flush_refused(r) else r for r in posts.results]
    posts.join()
    flush_cache(urls, timeout_s)


def check_sync_space(directory: Path, nbytes: int) -> None:
    """Refuse a sync directory that cannot hold one more checkpoint: the new file is written
    beside the old one before the rename (a bf16 7B policy: ~15 GB per sync). A container's
    /dev/shm is 64 MB unless started with a larger --shm-size."""
    free = shutil.disk_usage(directory).free
    if free < nbytes:
        raise ValueError(
            f"rollout.sglang.sync_dir={str(directory)!r} has {_size(free)} free but one weight sync "
            f"writes {_size(nbytes)} ({SYNC_FILE}, written beside the previous one): point sync_dir "
            "at a larger file system (for /dev/shm: start the container with a larger --shm-size)"
        )


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.0f} MiB"


def push_disk(
    urls: list[str], cfg: SGLangConfig, named_tensors: Iterable[tuple[str, torch.Tensor]], version: str
) -> None:
    """Write the tensors to `sync_dir/model.safetensors` (temp name, then an atomic rename), then
    every server loads that directory."""
    from safetensors.torch import save_file

    if not cfg.sync_dir:
        raise ValueError(
            "rollout.sglang.sync_dir is not set: weight_sync=disk writes the learner's weights "
            "there for the servers to load. Set rollout.sglang.sync_dir to a directory every "
            "SGLang server can read (a shared file system when they run on other nodes)."
        )
    out = Path(cfg.sync_dir).resolve()  # the servers get an absolute path
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
    check_sync_space(out, sum(t.numel() * t.element_size() for t in state.values()))
    tmp = out / f".{SYNC_FILE}.{os.getpid()}.tmp"  # not *.safetensors: never loaded half-written
    try:
        save_file(state, str(tmp))
        os.replace(tmp, out / SYNC_FILE)  # atomic: the one checkpoint is old or new, never torn
    finally:
        tmp.unlink(missing_ok=True)
    load_from_disk(urls, str(out), version, cfg.timeout_s)


# -------------------------------------------------------------------------------------- tensor


def push_tensor(
    layouts: list[ServerLayout],
    cfg: SGLangConfig,
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    version: str,
) -> None:
    """`/update_weights_from_tensor` per bucket, with one payload per TP rank of each server, all
    serialized by this (the pushing) process.

    CUDA tensors are serialized once per rank and server (IPC refcounts, see
    `serialize_named_tensors`); CPU tensors travel by value, so one serialization is shared.

    Every payload is then a handle on this process's GPU, also for TP rank r of a server colocated
    on GPUs 0..tp-1: the push is bounded by one GPU's outgoing bandwidth. Colocated with several
    trainer ranks, `push_tensor_relayed` is used instead where each TP rank's GPU hosts a trainer
    rank (SGLang's own helper's way, `relay.py`); this is its fallback and the path of one rank.
    """
    urls = [lay.url for lay in layouts]
    for bucket, _last in buckets(named_tensors, bucket_bytes(cfg)):
        on_gpu = any(t.is_cuda for _, t in bucket)
        shared = None if on_gpu else serialize_named_tensors(bucket)
        payloads = [
            {
                "serialized_named_tensors": [shared or serialize_named_tensors(bucket) for _ in range(lay.tp_size)],
                "load_format": None,
                "flush_cache": False,
                "weight_version": version,
            }
            for lay in layouts
        ]
        Posts(urls, "/update_weights_from_tensor", payloads, cfg.timeout_s).join()


def push_tensor_relayed(
    layouts: list[ServerLayout],
    cfg: SGLangConfig,
    relay: TensorRelay,
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    version: str,
) -> None:
    """Rank 0's side of the colocated per-rank push (`relay.py`): every trainer rank serializes
    the bucket on its own GPU, and server i's TP rank r gets the payload of the trainer rank on
    its GPU (sglang srt/weight_sync/utils.py `update_weights` gathers them the same way). The
    other ranks run `relay.run` with no `post` over the same buckets."""
    urls = [lay.url for lay in layouts]

    def post(per_server: list[list[str]]) -> None:
        payloads = [
            {"serialized_named_tensors": p, "load_format": None, "flush_cache": False, "weight_version": version}
            for p in per_server
        ]
        Posts(urls, "/update_weights_from_tensor", payloads, cfg.timeout_s).join()

    relay.run(named_tensors, post)


# --------------------------------------------------------------------------------- distributed


class Beside:
    """`fn(*args)` in a daemon thread beside the HTTP posts: its result, or the exception it raised."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn, *args), daemon=True)
        self.thread.start()

    def _run(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            self.result = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, which raises it with context
            self.error = exc


def _pending(work: Any) -> bool:
    """Whether an enqueued collective may still be running (a work that cannot say counts)."""
    try:
        return not work.is_completed()
    except Exception:  # noqa: BLE001 - a failed work's query: abort to be sure
        return True


class UpdateGroup:
    """The weight-update process group: this process is rank 0, TP rank r of server i is rank
    1 + (tp sizes of the servers before i) + r.

    Its name is unique per group (`group_name` prefix + a random suffix): a server keeps a group
    after its trainer dies (0.5.1 has no way to destroy one), a resumed trainer's
    /init_weights_update_group with a name the server still holds gets a 400, and a name cannot
    be registered twice in this process either (torch's c10d registry) after a failed broadcast.
    """

    def __init__(self, layouts: list[ServerLayout], cfg: SGLangConfig) -> None:
        self.layouts, self.cfg = layouts, cfg
        self.urls = [lay.url for lay in layouts]
        self.name = f"{cfg.group_name}-{uuid.uuid4().hex[:12]}"
        self.pg = None
        self.broken = False
        self.sender: Beside | None = None  # the last bucket's broadcast thread
        self.works: list[Any] = []  # the last bucket's enqueued broadcasts

    @property
    def world_size(self) -> int:
        return 1 + sum(lay.tp_size for lay in self.layouts)

    def init(self) -> None:
        """Every server joins; each server's answer, which comes only after its rendezvous, is
        awaited, and a refusal fails at once. SGLang's own test barriers on the group after
        init (test_update_weights_from_distributed.py), but 0.5.23's server runs no matching
        collective (weight_updater.py `init_weights_update_group`): a barrier would block."""
        cfg = self.cfg
        address = master_address(cfg.master_address, self.urls)
        port = cfg.master_port or free_port()
        offsets, offset = [], 1
        for lay in self.layouts:
            offsets.append(offset)
            offset += lay.tp_size
        payloads = [
            {
                "master_address": address,
                "master_port": port,
                "rank_offset": off,
                "world_size": self.world_size,
                "group_name": self.name,
                "backend": cfg.dist_backend,
            }
            for off in offsets
        ]
        posts = Posts(self.urls, "/init_weights_update_group", payloads, cfg.timeout_s)
        rendezvous = Beside(
            init_weight_update_group,
            cfg.dist_backend,
            f"tcp://{address}:{port}",
            self.world_size,
            0,
            self.name,
            cfg.timeout_s,
        )
        try:
            posts.wait_for(rendezvous.thread, "joining the weight-update group", cfg.timeout_s)
            if rendezvous.error is not None:
                raise RuntimeError(f"weight-update group rendezvous failed: {rendezvous.error}")
            posts.join()
        except BaseException:
            self.broken = True
            raise
        self.pg = rendezvous.result

    def push(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: str) -> None:
        """Per bucket: `/update_weights_from_distributed` on every server while this process
        broadcasts each tensor. A refusal stops the broadcast at once (the receivers that refused
        never join it). The broadcast is started from a helper thread: NCCL initialises its
        communicator lazily inside the first broadcast call, which blocks until every rank
        joins; the refusal must still be seen meanwhile."""
        cfg = self.cfg
        for bucket, _last in buckets(named_tensors, bucket_bytes(cfg)):
            payload = {
                "names": [n for n, _ in bucket],
                "dtypes": [dtype_name(t) for _, t in bucket],
                "shapes": [list(t.shape) for _, t in bucket],
                "group_name": self.name,
                "flush_cache": False,
                "weight_version": version,
            }
            posts = Posts(self.urls, "/update_weights_from_distributed", [payload] * len(self.urls), cfg.timeout_s)
            self.works = []
            sender = self.sender = Beside(self._broadcast, bucket)
            try:
                posts.wait_for(sender.thread, "broadcasting weights", cfg.timeout_s)
                if sender.error is not None:
                    # a receiver that refused closes its side: the broadcast then fails first, and
                    # the server's answer (the cause) follows at once
                    for t in posts.threads:
                        t.join(timeout=CLEANUP_TIMEOUT_S / 6)
                    said = posts.failure()
                    raise RuntimeError(f"broadcasting weights failed: {sender.error}" + (f"; {said}" if said else ""))
                posts.join()
                self.works = []  # every server received the bucket: nothing of it is pending
            except BaseException:
                self.broken = True  # a half-done collective: this group is never used again
                self._abort(sender)
                raise

    def _abort(self, sender: Beside) -> None:
        """After a refusal: abort this side's communicator whenever a broadcast of this bucket may
        still be pending, so it fails now instead of waiting for the group's timeout (`timeout_s`:
        the group is made with it) and then the watchdog's abort.

        Whether the sender thread is alive says nothing on NCCL: its `wait()` only makes the
        caller's CUDA stream wait for the communicator's (ProcessGroupNCCL.cpp `WorkNCCL::wait`),
        so the thread returns at once and the enqueued broadcast, which the refusing server never
        joins, holds the trainer's next GPU operation. A broadcast whose work reports completion
        needs nothing; gloo's blocking one cannot be aborted and ends by the group's timeout.

        The servers that accepted the bucket are left in their broadcast: 0.5.23 makes their
        group without a timeout argument (utils/common.py `init_custom_process_group` from
        model_runner_components/weight_updater.py `init_weights_update_group`: torch's default,
        30 minutes for NCCL) and takes no abort request, so they recover when it expires or they
        are restarted; the trainer stops with the cause at once."""
        if self.pg is not None and (sender.thread.is_alive() or any(_pending(w) for w in self.works)):
            try:
                self.pg.abort()
            except Exception as exc:  # noqa: BLE001 - best effort: the group's timeout still ends it
                logger.info(f"weight-update group {self.name}: abort failed ({exc!r}); its timeout ends the broadcast")
        sender.thread.join(timeout=1.0)
        if sender.thread.is_alive():  # gloo cannot be aborted: its timeout ends the broadcast
            logger.warning(
                f"weight-update group {self.name}: the broadcast thread is still blocked; the group's "
                f"timeout (rollout.sglang.timeout_s={self.cfg.timeout_s:.0f}) ends it"
            )

    def _broadcast(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        for _, t in bucket:  # same order as `names`: the servers receive in that order
            work = broadcast_from_rank0(self.pg, t.detach().contiguous())
            self.works.append(work)
            work.wait()

    def destroy(self) -> None:
        """Best effort on both sides (servers may be gone); never raises."""
        if self.pg is None and not self.broken:
            return
        posts = Posts(
            self.urls, "/destroy_weights_update_group", [{"group_name": self.name}] * len(self.urls), CLEANUP_TIMEOUT_S
        )
        for failure in posts.failures():
            logger.info(f"weight-update group {self.name} not destroyed: {failure}")
        if self.pg is not None and not self.broken:
            import torch.distributed as dist

            dist.destroy_process_group(self.pg)
        # a broken group may hold a broadcast that never completes: it is dropped, not shut
        # down (shutting it down could wait on that broadcast)
        self.pg = None
