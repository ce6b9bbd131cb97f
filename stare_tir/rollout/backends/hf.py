"""In-process Hugging Face backend: continuous batching over a KV cache, on CPU or one GPU.

Many `generate()` calls are in flight at once (one per trajectory turn). A single asyncio task,
the batcher, owns one running batch and advances it one token per step; the model work of a step
runs on a dedicated worker thread so the event loop keeps serving environments and sandboxes
while the model computes.

One step:
  1. admit waiting requests (when the batch is empty, or every `join_every` steps while it runs):
     prefill their prompts (left padding, in chunks bounded by `prefill_tokens`) and merge their
     KV caches into the running batch (re-padding on the left to a common length);
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

Weights: `update_weights(named_tensors)` copies learner tensors into the model in place (HF names;
a DeepSpeed "module." prefix is stripped); `update_weights_from_disk(dir)` reads safetensors or
.bin shards from an HF checkpoint directory. Both take the step lock, so they never interleave
with a forward. An update that arrives while requests run (asynchronous training pushes while
the next batch generates) first lets the running requests finish on the old weights and holds new
ones back, as SGLang's un-paused update does (its model_update_lock waits for the requests in
flight: managers/tokenizer_manager.py); so every Generation comes from one version, which it names.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Literal

from stare_tir.rollout.backends.base import (
    ROLLOUT_BACKENDS,
    BackendBase,
    Generation,
    SamplingParams,
    StopChecker,
    fast_decoder,
    finish_after_token,
)
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
    # "auto": float32 on CPU (bf16 is ~7x slower on CPUs without AVX-512/AMX), bfloat16 on CUDA.
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # Seed of the backend's sampling RNG (requests with their own seed use a counter-based stream
    # keyed by (seed, token index), independent of the batch they run in).
    seed: int = 0
    # Extra EOS ids besides the tokenizer's eos_token_id and the model's generation_config ones.
    eos_token_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "join_every", "prefill_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be >= 1")


class _Request:
    __slots__ = ("prompt", "sampling", "stop", "future", "tokens", "logprobs", "max_new", "finish", "stop_text")

    def __init__(self, prompt, sampling, stop, future, max_new):
        self.prompt: list[int] = prompt
        self.sampling: SamplingParams = sampling
        self.stop: StopChecker = stop
        self.future: asyncio.Future = future
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.max_new: int = max_new
        self.finish: str | None = None
        self.stop_text: str | None = None


class _Batch:
    """The running batch. Touched only by the worker thread while a step runs."""

    def __init__(self, reqs, cache, mask, next_pos, logits):
        self.reqs: list[_Request] = reqs
        self.cache = cache  # DynamicCache, per layer keys/values [B, H, T, D]
        self.mask: torch.Tensor = mask  # [B, T] long, 0 = left padding
        self.next_pos: torch.Tensor = next_pos  # [B, 1] long, position of the next token
        self.logits: torch.Tensor = logits  # [B, V] float32, next-token logits


def _cache_layers(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) per layer of a DynamicCache, across transformers versions."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))


def _make_cache(kv):
    from transformers import DynamicCache

    cache = DynamicCache()
    for i, (k, v) in enumerate(kv):
        cache.update(k, v, i)
    return cache


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
            model = _load_remote_code_model(model_path, rollout.hf)
        return cls(model, tokenizer, rollout.hf)

    def __init__(
        self,
        model: str | Path | Any,
        tokenizer: Any = None,
        cfg: HFBackendConfig | None = None,
    ) -> None:
        import torch

        self.cfg = cfg or HFBackendConfig()
        if self.cfg.device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        else:
            device = self.cfg.device
        if self.cfg.dtype == "auto":
            dtype = torch.float32 if device == "cpu" else torch.bfloat16
        else:
            dtype = getattr(torch, self.cfg.dtype)
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
        self._lock = threading.Lock()
        self._batch: _Batch | None = None
        self._pending: collections.deque[_Request] = collections.deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None
        self._runner: asyncio.Task | None = None
        # An update in progress holds admission (`_hold`); the batcher says when nothing runs (`_drained`).
        self._hold = threading.Event()
        self._drained = threading.Event()
        self._closed = False
        self.weight_version = "0"  # what stamps every Generation (see `update_weights`)
        self._pushes = 0
        # Counters for benchmarks and stats.
        self.stats = collections.Counter()

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
        req = _Request(list(prompt_ids), sampling, StopChecker(self._decode, stop), fut, max_new)
        self._pending.append(req)
        self._wakeup.set()
        return await fut

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
            self._pushes += 1
            self.weight_version = version if version is not None else str(self._pushes)

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
            admit: list[_Request] = []
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

    def _step(self, admit: list[_Request]) -> list[_Request]:
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
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, **kwargs)
        return out.logits[:, -1, :].float()

    def _admit(self, reqs: list[_Request]) -> None:
        reqs = sorted(reqs, key=lambda r: len(r.prompt))  # similar lengths pad less
        chunk: list[_Request] = []
        for req in reqs + [None]:
            longest = max([len(r.prompt) for r in chunk] + [len(req.prompt) if req else 0])
            if chunk and (req is None or longest * (len(chunk) + 1) > self.cfg.prefill_tokens):
                self._prefill(chunk)
                chunk = []
            if req is not None:
                chunk.append(req)
        self.stats["admitted"] += len(reqs)

    def _prefill(self, reqs: list[_Request]) -> None:
        import torch

        length = max(len(r.prompt) for r in reqs)
        ids = torch.full((len(reqs), length), self.pad_token_id, dtype=torch.long)  # [b, L]
        mask = torch.zeros((len(reqs), length), dtype=torch.long)  # [b, L]
        for i, r in enumerate(reqs):
            ids[i, length - len(r.prompt) :] = torch.tensor(r.prompt, dtype=torch.long)
            mask[i, length - len(r.prompt) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)  # [b, L] positions over real tokens only
        cache = _make_cache([])
        logits = self._forward(ids, mask, pos, cache, keep_last=True)
        self.stats["prefill_tokens"] += int(mask.sum())
        self.stats["prefill_calls"] += 1
        new = _Batch(list(reqs), cache, mask, pos[:, -1:] + 1, logits)
        if self._batch is not None:
            self.stats["joins"] += 1  # merged into a batch that was already decoding
        self._batch = new if self._batch is None else self._merge(self._batch, new)

    @staticmethod
    def _merge(a: _Batch, b: _Batch) -> _Batch:
        """Stack two batches, left-padding the shorter KV cache so time steps line up."""
        import torch
        import torch.nn.functional as F

        ta, tb = a.mask.shape[1], b.mask.shape[1]
        t = max(ta, tb)

        def pad(x, have, dim_from_end):  # left-pad the time dimension with zeros
            if have == t:
                return x
            widths = [0, 0] * (dim_from_end - 1) + [t - have, 0]
            return F.pad(x, widths)

        kv = [
            (torch.cat([pad(ka, ta, 2), pad(kb, tb, 2)]), torch.cat([pad(va, ta, 2), pad(vb, tb, 2)]))
            for (ka, va), (kb, vb) in zip(_cache_layers(a.cache), _cache_layers(b.cache))
        ]
        mask = torch.cat([pad(a.mask, ta, 1), pad(b.mask, tb, 1)])
        return _Batch(
            a.reqs + b.reqs, _make_cache(kv), mask, torch.cat([a.next_pos, b.next_pos]), torch.cat([a.logits, b.logits])
        )

    def _decode_step(self) -> list[_Request]:
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
                for k, v in _cache_layers(b.cache)
            ]
            b = _Batch([b.reqs[i] for i in keep], _make_cache(kv), mask, b.next_pos.index_select(0, idx), None)
        mask = torch.cat([b.mask, b.mask.new_ones((len(keep), 1))], dim=1)  # [B, T+1]
        b.logits = self._forward(next_ids, mask, b.next_pos, b.cache, keep_last=False)
        b.mask, b.next_pos = mask, b.next_pos + 1
        self._batch = b
        return finished

    def _sample(self, logits: torch.Tensor, reqs: list[_Request]) -> tuple[list[int], list[float]]:
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


def _load_remote_code_model(model_path: str, hf: HFBackendConfig) -> Any:
    """The policy with its repository's own code, on the device and dtype `HFBackend.__init__`
    picks ("auto" is CUDA when available, fp32 on CPU and bf16 on GPU)."""
    import torch
    from transformers import AutoModelForCausalLM

    device = ("cuda" if torch.cuda.is_available() else "cpu") if hf.device == "auto" else hf.device
    dtype = (torch.float32 if device == "cpu" else torch.bfloat16) if hf.dtype == "auto" else getattr(torch, hf.dtype)
    return AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype, trust_remote_code=True).to(device)


def iter_checkpoint_tensors(path: str) -> Iterable[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs of an HF checkpoint directory (safetensors preferred, else .bin)."""
    import torch

    root = Path(path)
    files = sorted(root.glob("*.safetensors"))
    if files:
        from safetensors.torch import load_file

        for f in files:
            yield from load_file(str(f)).items()
        return
    files = sorted(root.glob("pytorch_model*.bin"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors or pytorch_model*.bin weights")
    for f in files:
        yield from torch.load(str(f), map_location="cpu", weights_only=True).items()
