"""`SGLangBackend`: the HTTP client of one or more SGLang servers (see the package docstring)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import resource
import time
import uuid
from typing import TYPE_CHECKING, Any, Iterable

from loguru import logger

from stare_tir.rollout.backends._http import AsyncJSONClient, HTTPError, NotSentError, request_sync
from stare_tir.rollout.backends.base import ROLLOUT_BACKENDS, BackendBase, Generation, SamplingParams, fast_decoder
from stare_tir.rollout.backends.sglang.abort import Aborts, abort_request
from stare_tir.rollout.backends.sglang.config import MEMORY_TAGS, SGLangConfig, prepare_trainer_env
from stare_tir.rollout.backends.sglang.devices import check_servers_see_device, device_uuid, server_gpus
from stare_tir.rollout.backends.sglang.layout import (
    ServerLayout,
    check_layouts,
    get_info,
    host_of,
    is_local_host,
    master_address,
    read_layout,
)
from stare_tir.rollout.backends.sglang.push import (
    Sessions,
    UpdateGroup,
    bucket_bytes,
    check_pause_support,
    flush_cache,
    generation_paused,
    load_from_disk,
    push_disk,
    push_tensor,
    push_tensor_relayed,
)
from stare_tir.rollout.backends.sglang.relay import Ranks, TensorRelay, map_sources, plan_relay
from stare_tir.rollout.backends.sglang.routing import ROUTING_KEY_HEADER, ServerPicker
from stare_tir.rollout.backends.sglang.wire import parse_generate_output, sampling_payload

if TYPE_CHECKING:
    import torch


class StaleWeightsError(RuntimeError):
    """Every server that could take a request serves other weights than the last push."""


@ROLLOUT_BACKENDS.register("sglang", config=SGLangConfig)  # its settings: rollout.sglang
class SGLangBackend(BackendBase):
    """Client of one or more SGLang HTTP servers (see the package docstring).

    tokenizer: the policy's tokenizer; with it the finish of every answer is classified from its
    last token (EOS ids, stop strings decoded exactly as the HF backend does). Without it, EOS is
    taken from the server's `matched` and stop strings are searched in the returned text.
    eos_token_ids: more EOS ids (the model's generation_config ones).
    """

    # One set of servers serves every trainer rank: exactly one rank pushes weights.
    shared_by_ranks = True

    @classmethod
    def check_config(cls, rollout: Any, key: str) -> None:
        if not rollout.sglang.urls:
            raise ValueError(
                f"{key}=sglang needs rollout.sglang.urls (one or more SGLang server URLs, "
                "e.g. rollout.sglang.urls=[http://127.0.0.1:30000])"
            )

    @classmethod
    def prepare_trainer(cls, rollout: Any) -> None:
        """Refuse disk sync without a directory; NCCL's settings before the learner starts its NCCL."""
        if rollout.sglang.weight_sync == "disk" and not rollout.sglang.sync_dir:
            raise ValueError(
                "rollout.sglang.weight_sync=disk needs rollout.sglang.sync_dir: a directory the "
                "trainer writes and every SGLang server reads (shared storage across nodes)"
            )
        prepare_trainer_env(rollout.sglang)

    @classmethod
    def from_config(
        cls, model_path: str, tokenizer: Any, rollout: Any, trust_remote_code: bool = False
    ) -> SGLangBackend:
        cls.check_config(rollout, "backend")
        return cls(rollout.sglang.urls, rollout.sglang, tokenizer=tokenizer, eos_token_ids=model_eos_ids(model_path))

    @property
    def colocated(self) -> bool:  # type: ignore[override]
        return self.cfg.colocate

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
        self.behind_router = bool(self.cfg.weight_urls) and self.control_urls != self.urls
        raise_open_file_limit(self.cfg.max_connections)
        self._client = AsyncJSONClient(
            connect_timeout_s=self.cfg.connect_timeout_s,
            read_timeout_s=self.cfg.generate_timeout_s,
            max_connections=self.cfg.max_connections,
            keepalive_s=self.cfg.keepalive_s,
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
        self._picker = ServerPicker(
            len(self.urls), self.cfg.routing, self.cfg.affinity_slack, self.cfg.affinity_slack_frac
        )
        self._layouts: list[ServerLayout] | None = None
        self._sessions = Sessions(self.cfg.timeout_s)
        self._group: UpdateGroup | None = None
        self._released: dict[str, set[str]] = {}  # url -> memory tags released on that server
        # The version of the last push: answers stamped otherwise come from other weights.
        self.weight_version: str | None = None
        self._pushes = 0
        self._stale: set[int] = set()  # generation URLs that answered with other weights
        # Generation URLs that dropped a request they had (killed, restarted): avoided by the
        # requests after it until the next push, which either reaches them or names them.
        self._lost: set[int] = set()
        self.stale_answers = 0  # answers discarded (and re-run elsewhere) for their weights
        self._aborts = Aborts()  # what cancelled calls' aborts achieved (`abort.py`)
        # Asynchronous training (`allow_in_flight_updates`): pushes pause generation, and answers
        # from the few versions before the last push are the trainer's, not a restarted server's.
        self._in_flight_updates = False
        self._older_versions: collections.deque[str] = collections.deque(maxlen=0)
        self._incoming: str | None = None  # a version another process is pushing (`accept_version`)
        self._devices_checked = False  # tensor sync: every server sees the trainer's GPU (`devices.py`)
        self._server_gpus: list[tuple[list[str] | None, str]] | None = None  # per server (`relay.py`)
        self._relay_note: str | None = None  # why the last colocated push had no per-rank map ("": it had)

    # ------------------------------------------------------------------------------- data path

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, stop: list[str]) -> Generation:
        """One request to the server `routing` picks (`routing.py`: the server of the trajectory's
        previous turn under a load bound, or the least-loaded one). A connect failure (nothing
        sent) is retried on another server; a failure after the request went out is raised, never
        re-run, and that server is avoided until the next push. An answer from other weights than the last push (a restarted server) is
        discarded, its server set aside until the next push, and the request re-run elsewhere.
        A cancelled call (the caller has enough groups: algo.round_end=enough) aborts its request
        on the server (`abort.py`), which would otherwise generate it to the end."""
        payload = {
            "input_ids": list(prompt_ids),
            "return_logprob": True,
            "sampling_params": sampling_payload(sampling, stop, self.cfg.send_seed),
        }
        route = self._picker.request(prompt_ids)
        # Behind a router the trajectory's key lets `--policy manual` keep its turns on one worker.
        headers = {ROUTING_KEY_HEADER: route.key} if self.behind_router else None
        inflight = self._picker.inflight
        tried: set[int] = set()
        failures = 0
        while True:
            i = self._picker.pick(route, tried | self._lost, self._stale)
            inflight[i] += 1
            # Our own request id, fresh per attempt, so that a cancelled call can name it to
            # /abort_request (the server makes one up otherwise: io_struct.py GenerateReqInput.rid).
            payload["rid"] = uuid.uuid4().hex
            # Its own task, so that a cancelled call can still read the aborted answer's length.
            sent = asyncio.ensure_future(self._client.request("POST", self.urls[i] + "/generate", payload, headers))
            try:
                out = await asyncio.shield(sent)
            except asyncio.CancelledError:  # the caller went away: stop the request on the server
                if sent.done():  # the answer came in just before the cancel: its tokens are waste
                    self._aborts.count_answer(sent)
                else:
                    targets = self.control_urls if self.behind_router else [self.urls[i]]
                    wait_s = min(self.cfg.connect_timeout_s, 10.0)
                    await asyncio.shield(
                        abort_request(self._client, targets, payload["rid"], sent, wait_s, self._aborts)
                    )
                raise
            except NotSentError:
                tried.add(i)
                failures += 1
                if failures > self.cfg.retries:
                    raise
                await asyncio.sleep(0.5 * failures)
                continue
            except TimeoutError as exc:
                self._lost.add(i)
                raise TimeoutError(
                    f"{exc}: the server holds the request without answering (paused by a trainer killed "
                    "between /pause_generation and /continue_generation, or hung). A new trainer continues "
                    "paused servers when it starts; raise rollout.sglang.generate_timeout_s for turns this long"
                ) from exc
            except ConnectionError:
                # Lost, and reported (never re-run: it may have been generating). Without this,
                # affinity kept sending a dead server's trajectories and groups to it, and a
                # request written onto a kept-alive socket the kill had closed was lost too.
                self._lost.add(i)
                raise
            finally:
                inflight[i] -= 1
            gen = parse_generate_output(out, stop, self._eos_ids, self._decode)
            if not self._stale_answer(gen):
                meta = out.get("meta_info") or {}
                self._picker.answered(route, i, prompt_ids, gen.token_ids, meta.get("cached_tokens"))
                return gen
            self.stale_answers += 1
            failures += 1
            if not self.behind_router:  # a router's worker cannot be set aside: just re-run
                self._stale.add(i)
                tried.add(i)
            if failures > self.cfg.retries or len(self._stale) == len(self.urls):
                raise StaleWeightsError(
                    f"{self.urls[i]} answered with weight version {gen.weight_version!r}, expected "
                    f"{self.weight_version!r} (a restarted server?); no other server could take the "
                    "request. The trainer pushes the current weights before the next step"
                )

    def take_aborted_tokens(self) -> int:
        """Tokens sampled by requests whose calls were cancelled, since the last call (`abort.py`)."""
        return self._aborts.take_tokens()

    @property
    def aborted_requests(self) -> int:
        """/abort_request calls the servers took (cancelled generate calls)."""
        return self._aborts.requests

    def _stale_answer(self, gen: Generation) -> bool:
        return self.weight_version is not None and gen.weight_version not in (
            None,
            self.weight_version,
            self._incoming,
            *self._older_versions,
        )

    def take_route_stats(self) -> dict[str, float]:
        """The `route/*` metrics of this process since the last call (docs/metrics.md); behind a
        router, which picks the worker itself, only how the caches served the prompts."""
        return self._picker.take_stats(picks=not self.behind_router)

    async def aclose(self) -> None:
        """Close the keep-alive connections (on the event loop that opened them)."""
        await self._client.close()

    # ---------------------------------------------------------------------------- control path

    def health(self) -> list[bool]:
        """Whether every generation URL answers /model_info. Not /health: on 0.5.23 it runs a real
        forward pass through the scheduler (entrypoints/http_server.py `health_generate` sends a
        one-token generate unless SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION is off), which trips the
        idle assert when it lands between a flush and a memory release and computes on freed
        memory while the server is released; /model_info reads state only. A URL without it (a
        router: 404) is asked /health, which the router answers from its workers."""
        ok = []
        for url in self.urls:
            try:
                try:
                    request_sync("GET", url + "/model_info", timeout_s=30)
                except HTTPError as exc:
                    if exc.status != 404:
                        raise
                    request_sync("GET", url + "/health", timeout_s=30)
                ok.append(True)
            except Exception:
                ok.append(False)
        return ok

    def claim_servers(self) -> None:
        """At start: /continue_generation to every control server, so a pause that a killed trainer
        left (it died between pause and continue) does not hold this run's requests forever.
        Continue is idempotent on a server that is not paused (0.5.23's scheduler only clears its
        pause flag, `_engine_paused`: managers/scheduler.py `continue_generation`); a server
        without the call (older than pauses) answers 404 and cannot have been paused by us."""
        continued = []
        for url in self.control_urls:
            try:
                request_sync("POST", url + "/continue_generation", {}, min(self.cfg.timeout_s, 60.0))
                continued.append(url)
            except HTTPError as exc:
                if exc.status != 404:
                    raise
        if continued:
            logger.info(
                f"rollout servers taken: /continue_generation sent to {continued} (clears any pause a "
                "previous trainer left)"
            )

    def wait_until_healthy(self, timeout_s: float = 600.0, poll_s: float = 2.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not all(self.health()):
            if time.monotonic() > deadline:
                bad = [u for u, h in zip(self.urls, self.health()) if not h]
                raise TimeoutError(f"SGLang servers not healthy after {timeout_s}s: {bad}")
            time.sleep(poll_s)

    def layouts(self) -> list[ServerLayout]:
        """Each control server's layout, read once and checked against the sync mode (refused
        with the key to change, see `layout.check_layouts`)."""
        if self._layouts is None:
            timeout = min(self.cfg.timeout_s, 60.0)
            layouts = check_layouts(
                [read_layout(u, timeout) for u in self.control_urls],
                self.cfg.weight_sync,
                self.cfg.tp_size,
                self.cfg.colocate,
            )
            if self.cfg.weight_sync == "tensor":
                remote = [u for u in self.control_urls if not is_local_host(host_of(u))]
                if remote:
                    raise ValueError(
                        f"rollout.sglang.weight_sync=tensor but {remote[0]} is not on this node: tensors "
                        "travel as CUDA IPC handles, which open only on the same machine. Use "
                        "rollout.sglang.weight_sync=distributed or disk"
                    )
            if self.cfg.weight_sync == "distributed":
                master_address(self.cfg.master_address, self.control_urls)  # refuses loopback + remote
            for lay in layouts:  # what every later payload count and group rank is built from
                logger.info(f"server {lay.url}: {lay.describe()}")
            self._layouts = layouts
        return self._layouts

    def served_versions(self) -> dict[str, str | None]:
        """The weight version each control server reports now (None: unreachable or not reported)."""
        out: dict[str, str | None] = {}
        for url in self.control_urls:
            try:
                out[url] = get_info(url, "model_info", min(self.cfg.timeout_s, 30.0)).get("weight_version")
            except Exception:
                out[url] = None
        return out

    def stale_servers(self) -> list[str]:
        """Servers that must get the current weights again before they are used: those whose
        answers came from other weights, and those that report another version now (a server
        that restarted serves its start-up weights, 0.5.23 reports "default") or do not answer."""
        if self.weight_version is None:
            return []
        marked = {self.urls[i] for i in self._stale}
        return sorted(marked | {u for u, v in self.served_versions().items() if v != self.weight_version})

    def take_stale_answers(self) -> int:
        n, self.stale_answers = self.stale_answers, 0
        return n

    def accept_version(self, version: str) -> None:
        """Another process is about to push `version`: under asynchronous training its in-flight
        push may answer this process's requests with it before this process hears that the push
        succeeded; those answers are the trainer's new weights, not a restarted server's."""
        self._incoming = version

    def expect_version(self, version: str) -> None:
        """Another process pushed `version` to the servers: answers must now carry it."""
        if self.weight_version not in (None, version):
            self._older_versions.append(self.weight_version)
        self.weight_version = version
        self._incoming = None
        self._stale.clear()
        self._lost.clear()

    def flush_cache(self, tries: int = 40, wait_s: float = 0.25) -> None:
        flush_cache(self.control_urls, self.cfg.timeout_s, tries, wait_s)

    # -- pushes while generation is in flight (asynchronous training; push.py `generation_paused`)

    def allow_in_flight_updates(self, versions_kept: int) -> None:
        """From now on every push pauses the servers (retract), pushes, flushes and continues, so it
        may come while requests run; answers whose last token came from one of the
        `versions_kept` versions before the last push are accepted (their requests ended just
        before it). Refused for servers that cannot retract."""
        check_pause_support(self.layouts())
        self._in_flight_updates = True
        self._older_versions = collections.deque(self._older_versions, maxlen=versions_kept)

    def pause_generation(self, mode: str = "retract") -> None:
        """POST /pause_generation to every control server (mode: abort, retract, in_place)."""
        for url in self.control_urls:
            request_sync("POST", url + "/pause_generation", {"mode": mode}, self.cfg.timeout_s)

    def continue_generation(self) -> None:
        """POST /continue_generation to every control server."""
        for url in self.control_urls:
            request_sync("POST", url + "/continue_generation", {}, self.cfg.timeout_s)

    def _paused_for_push(self) -> contextlib.AbstractContextManager:
        if not self._in_flight_updates:
            return contextlib.nullcontext()
        return generation_paused(self.control_urls, self.cfg.timeout_s)

    # -- colocated memory

    @property
    def released(self) -> dict[str, list[str]]:
        """url -> memory tags released on that server (what a restarted trainer must resume)."""
        return {u: sorted(t) for u, t in self._released.items() if t}

    def adopt_released(self, released: dict[str, list[str]]) -> None:
        """A previous trainer released these tags and never resumed them."""
        for url, tags in released.items():
            self._released.setdefault(url.rstrip("/"), set()).update(tags)

    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        """Free the servers' GPU memory for the learner. Only an idle server may release
        (0.5.23 asserts it in the scheduler loop, where the assertion kills the server:
        scheduler_components/weight_updater.py `release_memory_occupation`), and the last
        /generate may still be retiring: flush first, which succeeds only once it is idle."""
        tags = list(tags or MEMORY_TAGS)
        self.flush_cache()
        for url in self.control_urls:
            todo = [t for t in tags if t not in self._released.get(url, set())]
            if todo:
                request_sync("POST", url + "/release_memory_occupation", {"tags": todo}, self.cfg.timeout_s)
                self._released.setdefault(url, set()).update(todo)

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        """Resume the released tags among `tags` (all: None). A tag that is not released is never
        sent: the scheduler raises KeyError for it (weight_updater.py `resume_memory_occupation`)."""
        for url in self.control_urls:
            held = self._released.get(url, set())
            todo = [t for t in MEMORY_TAGS if t in held and (tags is None or t in tags)]
            todo += sorted(t for t in held if t not in MEMORY_TAGS and (tags is None or t in tags))
            if todo:
                request_sync("POST", url + "/resume_memory_occupation", {"tags": todo}, self.cfg.timeout_s)
                held.difference_update(todo)

    # -- weights

    def update_weights(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        version: str | None = None,
        relay: TensorRelay | None = None,
    ) -> None:
        """Push new weights to every control server under `version` (None: this backend's count
        of pushes). Colocated: the weights are resumed first and the rest of the memory after.
        relay: from `tensor_relay` (rank 0 of a colocated tensor push that every rank feeds)."""
        mode = self.cfg.weight_sync
        if relay is not None and mode != "tensor":
            raise ValueError(f"a per-rank relay is for weight_sync=tensor, not {mode}")
        version = version if version is not None else str(self._pushes + 1)
        layouts = self.layouts()
        if self.cfg.colocate:
            self.resume_memory_occupation(["weights"])  # KV cache and graphs stay free until after the push
        with self._paused_for_push():
            if mode == "disk":
                push_disk(self.control_urls, self.cfg, named_tensors, version)
            elif mode == "tensor":
                with self._sessions.around(self.control_urls):
                    if relay is not None:  # each TP rank's GPU was read from the server: no device check
                        push_tensor_relayed(layouts, self.cfg, relay, named_tensors, version)
                    else:
                        push_tensor(layouts, self.cfg, self._checking_devices(named_tensors), version)
                self.flush_cache()
            else:
                group = self._update_group(layouts)
                with self._sessions.around(self.control_urls):
                    group.push(named_tensors, version)
                self.flush_cache()
        self._pushed(version)
        if self.cfg.colocate:
            self.resume_memory_occupation()

    def tensor_relay(self, ranks: Ranks) -> TensorRelay | None:
        """Collective over the trainer's ranks, before each sync: colocated tensor sync with several
        ranks feeds each server's TP rank r from the trainer rank on its GPU (`relay.py`). None on
        every rank otherwise, and when no such map exists (rank 0 says why, once)."""
        if not (self.cfg.colocate and self.cfg.weight_sync == "tensor") or ranks.world_size == 1:
            return None
        return plan_relay(ranks, self._relay_sources if ranks.rank == 0 else None, bucket_bytes(self.cfg))

    def _relay_sources(self, rank_gpus: list[str | None]) -> list[list[int]] | None:
        """Rank 0: server -> TP rank -> the trainer rank on its GPU, or None (logged once per reason)."""
        try:
            layouts = self.layouts()
            if self._server_gpus is None:  # a server's GPUs do not change while it runs
                self._server_gpus = [server_gpus(lay.url, lay) for lay in layouts]
            sources, why = map_sources(layouts, rank_gpus, self._server_gpus)
        except Exception as exc:  # noqa: BLE001 - the push itself reports a server that fails here
            sources, why = None, f"the servers' GPUs could not be read: {exc!r}"
        if why != self._relay_note:
            if sources is None:
                logger.warning(
                    f"colocated weight_sync=tensor: trainer rank 0 serializes every TP rank's payload (one "
                    f"GPU's bandwidth per push), since no trainer rank could be matched to each TP rank's GPU: {why}"
                )
            else:
                mapped = "; ".join(f"{lay.url} TP ranks <- trainer ranks {row}" for lay, row in zip(layouts, sources))
                logger.info(
                    f"colocated weight_sync=tensor: each TP rank reads from the trainer rank on its GPU ({mapped})"
                )
        self._relay_note = why
        return sources

    def _checking_devices(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterable[tuple[str, torch.Tensor]]:
        """The tensors, unchanged; before the first CUDA one is serialized, every server is checked
        to see its GPU (once per backend: `devices.py`), so an invisible device is refused with
        one line instead of killing the server."""
        for name, t in named_tensors:
            if t.is_cuda and not self._devices_checked:
                check_servers_see_device(self.control_urls, device_uuid(t))
                self._devices_checked = True
            yield name, t

    def update_weights_from_disk(self, path: str, load_format: str | None = None, version: str | None = None) -> None:
        """Every server loads the HF checkpoint directory `path` (readable by each of them)."""
        version = version if version is not None else str(self._pushes + 1)
        with self._paused_for_push():
            load_from_disk(self.control_urls, path, version, self.cfg.timeout_s, load_format)
        self._pushed(version)

    def _pushed(self, version: str) -> None:
        self._pushes += 1
        self.expect_version(version)

    def _update_group(self, layouts: list[ServerLayout]) -> UpdateGroup:
        """The weight-update group, made anew when the last one broke or a server restarted
        since (it serves another version than our last push: it lost its group with it)."""
        group = self._group
        if group is not None and not group.broken and self.weight_version is not None:
            restarted = [u for u, v in self.served_versions().items() if v != self.weight_version]
            if restarted:  # no collective is running: this side's communicator is freed, not leaked
                logger.warning(f"weight-update group {group.name}: {restarted} restarted; making a new group")
                group.destroy()
                group = self._group = None
        if group is not None and group.broken:
            group.destroy()
            group = self._group = None
        if group is None:
            group = UpdateGroup(layouts, self.cfg)
            self._group = group
            group.init()
        return group

    def init_weight_update_group(self) -> None:
        self._update_group(self.layouts())

    def destroy_weight_update_group(self) -> None:
        if self._group is not None:
            self._group.destroy()
            self._group = None

    def close(self) -> None:
        self.destroy_weight_update_group()  # best effort: servers may already be gone


def model_eos_ids(model_path: str) -> list[int]:
    """The model's own EOS ids (Qwen2.5: <|im_end|> and <|endoftext|>), on which SGLang stops too."""
    try:
        from transformers import GenerationConfig

        eos = GenerationConfig.from_pretrained(model_path).eos_token_id
    except (OSError, ValueError):  # no generation_config.json: the tokenizer's EOS is used
        return []
    return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)


def raise_open_file_limit(connections: int) -> None:
    """Lift the soft open-file limit (often 1024) so `connections` sockets per process fit next to
    everything else the process opens; warn when the hard limit does not allow it."""
    want = connections + 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        if new < want:
            logger.warning(
                f"open-file limit {new} (hard) leaves little room for rollout.sglang.max_connections="
                f"{connections}: lower it or raise `ulimit -n`"
            )
