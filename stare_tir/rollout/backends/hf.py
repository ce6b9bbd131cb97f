"""In-process Hugging Face backend: continuous batching over a KV cache, on CPU or one GPU.

Many `generate()` calls are in flight at once (one per trajectory turn). A single asyncio task,
the batcher, owns one running batch and advances it one token per step; the model work of a step
runs on a dedicated worker thread so the event loop keeps serving environments and sandboxes
while the model computes.

One step:
  1. admit waiting requests (when the batch is empty, or every `join_every` steps while it runs):
     prefill their prompts (left padding, in chunks bounded by `prefill_tokens`) and merge their
     KV caches into the running batch (re-padding on the left to a common length); a prompt that
     starts with a finished request's prompt + answer (the next turn of a trajectory) prefills only
     its new suffix on top of that request's kept KV (`hf_prefix.py`, `rollout.hf.prefix_cache_tokens`);
  2. sample one token per row from the current next-token logits (temperature, top-k, top-p; the
     logprob is taken under that same sampling distribution), append it to its request;
  3. rows that sampled EOS, completed a stop string (matched on decoded text, `StopChecker`) or
     reached their token budget leave the batch and their futures resolve;
  4. one forward of the remaining rows' new tokens (KV cache) gives the next logits.

Why it is exact: every row is fed precisely its prompt ids and then its own sampled ids, with
padding masked out and positions counted over real tokens only, so the model is conditioned on
`prompt_ids + generated[:k]` when it samples token k (tests recompute and compare logprobs).

One event loop at a time: when generate() is first awaited on a new loop (each asyncio.run, or
another engine's loop), the batcher moves there and requests left on the old loop are dropped.

Model work runs on `rollout.hf.threads` torch threads, set in the worker thread only (`hf_cpu.py`).
Prefill and reuse counts: `stats`, `prefill_stats()`, and per step `take_route_stats()` (the same
`route/prompt_tokens` and `route/cached_frac` as SGLang's prefix cache reports).

Weights: `update_weights(named_tensors)` copies learner tensors into the model in place (HF names;
a DeepSpeed "module." prefix is stripped); `update_weights_from_disk(dir)` reads safetensors or
.bin shards from an HF checkpoint directory. Both take the step lock, so they never interleave
with a forward. An update that arrives while requests run (asynchronous training pushes while
the next batch generates) first lets the running requests finish on the old weights and holds new
ones back, as SGLang's un-paused update does (its model_update_lock waits for the requests in
flight: managers/tokenizer_manager.py); so every Generation comes from one version, which it names.
Every update empties the prefix cache (its keys and values came from the old weights).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Literal

from loguru import logger

from stare_tir.rollout.backends._weights import iter_checkpoint_tensors
from stare_tir.rollout.backends.base import (
    ROLLOUT_BACKENDS,
    BackendBase,
    Generation,
    SamplingParams,
    StopChecker,
    fast_decoder,
    finish_after_token,
)
from stare_tir.rollout.backends.hf_batch import (
    Batch,
    Request,
    cache_layers,
    cached_inputs,
    chunks,
    fresh_inputs,
    make_cache,
    merge_batches,
)
from stare_tir.rollout.backends.hf_cpu import (
    apply_worker_threads,
    load_remote_code_model,
    resolve_device,
    resolve_dtype,
    resolve_threads,
)
from stare_tir.rollout.backends.hf_prefix import Hit, PrefixCache, row_kv
from stare_tir.rollout.backends.sampling import sample_tokens

if TYPE_CHECKING:
    import torch


@dataclass
class HFBackendConfig:
    """Settings of the in-process Hugging Face backend."""

    # Rows decoded together. Throughput on CPU grows with the batch up to ~64-128 rows for the
    # tiny model; on GPU it can be much larger.
    max_batch_size: int = 128
    # While a batch runs, waiting requests join it every `join_every` decode steps: joining costs
    # a prefill forward, so doing it every step for single arrivals wastes work; waiting too long
    # idles the newcomers (multi-turn turns arrive one by one as sandbox calls return).
    join_every: int = 4
    # Max padded prompt tokens per prefill forward (bounds activation memory for long contexts).
    prefill_tokens: int = 16384
    # "auto": CUDA when available, else CPU.
    device: str = "auto"
    # "auto": float32 on CPU, bfloat16 on CUDA. bf16 on a CPU with native bf16 (avx512_bf16 or
    # amx_bf16 flags; measured on SmolLM2-135M, 16 rows, one thread, scripts/bench/bench_hf_engine.py)
    # prefills ~1.8-2.3x and decodes ~1.5-1.7x faster, but its log-probs differ from an fp32
    # recompute of the same tokens by 0.03-0.04 on average (max 0.28-0.35, 1-1.4% of tokens past a
    # 0.2 clip) where fp32 agrees to 4e-5: the fp32 learner would train off-policy. Without native bf16
    # (emulated: ONEDNN_MAX_CPU_ISA=AVX2) bf16 prefills 4.5x and decodes 2.2x slower than fp32.
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # Torch intra-op threads of the backend's model work (set in its worker thread only; the
    # learner's thread keeps its own). "auto": on CPU, one thread when the process has fewer than
    # 4 cores (its cores are shared: OpenMP workers spin-wait for cores other processes hold), else
    # all its cores; on an accelerator torch's setting is left alone.
    threads: int | Literal["auto"] = "auto"
    # Prefix cache budget, in tokens: finished requests keep their KV (least recently stored
    # evicted first) so that the next turn of a trajectory, whose prompt starts with the previous
    # prompt + answer, prefills only the tool output and what follows (`hf_prefix.py`); 0 disables
    # it. Memory per token = 2 * layers * kv_heads * head_dim * dtype bytes: 45 KiB for
    # SmolLM2-135M in float32 (32768 tokens: 1.4 GiB), 56 KiB for Qwen2.5-7B in bfloat16.
    prefix_cache_tokens: int = 32768
    # Seed of the backend's sampling RNG (requests with their own seed use a counter-based stream
    # keyed by (seed, token index), independent of the batch they run in).
    seed: int = 0
    # Extra EOS ids besides the tokenizer's eos_token_id and the model's generation_config ones.
    eos_token_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "join_every", "prefill_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be >= 1")
        if self.threads != "auto" and (isinstance(self.threads, bool) or self.threads < 1):
            raise ValueError(f"threads={self.threads!r}: must be >= 1 or 'auto'")
        if self.prefix_cache_tokens < 0:
            raise ValueError(f"prefix_cache_tokens={self.prefix_cache_tokens!r}: must be >= 0 (0 disables the cache)")


@ROLLOUT_BACKENDS.register("hf", config=HFBackendConfig)  # its settings: rollout.hf
class HFBackend(BackendBase):
    """Continuous-batching generation with a Hugging Face causal LM (see module docstring).

    model: a loaded `PreTrainedModel`, or a path/hub id to load with AutoModelForCausalLM.
    tokenizer: needed to decode for stop strings; loaded from `model` when it is a path.
    In process: each trainer rank has its own (`BackendBase`'s defaults: not shared, not colocated).
    """

    @classmethod
    def from_config(cls, model_path: str, tokenizer: Any, rollout: Any, trust_remote_code: bool = False) -> HFBackend:
        model: Any = model_path
        if trust_remote_code:  # a path is loaded without it: hand the built module instead
            model = load_remote_code_model(model_path, rollout.hf.device, rollout.hf.dtype)
        return cls(model, tokenizer, rollout.hf)

    def __init__(
        self,
        model: str | Path | Any,
        tokenizer: Any = None,
        cfg: HFBackendConfig | None = None,
    ) -> None:
        import torch

        self.cfg = cfg or HFBackendConfig()
        device = resolve_device(self.cfg.device)
        dtype = resolve_dtype(self.cfg.dtype, device)
        if isinstance(model, (str, Path)):
            from transformers import AutoModelForCausalLM, AutoTokenizer

            if tokenizer is None:
                tokenizer = AutoTokenizer.from_pretrained(str(model))
            model = AutoModelForCausalLM.from_pretrained(str(model), dtype=dtype)
            model.to(device)
        elif self.cfg.device != "auto" or self.cfg.dtype != "auto":
            model.to(device=device, dtype=dtype)
        if tokenizer is None:
            raise ValueError("tokenizer is required when model is an already-built module")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self._decode = fast_decoder(tokenizer)
        eos = set(self.cfg.eos_token_ids)
        if tokenizer.eos_token_id is not None:
            eos.add(int(tokenizer.eos_token_id))
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        if gen_eos is not None:
            eos.update([gen_eos] if isinstance(gen_eos, int) else gen_eos)
        self.eos_token_ids: frozenset[int] = frozenset(int(e) for e in eos)
        self.pad_token_id = int(
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_token_ids)
        )
        self.max_positions = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._keep_logits = "logits_to_keep" in params
        self._rng = torch.Generator(device=self.device).manual_seed(self.cfg.seed)
        # One worker thread runs all model work; the lock keeps weight updates out of a step.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-backend")
        threads, why = resolve_threads(self.cfg.threads, str(self.device))
        if threads is not None:
            apply_worker_threads(self._executor, threads)
        logger.info(
            f"HF backend: {self.device}, {next(model.parameters()).dtype}, "
            f"{threads if threads is not None else torch.get_num_threads()} torch thread(s) for its model work ({why}), "
            f"prefix cache {self.cfg.prefix_cache_tokens} tokens"
        )
        self._prefix = PrefixCache(self.cfg.prefix_cache_tokens) if self.cfg.prefix_cache_tokens else None
        self._lock = threading.Lock()
        self._batch: Batch | None = None
        self._pending: collections.deque[Request] = collections.deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None
        self._runner: asyncio.Task | None = None
        # An update in progress holds admission (`_hold`); the batcher says when nothing runs (`_drained`).
        self._hold = threading.Event()
        self._drained = threading.Event()
        self._closed = False
        self.weight_version = "0"  # what stamps every Generation (see `update_weights`)
        self._pushes = 0
        # Counters for benchmarks and stats: prefill_tokens (computed) and reused_tokens (taken
        # from the prefix cache), prefill_s / decode_s (seconds in those forwards), ...
        self.stats = collections.Counter()
        self._aborted_tokens = 0  # sampled for generate() calls cancelled since take_aborted_tokens
        self._route_seen: dict[str, float] = {}  # stats at the last take_route_stats()

    # ------------------------------------------------------------------ public API

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, stop: list[str]) -> Generation:
        if self._closed:
            raise RuntimeError("HFBackend is closed")
        if not prompt_ids:
            raise ValueError("prompt_ids is empty: the model needs at least one token to condition on")
        self._ensure_runner()
        max_new = min(sampling.max_new_tokens, self.max_positions - len(prompt_ids))
        if max_new <= 0:
            return Generation([], [], "length")
        fut = self._loop.create_future()
        req = Request(list(prompt_ids), sampling, StopChecker(self._decode, stop), fut, max_new)
        self._pending.append(req)
        self._wakeup.set()
        try:
            return await fut
        except asyncio.CancelledError:  # the batcher drops the row at its next step
            self._aborted_tokens += len(req.tokens)  # sampled for a caller that went away: waste
            raise

    def take_aborted_tokens(self) -> int:
        """Tokens that cancelled generate() calls had sampled, since the last call."""
        taken, self._aborted_tokens = self._aborted_tokens, 0
        return taken

    async def generate_batch(
        self, prompts: list[list[int]], sampling: SamplingParams, stop: list[str]
    ) -> list[Generation]:
        """Generate for many prompts at once (all join the same batch)."""
        return list(await asyncio.gather(*(self.generate(p, sampling, stop) for p in prompts)))

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: str | None = None) -> None:
        """Copy (name, tensor) pairs into the model in place; unknown names raise KeyError.

        version: names the new weights in every later Generation (None: this backend's count of
        updates)."""
        import torch

        with self._requests_drained(), self._lock, torch.no_grad():
            state = self.model.state_dict()  # shares storage with the parameters
            unknown, loaded = [], 0
            for name, tensor in named_tensors:
                key = name[len("module.") :] if name.startswith("module.") else name
                target = state.get(key)
                if target is None:
                    unknown.append(name)
                    continue
                if tuple(target.shape) != tuple(tensor.shape):
                    raise ValueError(
                        f"{name}: shape {tuple(tensor.shape)} does not match the model's {tuple(target.shape)}"
                    )
                target.copy_(tensor.detach().to(device=target.device, dtype=target.dtype))
                loaded += 1
            if unknown:
                raise KeyError(f"{len(unknown)} weight names not in the model, e.g. {unknown[:5]}")
            if loaded == 0:
                raise ValueError("update_weights received no tensors")
            if self._prefix is not None:
                self._prefix.clear()  # keys and values of the old weights
            self._pushes += 1
            self.weight_version = version if version is not None else str(self._pushes)

    def take_route_stats(self) -> dict[str, float]:
        """How the prefix cache served the prompts since the last call, as SGLang's `route/*`
        (docs/metrics.md): prompt tokens admitted and the share reused instead of computed."""
        now = {k: float(self.stats[k]) for k in ("prefill_tokens", "reused_tokens")}
        delta = {k: v - self._route_seen.get(k, 0.0) for k, v in now.items()}
        self._route_seen = now
        prompt = delta["prefill_tokens"] + delta["reused_tokens"]
        return {"route/prompt_tokens": prompt, "route/cached_frac": delta["reused_tokens"] / prompt if prompt else 0.0}

    def prefill_stats(self) -> dict[str, float]:
        """Totals since the backend was built: prompt tokens computed and reused, the cache's
        entries and tokens held and evicted."""
        cache = self._prefix
        return {
            "prefill_tokens": float(self.stats["prefill_tokens"]),
            "reused_tokens": float(self.stats["reused_tokens"]),
            "prefix_hits": float(self.stats["prefix_hits"]),
            "cache_entries": float(len(cache)) if cache else 0.0,
            "cache_tokens": float(cache.tokens) if cache else 0.0,
            "evicted_tokens": float(cache.evicted_tokens) if cache else 0.0,
        }

    def update_weights_from_disk(self, path: str) -> None:
        """Load weights from an HF checkpoint directory (safetensors or .bin shards)."""
        self.update_weights(iter_checkpoint_tensors(path))

    @contextlib.contextmanager
    def _requests_drained(self):
        """Hold new requests and wait until the running ones have finished (see the module
        docstring). Nothing to wait for when the batcher's loop is not running (the trainer's
        synchronous loop) or when called on that loop's own thread (it could never drain)."""
        loop, runner = self._loop, self._runner
        if loop is None or not loop.is_running() or runner is None or runner.done() or _runs_in(loop):
            yield
            return
        self._drained.clear()
        self._hold.set()
        loop.call_soon_threadsafe(self._wakeup.set)
        try:
            while not self._drained.wait(timeout=1.0):
                if runner.done():  # the batcher ended (closed): nothing will run any more
                    break
            yield
        finally:
            self._hold.clear()
            if not loop.is_closed():
                loop.call_soon_threadsafe(self._wakeup.set)

    def close(self) -> None:
        self._closed = True
        runner = self._runner
        if runner is not None and not runner.done():
            loop = runner.get_loop()
            if loop.is_running():
                loop.call_soon_threadsafe(runner.cancel)
            elif not loop.is_closed():  # idle loop (e.g. an engine's): let the task finish
                runner.cancel()
                try:
                    loop.run_until_complete(asyncio.gather(runner, return_exceptions=True))
                except RuntimeError:  # another loop runs in this thread: leave it cancelled
                    pass
        self._executor.shutdown(wait=True)
        if self._prefix is not None:
            self._prefix.clear()

    # ------------------------------------------------------------------ batcher (event loop)

    def _ensure_runner(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._runner is None or self._runner.done():
            # A new event loop (each engine.run() uses asyncio.run): anything left from the old
            # loop belongs to cancelled callers, so drop it.
            if self._wakeup is not None:  # wake the old batcher so it can see it is superseded
                try:
                    self._wakeup.set()
                except RuntimeError:  # its loop is closed: nothing left to wake
                    pass
            self._loop = loop
            self._pending.clear()
            self._batch = None
            self._wakeup = asyncio.Event()
            self._runner = loop.create_task(self._run(), name="hf-backend-batcher")

    async def _run(self) -> None:
        try:
            await self._batcher()
        except BaseException as exc:  # never leave callers waiting on a dead batcher
            if isinstance(exc, GeneratorExit):
                raise  # closed by the garbage collector after its loop ended: no caller is left
            if asyncio.current_task() is not self._runner:
                raise  # superseded: the state belongs to the current runner, leave it alone
            held = list(self._pending) + (self._batch.reqs if self._batch else [])
            self._pending.clear()
            self._batch = None
            for req in held:
                if not req.future.done():
                    if isinstance(exc, asyncio.CancelledError):
                        req.future.cancel()
                    else:
                        req.future.set_exception(exc)
            raise

    async def _batcher(self) -> None:
        loop = asyncio.get_running_loop()
        steps_since_join = 0
        while True:
            if asyncio.current_task() is not self._runner:
                return  # superseded by a runner on a newer event loop; the state is theirs now
            if self._batch is None and (not self._pending or self._hold.is_set()):
                if self._hold.is_set():  # an update waits for the running requests: none left
                    self._drained.set()
                self._wakeup.clear()
                await self._wakeup.wait()
                # Let every coroutine that is already runnable submit before the batch starts.
                for _ in range(3):
                    await asyncio.sleep(0)
                continue  # re-check: the wake-up may mean this batcher was superseded
            admit: list[Request] = []
            if (
                self._pending
                and not self._hold.is_set()
                and (self._batch is None or steps_since_join >= self.cfg.join_every)
            ):
                free = self.cfg.max_batch_size - (len(self._batch.reqs) if self._batch else 0)
                while self._pending and len(admit) < free:
                    req = self._pending.popleft()
                    if not req.future.done():
                        admit.append(req)
            if admit:
                steps_since_join = 0
            try:
                finished = await loop.run_in_executor(self._executor, self._step, admit)
            except Exception as exc:  # a failed step fails every request it held
                failed = admit + (self._batch.reqs if self._batch else [])
                self._batch = None
                for req in failed:
                    if not req.future.done():
                        req.future.set_exception(exc)
                continue
            steps_since_join += 1
            for req in finished:
                if not req.future.done():
                    req.future.set_result(
                        Generation(
                            req.tokens,
                            req.logprobs,
                            req.finish,
                            req.stop_text,
                            [(0, len(req.tokens), self.weight_version)] if req.tokens else [],
                        )
                    )
            await asyncio.sleep(0)

    # ------------------------------------------------------------------ model work (worker thread)

    def _step(self, admit: list[Request]) -> list[Request]:
        import torch

        with self._lock, torch.inference_mode():
            if admit:
                self._admit(admit)
            if self._batch is None:
                return []
            return self._decode_step()

    def _forward(self, ids, mask, pos, cache, keep_last: bool) -> torch.Tensor:
        """Run the model on `ids` [B, t] after `cache`; returns last-position logits [B, V]."""
        kwargs = {self._cache_kw: cache, "use_cache": True}
        if keep_last and self._keep_logits:
            kwargs["logits_to_keep"] = 1  # never materialise [B, L, V] logits for a prompt
        t0 = time.perf_counter()
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, **kwargs)
        logits = out.logits[:, -1, :].float()
        self.stats["prefill_s" if keep_last else "decode_s"] += time.perf_counter() - t0
        return logits

    def _admit(self, reqs: list[Request]) -> None:
        for req in reqs:
            req.pushes = self._pushes
        hits: dict[int, Hit] = {}
        if self._prefix is not None:
            for req in reqs:
                hit = self._prefix.take(req.prompt)
                if hit is not None:
                    hits[id(req)] = hit
        # similar lengths pad less: whole prompts for the others, new suffixes for the cached ones
        fresh = sorted((r for r in reqs if id(r) not in hits), key=lambda r: len(r.prompt))
        for chunk in chunks(fresh, lambda c: max(len(r.prompt) for r in c) * len(c), self.cfg.prefill_tokens):
            self._prefill(chunk)
        cached = sorted(((r, hits[id(r)]) for r in reqs if id(r) in hits), key=lambda x: len(x[0].prompt) - x[1].n)
        width = lambda c: (max(h.n for _, h in c) + max(len(r.prompt) - h.n for r, h in c)) * len(c)  # noqa: E731
        for chunk in chunks(cached, width, self.cfg.prefill_tokens):
            self._prefill_cached(chunk)
        self.stats["admitted"] += len(reqs)

    def _prefill(self, reqs: list[Request]) -> None:
        ids, mask, pos = (x.to(self.device) for x in fresh_inputs([r.prompt for r in reqs], self.pad_token_id))
        cache = make_cache([])
        logits = self._forward(ids, mask, pos, cache, keep_last=True)
        self.stats["prefill_tokens"] += int(mask.sum())
        self.stats["prefill_calls"] += 1
        self._join(Batch(list(reqs), cache, mask, pos[:, -1:] + 1, logits))

    def _prefill_cached(self, items: list[tuple[Request, Hit]]) -> None:
        """Prefill only the new suffixes, on top of the reused prefixes' KV (`hf_prefix.py`;
        the row layout: `hf_batch.cached_inputs`)."""
        import torch

        reqs = [r for r, _ in items]
        ids, mask, pos, kv = cached_inputs([(r.prompt, h) for r, h in items], self.pad_token_id)
        ids, mask, pos = ids.to(self.device), mask.to(self.device), pos.to(self.device)
        cache = make_cache(kv)
        logits = self._forward(ids, mask, pos, cache, keep_last=True)
        self.stats["prefill_tokens"] += sum(len(r.prompt) - h.n for r, h in items)
        self.stats["reused_tokens"] += sum(h.n for _, h in items)
        self.stats["prefix_hits"] += len(items)
        self.stats["prefill_calls"] += 1
        next_pos = torch.tensor([[len(r.prompt)] for r in reqs], dtype=torch.long, device=self.device)
        self._join(Batch(reqs, cache, mask, next_pos, logits))

    def _join(self, new: Batch) -> None:
        if self._batch is not None:
            self.stats["joins"] += 1  # merged into a batch that was already decoding
        self._batch = new if self._batch is None else merge_batches(self._batch, new)

    def _decode_step(self) -> list[Request]:
        import torch

        b = self._batch
        tokens, logprobs = self._sample(b.logits, b.reqs)
        finished, keep = [], []
        for i, req in enumerate(b.reqs):
            if req.future.done():  # caller went away (cancelled)
                req.finish = "cancelled"
                finished.append(req)
                continue
            tok = tokens[i]
            req.tokens.append(tok)
            req.logprobs.append(logprobs[i])
            req.finish, req.stop_text = finish_after_token(req.tokens, self.eos_token_ids, req.stop, req.max_new)
            if req.finish:
                finished.append(req)
            else:
                keep.append(i)
        self.stats["decode_steps"] += 1
        self.stats["sampled_tokens"] += len(b.reqs)
        if finished and self._prefix is not None:
            self._keep_finished(b)
        if not keep:
            self._batch = None
            return finished
        next_ids = torch.tensor([[tokens[i]] for i in keep], dtype=torch.long, device=self.device)
        if finished:
            idx = torch.tensor(keep, device=self.device)
            mask = b.mask.index_select(0, idx)
            start = int(mask.any(0).nonzero()[0])  # drop columns that are padding in every row
            mask = mask[:, start:]
            kv = [
                (k.index_select(0, idx)[:, :, start:], v.index_select(0, idx)[:, :, start:])
                for k, v in cache_layers(b.cache)
            ]
            b = Batch([b.reqs[i] for i in keep], make_cache(kv), mask, b.next_pos.index_select(0, idx), None)
        mask = torch.cat([b.mask, b.mask.new_ones((len(keep), 1))], dim=1)  # [B, T+1]
        b.logits = self._forward(next_ids, mask, b.next_pos, b.cache, keep_last=False)
        b.mask, b.next_pos = mask, b.next_pos + 1
        self._batch = b
        return finished

    def _keep_finished(self, b: Batch) -> None:
        """Put the KV of the rows that just finished into the prefix cache. It covers exactly
        prompt + tokens[:-1]: the token sampled last was never fed to the model."""
        layers = cache_layers(b.cache)
        for i, req in enumerate(b.reqs):
            if req.finish in (None, "cancelled") or not req.tokens or req.pushes != self._pushes:
                continue  # running, gone, or part of its KV is from weights replaced since
            ids = req.prompt + req.tokens[:-1]
            if len(ids) > self._prefix.budget_tokens:
                continue
            held = int(b.mask[i].sum())
            if held != len(ids):  # a bookkeeping bug would make reused prefixes inexact: be loud
                raise RuntimeError(f"prefix cache: a finished row holds KV for {held} tokens, expected {len(ids)}")
            self._prefix.put(ids, row_kv(layers, b.mask, i))

    def _sample(self, logits: torch.Tensor, reqs: list[Request]) -> tuple[list[int], list[float]]:
        seeds = [r.sampling.seed for r in reqs]
        return sample_tokens(
            logits,
            temperatures=[r.sampling.temperature for r in reqs],
            top_ks=[r.sampling.top_k for r in reqs],
            top_ps=[r.sampling.top_p for r in reqs],
            seeds=seeds,
            counters=[len(r.tokens) for r in reqs] if any(x is not None for x in seeds) else None,
            rng=self._rng,
        )


def _runs_in(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
