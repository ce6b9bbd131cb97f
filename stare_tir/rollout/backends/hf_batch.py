"""The HF backend's running batch as tensors: its requests, the KV cache, the padding mask and
positions; the inputs of a prefill forward (whole prompts, or suffixes on top of reused prefixes)
and the merge of a prefilled batch into the running one. No model calls here (`hf.py` runs them)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Callable, Iterable, TypeVar

from stare_tir.rollout.backends.base import SamplingParams, StopChecker

if TYPE_CHECKING:
    import torch

    from stare_tir.rollout.backends.hf_prefix import KV, Hit


class Request:
    __slots__ = (
        "prompt", "sampling", "stop", "future", "tokens", "logprobs", "max_new", "finish", "stop_text", "pushes",
    )  # fmt: skip

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
        self.pushes = -1  # the backend's weight-update count when the request was prefilled


class Batch:
    """The running batch. Touched only by the worker thread while a step runs."""

    def __init__(self, reqs, cache, mask, next_pos, logits):
        self.reqs: list[Request] = reqs
        self.cache = cache  # DynamicCache, per layer keys/values [B, H, T, D]
        self.mask: torch.Tensor = mask  # [B, T] long, 0 = padding (left, or a cached prefill's gap)
        self.next_pos: torch.Tensor = next_pos  # [B, 1] long, position of the next token
        self.logits: torch.Tensor = logits  # [B, V] float32, next-token logits


def cache_layers(cache) -> KV:
    """(keys, values) per layer of a DynamicCache, across transformers versions."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))


def make_cache(kv: KV):
    from transformers import DynamicCache

    cache = DynamicCache()
    for i, (k, v) in enumerate(kv):
        cache.update(k, v, i)
    return cache


T = TypeVar("T")


def chunks(items: list[T], padded_tokens: Callable[[list[T]], int], limit: int) -> Iterable[list[T]]:
    """Consecutive runs of `items` whose prefill forward pads to at most `limit` tokens
    (`padded_tokens` of a run); an item over the limit on its own still goes alone."""
    chunk: list[T] = []
    for item in items:
        if chunk and padded_tokens(chunk + [item]) > limit:
            yield chunk
            chunk = []
        chunk.append(item)
    if chunk:
        yield chunk


def fresh_inputs(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, mask, positions), each [b, L]: the prompts left-padded to the longest, positions
    counted over real tokens only."""
    import torch

    length = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), length), pad_id, dtype=torch.long)  # [b, L]
    mask = torch.zeros((len(prompts), length), dtype=torch.long)  # [b, L]
    for i, p in enumerate(prompts):
        ids[i, length - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, length - len(p) :] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)  # [b, L]
    return ids, mask, pos


def cached_inputs(
    items: list[tuple[list[int], Hit]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, KV]:
    """(suffix ids [b, S], mask [b, P + S], positions [b, S], past KV per layer [b, H, P, D]) for
    prompts whose first `hit.n` ids have cached KV.

    Row layout over time: [pad, reused prefix (n), pad, suffix (s)]: the prefixes are left-padded
    to the longest (P), the suffixes to the longest (S), so a row whose suffix is shorter than S
    has a masked gap between its two parts (the caller groups similar suffix lengths). Positions
    count real tokens only: the suffix sits at n..n+s-1, exactly where a full prefill puts it."""
    import torch
    import torch.nn.functional as F

    P = max(h.n for _, h in items)
    S = max(len(p) - h.n for p, h in items)
    ids = torch.full((len(items), S), pad_id, dtype=torch.long)  # [b, S]
    mask = torch.zeros((len(items), P + S), dtype=torch.long)  # [b, P + S]
    pos = torch.zeros((len(items), S), dtype=torch.long)  # [b, S]
    for i, (p, h) in enumerate(items):
        s = len(p) - h.n
        ids[i, S - s :] = torch.tensor(p[h.n :], dtype=torch.long)
        mask[i, P - h.n : P] = 1
        mask[i, P + S - s :] = 1
        pos[i] = h.n  # the gap's positions: it is masked out for every query, any value does
        pos[i, S - s :] = torch.arange(h.n, len(p))
    kv = []
    for layer in range(len(items[0][1].kv)):
        keys = [F.pad(h.kv[layer][0], (0, 0, P - h.n, 0)) for _, h in items]
        values = [F.pad(h.kv[layer][1], (0, 0, P - h.n, 0)) for _, h in items]
        kv.append((torch.cat(keys), torch.cat(values)))
    return ids, mask, pos, kv


def merge_batches(a: Batch, b: Batch) -> Batch:
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
        for (ka, va), (kb, vb) in zip(cache_layers(a.cache), cache_layers(b.cache))
    ]
    mask = torch.cat([pad(a.mask, ta, 1), pad(b.mask, tb, 1)])
    return Batch(
        a.reqs + b.reqs, make_cache(kv), mask, torch.cat([a.next_pos, b.next_pos]), torch.cat([a.logits, b.logits])
    )
