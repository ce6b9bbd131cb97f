"""The HF backend's prefix cache: the KV of finished requests, kept so that a later request whose
prompt starts with the same ids (the next turn of a tool-calling trajectory: its prompt is the
previous prompt + the previous answer + the tool output) prefills only its new suffix.

A finished row holds KV for `prompt + generated[:-1]`: its last sampled token was never fed to the
model. The entry is keyed by exactly those ids, so the next turn (which starts with the whole
answer) matches it and prefills the last answer token along with the tool output.

Exactness: keys and values of position p depend only on ids[:p + 1] (causal attention) and were
computed at the positions counted over real tokens (RoPE is applied before caching), so reusing
them conditions the model on exactly the ids it would have seen with a full prefill; only float
rounding differs (the KV came from decode steps instead of one prefill forward).

Touched only under the backend's step lock (its worker thread, or a weight update).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

KV = list[tuple["torch.Tensor", "torch.Tensor"]]  # per layer (keys, values), each [1, H, n, D]


@dataclass
class Hit:
    """A cached prefix for a prompt: the KV of its first `n` ids (n < len(prompt))."""

    n: int
    kv: KV


class PrefixCache:
    """Finished requests' KV, matched by exact token prefix, least recently stored evicted first
    once the tokens held would pass `budget_tokens`."""

    def __init__(self, budget_tokens: int) -> None:
        if budget_tokens < 0:
            raise ValueError(f"prefix cache budget {budget_tokens}: must be >= 0 tokens (0 disables it)")
        self.budget_tokens = budget_tokens
        self._entries: collections.OrderedDict[int, tuple[list[int], KV]] = collections.OrderedDict()
        self._next_key = 0
        self.tokens = 0  # ids whose KV is held now
        self.evicted_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def take(self, prompt: list[int]) -> Hit | None:
        """The longest entry whose ids start `prompt`, removed from the cache (the request carries
        its KV on; it comes back extended when the request finishes). At most len(prompt) - 1 ids
        are reused: the last prompt token must be fed to get the next-token logits."""
        best, best_len = None, 0
        for key, (ids, _) in self._entries.items():
            n = len(ids)
            # cheap rejects first: most entries belong to other trajectories
            if best_len < n <= len(prompt) and prompt[n - 1] == ids[-1] and prompt[:n] == ids:
                best, best_len = key, n
        if best is None:
            return None
        ids, kv = self._entries.pop(best)
        self.tokens -= len(ids)
        n = min(len(ids), len(prompt) - 1)
        if n < 1:
            return None
        if n < len(ids):  # the prompt is exactly the entry: recompute its last id for the logits
            kv = [(k[:, :, :n], v[:, :, :n]) for k, v in kv]
        return Hit(n, kv)

    def put(self, ids: list[int], kv: KV) -> None:
        """Keep `kv` (the KV of exactly `ids`), evicting the oldest entries to stay in budget."""
        if not ids or len(ids) > self.budget_tokens:
            return
        while self._entries and self.tokens + len(ids) > self.budget_tokens:
            _, (old, _) = self._entries.popitem(last=False)
            self.tokens -= len(old)
            self.evicted_tokens += len(old)
        self._entries[self._next_key] = (list(ids), kv)
        self._next_key += 1
        self.tokens += len(ids)

    def clear(self) -> None:
        """Drop everything (new weights make every cached key and value stale)."""
        self._entries.clear()
        self.tokens = 0


def row_kv(layers: KV, mask: torch.Tensor, row: int) -> KV:
    """Row `row`'s keys and values at its real (unmasked) time steps, as new [1, H, n, D] tensors.

    layers: the running batch's per-layer (keys, values) [B, H, T, D]; mask: [B, T], 0 = padding
    (left padding, and the gap a cached prefill leaves between a reused prefix and its suffix)."""
    cols = mask[row].nonzero().squeeze(1)  # [n]
    return [(k[row : row + 1].index_select(2, cols), v[row : row + 1].index_select(2, cols)) for k, v in layers]
