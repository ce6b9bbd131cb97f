"""The SGLang stand-in's generation control (tests/rollout/sglang_standin.py): pauses, updates while
requests run, version spans per request, and a per-token delay. What it mirrors (python/sglang/srt
of 0.5.23):

- `/pause_generation {"mode"}` (entrypoints/http_server.py; managers/tokenizer_manager.py and
  managers/scheduler.py `pause_generation`; managers/io_struct.py `PauseGenerationReqInput`):
    abort: every request in flight ends at once, finish_reason {"type": "abort"}, with the tokens it
      had; the call returns once none is left;
    retract: the running requests go back to the waiting queue with their output kept; after
      `/continue_generation` they are prefilled again under the weights loaded by then and go on;
      `/flush_cache` works meanwhile (the waiting queue is ignored while paused: scheduler.py
      `is_fully_idle(ignore_waiting=...)`);
    in_place: the running requests stop where they are and go on after continue, and `/flush_cache`
      is refused while they are held (upstream keeps their KV cache from the old weights; the
      stand-in recomputes it, which differs from upstream only in the numerics).
  Requests that arrive while paused wait for continue (tokenizer_manager.py `generate_request`
  waits on `is_pause_cond`). 0.5.5 and older (quirk `pause_abort_only`): the body is ignored and
  every request is aborted (0.5.2's tokenizer_manager.py `pause_generation`).
- A weight update while requests run on an un-paused server waits for them to finish and holds new
  ones until it is done: requests hold tokenizer_manager.py's `model_update_lock` as readers, the
  update takes it as a writer; a paused server updates at once (tokenizer_control_mixin.py).
- `/abort_request {"rid"}` (http_server.py, tokenizer_manager.py and scheduler.py `abort_request`):
  every request in flight whose rid starts with it (all with `abort_all`) ends at once with
  finish_reason abort, message "Aborted", and the tokens it had emitted; nothing in flight: ignored.
- After a pause the stop check reads the whole output's tail (schedule_batch.py `check_finished` on
  `output_ids`): a stop string split across the pause ends the request where it completes.
- Version spans: when the version changes, every live request records (old version, its output
  length) (scheduler.py `record_weight_version_change`, utils/weight_versions.py), and its answer
  carries `weight_versions` spans.
- `--token-delay-s D` (not SGLang): each request's tokens come out one per D seconds from its arrival
  (or its continue), like a batched server whose step time does not depend on the batch; the HF
  backend computes them up front, inside that time when it can. Those not yet out at a pause are
  dropped (and, for retract and in_place, recomputed after continue).
- `--enable-deterministic-inference`: upstream runs batch-invariant kernels; the stand-in scores
  each answer's log-probs alone (its seeds are honoured in both).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
from typing import Any, Iterator

from stare_tir.rollout.backends.base import Generation, SamplingParams, StopChecker, finish_after_token

PAUSE_MODES = ("abort", "retract", "in_place")


@dataclasses.dataclass
class Answer:
    """One request's output: the generation, and whether a pause or /abort_request aborted it (the
    message: the pause's, or FINISH_ABORT()'s default for a request aborted by rid)."""

    gen: Generation
    aborted: bool = False
    message: str = "Abort all requests"


class GenerationControl:
    """Pause state, the update lock and the generation flow of one stand-in server."""

    def __init__(self, server: Any, token_delay_s: float = 0.0) -> None:
        self.server = server
        self.token_delay_s = token_delay_s
        self.cond = threading.Condition()
        self.readers = 0  # /generate requests in flight (they hold the update lock as readers)
        self.writer = False
        self.writers_waiting = 0
        self.paused: str | None = None
        self.epoch = 0  # pauses so far: a request sees it change under it
        self.mode_of: dict[int, str] = {}
        self.paused_at: dict[int, float] = {}
        self.updating = 0
        self.updates = 0  # weight updates so far
        # Segments being computed: a segment is one forward pass's worth of the scheduler's work here
        # (its tokens come out later, on the delay's clock), so an update waits for it as SGLang's
        # does for the batch it is running (the pause takes effect between scheduler iterations).
        self.computing = 0
        self.segments_computed = 0  # for tests: a request past this is emitting on the delay's clock
        self._changed: asyncio.Event | None = None  # set at the next pause, continue or abort
        # /abort_request: the rids of the /generate requests in flight, and those told to stop
        self.in_flight: set[str] = set()
        self.aborted: set[str] = set()
        # observations for tests
        self.tokens_during_update = 0  # tokens emitted while weights were being loaded (must stay 0)
        self.pauses: dict[str, int] = dict.fromkeys(PAUSE_MODES, 0)
        self.interrupted = 0  # requests a pause caught mid-answer

    # ------------------------------------------------------------------ HTTP side (handler threads)

    def pause(self, body: dict, abort_only: bool) -> dict:
        mode = "abort" if abort_only else body.get("mode", "abort")
        if mode not in PAUSE_MODES:
            raise ValueError(f"mode={mode!r}: one of {PAUSE_MODES}")
        with self.cond:
            self.paused = mode
            self.epoch += 1
            self.mode_of[self.epoch] = mode
            self.paused_at[self.epoch] = time.perf_counter()
            self.pauses[mode] += 1
            self.cond.notify_all()
        self._notify_loop()
        with self.cond:
            if mode == "abort":  # returns once every request in flight has ended
                self.cond.wait_for(lambda: self.readers == 0, timeout=60)
        return {"message": "Generation paused successfully.", "status": "ok"}

    def resume(self) -> dict:
        with self.cond:
            self.paused = None
            self.cond.notify_all()
        self._notify_loop()
        return {"message": "Generation continued successfully.", "status": "ok"}

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """One /generate: wait while paused, then hold the update lock as a reader."""
        with self.cond:
            self.cond.wait_for(lambda: self.paused is None and not self.writer and not self.writers_waiting)
            self.readers += 1
        try:
            yield
        finally:
            with self.cond:
                self.readers -= 1
                self.cond.notify_all()

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """One weight update: when paused, after the segments being computed; else after the
        requests in flight."""
        with self.cond:
            locked = self.paused is None
            if locked:
                self.writers_waiting += 1
                self.cond.wait_for(lambda: self.readers == 0 and not self.writer)
                self.writers_waiting -= 1
                self.writer = True
            else:  # tokens computed under the new weights must not pass for the old version's
                self.cond.wait_for(lambda: self.computing == 0)
            self.updating += 1
        try:
            yield
        finally:
            with self.cond:
                self.updating -= 1
                self.updates += 1
                if locked:
                    self.writer = False
                self.cond.notify_all()

    def abort_request(self, body: dict) -> None:
        """POST /abort_request {"rid"} or {"abort_all": true} (0.5.23 http_server.py `abort_request`
        -> tokenizer_manager.py `abort_request`): the named request ends at once, answering what it
        had sampled with finish_reason abort; an empty rid or a rid not in flight is ignored."""
        with self.cond:
            rid = body.get("rid") or ""  # scheduler.py `abort_request`: rids that start with it
            rids = {r for r in self.in_flight if body.get("abort_all") or (rid and r.startswith(rid))}
            self.aborted |= rids
        if rids:
            self._notify_loop()

    def flush_refused(self) -> bool:
        """in_place holds its requests in the running batch: no flush until continue."""
        return self.paused == "in_place" and self.readers > 0

    # ------------------------------------------------------------------ one request (event loop)

    def _signal(self) -> asyncio.Event:
        """Set at the next pause or continue (one per change, on the stand-in's event loop)."""
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def _notify_loop(self) -> None:
        loop = self.server.loop

        def wake() -> None:
            if self._changed is not None:
                self._changed.set()
                self._changed = None

        if not loop.is_closed():
            loop.call_soon_threadsafe(wake)

    async def answer(self, prompt: list[int], sampling: SamplingParams, stop: list[str], rid: str = "") -> Answer:
        with self.cond:
            self.in_flight.add(rid)
        try:
            return await self._answer(prompt, sampling, stop, rid)
        finally:
            with self.cond:
                self.in_flight.discard(rid)
                self.aborted.discard(rid)

    async def _computed(self, gen: asyncio.Task, rid: str) -> bool:
        """Wait for a segment's computation; False (and the computation cancelled) when its request
        is aborted first. The HF backend keeps no partial segment: the tokens of a segment cut
        this way are not answered (SGLang answers every token it had sampled)."""
        while not gen.done():
            waiter = asyncio.ensure_future(self._signal().wait())
            await asyncio.wait([gen, waiter], return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if not gen.done() and rid in self.aborted:
                gen.cancel()
                await asyncio.gather(gen, return_exceptions=True)
                return False
        return True

    async def _answer(self, prompt: list[int], sampling: SamplingParams, stop: list[str], rid: str) -> Answer:
        server = self.server
        backend = server.backend
        checker = StopChecker(backend._decode, stop)
        tokens: list[int] = []
        logprobs: list[float] = []
        spans: list[tuple[int, int, str]] = []

        def aborted() -> Answer:  # schedule_batch.py FINISH_ABORT(): what it had emitted
            return Answer(Generation(tokens, logprobs, "length", None, spans), aborted=True, message="Aborted")

        while True:
            while self.paused is not None and rid not in self.aborted:  # held by a pause until continue
                await self._signal().wait()
            if rid in self.aborted:
                return aborted()
            epoch, version, updates = self.epoch, server.weight_version, self.updates
            t0 = time.perf_counter()  # the segment's tokens come out at t0 + (i + 1) x delay
            seg = sampling
            if tokens:  # the rest of the budget; a seed that does not repeat the first segment's draws
                seed = None if sampling.seed is None else (sampling.seed * 1_000_003 + len(tokens)) % (2**31 - 1)
                seg = dataclasses.replace(sampling, max_new_tokens=sampling.max_new_tokens - len(tokens), seed=seed)
            with self.cond:
                self.computing += 1
            try:
                task = asyncio.ensure_future(backend.generate(prompt + tokens, seg, stop))
                if not await self._computed(task, rid):
                    return aborted()
                gen = task.result()
                self.segments_computed += 1
                ids, lps, finish, stop_text = self._cut(gen, tokens, checker, backend.eos_token_ids, sampling)
                if server.deterministic and sampling.top_p == 1.0 and sampling.top_k < 1:
                    lps = await self._batch_invariant_logprobs(prompt + tokens, ids, sampling.temperature)
            finally:
                with self.cond:
                    self.computing -= 1
                    self.cond.notify_all()
            emitted = len(ids)
            delay = self.token_delay_s
            left = len(ids) * delay - (time.perf_counter() - t0)  # computing them took part of it
            while delay and left > 0 and self.epoch == epoch and rid not in self.aborted:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._signal().wait(), timeout=left)
                left = len(ids) * delay - (time.perf_counter() - t0)
            if rid in self.aborted:  # what was out by the abort stays
                out_for = time.perf_counter() - t0
                emitted = min(len(ids), int(out_for / delay)) if delay else len(ids)
            elif self.epoch != epoch:  # paused: what was out by the pause stays, the rest is dropped
                out_for = self.paused_at.get(epoch + 1, t0) - t0
                emitted = min(len(ids), int(out_for / delay)) if delay else 0
            if self.updates != updates and self.epoch == epoch:  # weights changed under a running request
                self.tokens_during_update += emitted
            if emitted:
                if spans and spans[-1][2] == version:
                    spans[-1] = (spans[-1][0], len(tokens) + emitted, version)
                else:
                    spans.append((len(tokens), len(tokens) + emitted, version))
                tokens += ids[:emitted]
                logprobs += lps[:emitted]
            if rid in self.aborted:
                return aborted()
            if emitted == len(ids) and self.epoch == epoch:
                return Answer(Generation(tokens, logprobs, finish, stop_text, spans))
            self.interrupted += 1
            if self.mode_of.get(self.epoch) == "abort":
                return Answer(Generation(tokens, logprobs, "length", None, spans), aborted=True)

    async def _batch_invariant_logprobs(self, context: list[int], ids: list[int], temperature: float) -> list[float]:
        """With --enable-deterministic-inference SGLang runs batch-invariant kernels
        (python/sglang/srt/batch_invariant_ops/): an answer's numbers do not depend on what else was
        in the batch. The HF backend's batched numerics do (in the last bits), so the stand-in
        scores each answer alone: one forward over its own tokens, under the model lock."""
        if not ids or temperature <= 0:
            return [0.0] * len(ids)
        backend = self.server.backend

        def score() -> list[float]:
            import torch

            with backend._lock, torch.inference_mode():
                x = torch.tensor([context + ids], device=backend.device)
                logits = backend.model(input_ids=x).logits[0, len(context) - 1 : -1].float() / temperature
                lp = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids, device=x.device)[:, None])
                return lp.squeeze(1).tolist()

        return await asyncio.get_running_loop().run_in_executor(backend._executor, score)

    @staticmethod
    def _cut(
        gen: Generation, before: list[int], checker: StopChecker, eos_ids: Any, sampling: SamplingParams
    ) -> tuple[list[int], list[float], str, str | None]:
        """A segment after a pause ends where the whole output first finishes: a stop string that
        began before the pause completes inside it (the server's check reads the output's tail)."""
        if not before:
            return list(gen.token_ids), list(gen.logprobs), gen.finish_reason, gen.stop_text
        for j in range(1, len(gen.token_ids) + 1):
            finish, stop_text = finish_after_token(
                before + gen.token_ids[:j], eos_ids, checker, sampling.max_new_tokens
            )
            if finish is not None:
                return list(gen.token_ids[:j]), list(gen.logprobs[:j]), finish, stop_text
        return list(gen.token_ids), list(gen.logprobs), gen.finish_reason, gen.stop_text
