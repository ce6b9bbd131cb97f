"""The backend protocol: token ids in, sampled token ids + their logprobs out.

Every backend (in-process Hugging Face, SGLang over HTTP or in-process) answers one call,
`generate(prompt_ids, sampling, stop)`, for one sequence. Batching is the backend's business:
callers simply keep many `generate` calls in flight (asyncio) and the backend runs them together.

Stop strings are matched on *decoded text* while the token ids are kept exactly as sampled: with
a real BPE a stop string can end inside a token (">\\n\\n" holds the ">" of "</code>") or span
several tokens ("</", "code", ">"). Generation stops after the token that completes the stop
string and that token is returned whole; nothing is trimmed or re-tokenized. `StopChecker` is the
one implementation of that rule; the HF backend and the SGLang stand-in both use it (SGLang itself
applies the same rule on its decoded tail).

No torch import here: this module is light.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Iterable, Literal, Protocol, runtime_checkable

from registry import Registry

FinishReason = Literal["stop", "eos", "length"]


class FinishError(RuntimeError):
    """A backend reported a finish that is neither EOS, a stop string of the request, nor the
    length budget (e.g. SGLang's `matched: "NaN happened"` for an invalid sampled token)."""


@dataclass
class SamplingParams:
    """Per-request sampling settings."""

    # Softmax temperature; 0 means greedy (argmax). RL samples at 1.0 so the rollout distribution
    # is the policy the learner differentiates.
    temperature: float = 1.0
    # Nucleus sampling mass; 1.0 disables it.
    top_p: float = 1.0
    # Keep only the k most likely tokens; -1 disables it.
    top_k: int = -1
    # Upper bound on the tokens this call may sample (the engine clamps it to the trajectory's
    # remaining budget).
    max_new_tokens: int = 512
    # Per-request RNG seed, for reproducible samples where the backend supports it (None: the
    # backend's own stream).
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature!r}: must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={self.top_p!r}: must be in (0, 1]")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k={self.top_k!r}: must be -1 (off) or >= 1")
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens={self.max_new_tokens!r}: must be >= 0")


@dataclass
class Generation:
    """One generate() result.

    token_ids: the sampled ids, in order, including the EOS token or the token that completed a
        stop string (never trimmed).
    logprobs: log-probability of each sampled id under the sampling distribution (same length).
    finish_reason: "eos" (an EOS id was sampled), "stop" (a stop string appeared in the decoded
        output), "length" (max_new_tokens reached).
    stop_text: the stop string that matched when finish_reason == "stop".
    weight_versions: which policy weights sampled which tokens, as (start, end, version) spans over
        `token_ids` (a backend that does not report versions leaves it empty). One span usually;
        more when the weights changed while the request ran (SGLang's `meta_info.weight_versions`).
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    stop_text: str | None = None
    weight_versions: list[tuple[int, int, str]] = field(default_factory=list)

    @property
    def weight_version(self) -> str | None:
        """The version that sampled the last token (None: not reported)."""
        return self.weight_versions[-1][2] if self.weight_versions else None

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(f"token_ids has {len(self.token_ids)} ids but logprobs has {len(self.logprobs)}")


@runtime_checkable
class Backend(Protocol):
    """Everything the rollout engine and the trainer use of an inference backend.

    `generate` and the two weight loads are what every backend does its own way. The rest are
    capabilities of shared servers (SGLang): who pushes, which servers serve stale weights, how
    pushes meet running requests, colocated memory. A backend inside the trainer's process has
    none of them; `BackendBase` gives every one of them its "not here" default, documented there,
    so callers call them unconditionally instead of probing for attributes.
    """

    # One set of servers serves every trainer rank: exactly one rank (0) pushes weights, the
    # others learn the pushed version (`expect_version`). False: each rank has its own backend.
    shared_by_ranks: bool
    # The servers share the learner's GPUs: they free their memory while the learner trains
    # (`release_memory_occupation`) and get it back with the next push.
    colocated: bool
    # The version of the last push (None: none yet): answers stamped otherwise are stale.
    weight_version: str | None

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, stop: list[str]) -> Generation:
        """Sample a continuation of `prompt_ids` until EOS, a stop string or max_new_tokens."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]], version: str | None = None) -> None:
        """Load new policy weights (HF parameter names) from the learner; `version` names them (the
        trainer's weight version; None: the backend counts its own)."""
        ...

    def update_weights_from_disk(self, path: str) -> None:
        """Load new policy weights from an HF checkpoint directory."""
        ...

    def claim_servers(self) -> None:
        """At the start of a run, by the pushing process: take the servers over from whatever a
        previous trainer left (SGLang: clear a pause it died in)."""
        ...

    def accept_version(self, version: str) -> None:
        """`version` is about to be pushed by another process (shared servers): answers carrying it
        are accepted from now on, before the push is confirmed (`expect_version`)."""
        ...

    def expect_version(self, version: str) -> None:
        """Another process pushed `version` (shared servers): answers must now carry it."""
        ...

    def tensor_relay(self, ranks: Any) -> Any:
        """Collective, on every rank before each sync of shared servers with several ranks: a relay
        through which every rank feeds the push (SGLang, colocated tensor sync: `relay.py`), given
        to rank 0's `update_weights(..., relay=)` and run by the others; None: rank 0 alone pushes."""
        ...

    def stale_servers(self) -> list[str]:
        """Servers that serve other weights than the last push (restarted) and need it again."""
        ...

    def take_stale_answers(self) -> int:
        """Answers discarded for their weights since the last call (they were re-run elsewhere)."""
        ...

    def take_aborted_tokens(self) -> int:
        """Tokens that cancelled generate() calls had sampled before they were stopped, since the
        last call (waste the caller cannot see: a cancelled call returns nothing); 0 for a backend
        that does not report them."""
        ...

    def allow_in_flight_updates(self, versions_kept: int) -> None:
        """Asynchronous training: pushes may come while requests run; answers finished by one of
        the `versions_kept` versions before the last push are still accepted."""
        ...

    def take_route_stats(self) -> dict[str, float]:
        """Routing metrics (`route/*`) since the last call; {} for a backend that does not route."""
        ...

    @property
    def released(self) -> dict[str, list[str]]:
        """Colocated: server -> memory tags released and not yet resumed."""
        ...

    def adopt_released(self, released: dict[str, list[str]]) -> None:
        """Colocated: a previous trainer released these tags and never resumed them."""
        ...

    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        """Colocated: the servers free their GPU memory for the learner (once idle)."""
        ...

    async def aclose(self) -> None:
        """Close what lives on the engine's event loop (connections); called on that loop."""
        ...

    def close(self) -> None:
        """Release the backend's resources."""
        ...


class BackendBase:
    """The defaults of `Backend`'s capabilities, for a backend that lives in the trainer's process
    and owns its model (each rank has its own; nothing is shared, routed, released or stale).
    Backends (and test stand-ins) subclass it and override what they can do."""

    shared_by_ranks: bool = False
    colocated: bool = False
    weight_version: str | None = None

    @classmethod
    def from_config(cls, model_path: str, tokenizer: Any, rollout: Any, trust_remote_code: bool = False) -> Backend:
        """The backend a run's settings select (`stare_tir.components.make_backend` calls it).
        rollout: the run's `RolloutConfig`; model_path: the resolved policy checkpoint."""
        raise NotImplementedError(f"{cls.__name__} does not say how it is built from a run's settings")

    @classmethod
    def check_config(cls, rollout: Any, key: str) -> None:
        """Refuse, with one line naming `key`, settings this backend cannot run with (before any
        model is loaded). rollout: the run's `RolloutConfig`."""

    @classmethod
    def prepare_trainer(cls, rollout: Any) -> None:
        """Process settings the trainer must make before the learner starts (e.g. NCCL's)."""

    def claim_servers(self) -> None:
        """Nothing outside this process to take over."""

    def accept_version(self, version: str) -> None:
        """Each rank pushes its own backend: there is no other pusher's version to accept."""

    def expect_version(self, version: str) -> None:
        """Each rank pushes its own backend: there is no other pusher's version to expect."""

    def tensor_relay(self, ranks: Any) -> Any:
        """No relay: one pusher (no collective is run)."""
        return None

    def stale_servers(self) -> list[str]:
        return []

    def take_stale_answers(self) -> int:
        return 0

    def take_aborted_tokens(self) -> int:
        """Not reported: the HF batcher drops a cancelled row at its next step, unmeasured."""
        return 0

    def allow_in_flight_updates(self, versions_kept: int) -> None:
        """An own backend orders pushes and requests itself (the HF backend lets running requests
        finish on the old weights first): nothing to allow."""

    def take_route_stats(self) -> dict[str, float]:
        return {}

    @property
    def released(self) -> dict[str, list[str]]:
        return {}

    def adopt_released(self, released: dict[str, list[str]]) -> None:
        if released:
            raise ValueError(f"{type(self).__name__} has no servers to resume; released tags {released} are not its")

    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        raise NotImplementedError(f"{type(self).__name__} is not colocated: it has no memory to release")

    async def aclose(self) -> None:
        pass

    def close(self) -> None:
        pass


# Rollout backend classes by the name `trainer.backend` / the eval `backend` select. Each class is
# registered where it is defined; those modules import torch only when a backend is built, so
# reading the names (config validation, --help) stays light.
ROLLOUT_BACKENDS: Registry[type[BackendBase]] = Registry(
    "rollout backend", load=("stare_tir.rollout.backends.hf", "stare_tir.rollout.backends.sglang.backend")
)


def fast_decoder(tokenizer: Any):
    """A fast `ids -> str` function that keeps special tokens (for stop-string matching).

    Uses the Rust tokenizer directly when there is one (about 4x cheaper than the Python wrapper;
    the decode runs once per sampled token).
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return lambda ids: backend.decode(list(ids), skip_special_tokens=False)
    return lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False)


class StopChecker:
    """Detects the first stop string in a growing sequence of sampled tokens.

    Call `feed(tokens)` after every new token with all tokens sampled so far in this call; it
    returns the stop string whose first occurrence ends inside the newest token, else None.

    Why a window suffices: an occurrence that was not there one token ago must end in the newest
    token; every token decodes to at least one byte, so the occurrence lies within the last
    `len(stop in bytes)` tokens. One extra token of left context is decoded so that a character
    split across tokens decodes whole. A cheap pre-filter skips the window decode unless the
    newest token's text contains a stop string's last character (or is a partial UTF-8 piece).
    """

    def __init__(self, decode, stops: Iterable[str]) -> None:
        self.stops = [s for s in dict.fromkeys(stops) if s]
        self._decode = decode
        self._window = max((len(s.encode("utf-8")) for s in self.stops), default=0) + 1
        self._last_chars = {s[-1] for s in self.stops}
        self._piece_cache: dict[int, bool] = {}

    def _may_end_stop(self, token_id: int) -> bool:
        hit = self._piece_cache.get(token_id)
        if hit is None:
            piece = self._decode([token_id])
            hit = "\ufffd" in piece or any(c in piece for c in self._last_chars)
            self._piece_cache[token_id] = hit
        return hit

    def feed(self, tokens: list[int]) -> str | None:
        if not self.stops or not tokens or not self._may_end_stop(tokens[-1]):
            return None
        text = self._decode(tokens[-self._window :])
        found = [(text.find(s), s) for s in self.stops if s in text]
        if not found:
            return None
        # Several stops can complete on the same token: report the one that starts first.
        return min(found)[1]


def finish_after_token(
    tokens: list[int], eos_ids: Collection[int], checker: StopChecker | None, max_new_tokens: int
) -> tuple[FinishReason | None, str | None]:
    """The one finish rule of every backend, applied after each sampled token.

    Order: EOS, then a stop string completed by the newest token, then the budget. A turn whose
    last budget token is EOS or completes `</code>` is therefore a stop, not a cut turn (SGLang
    0.5.0-0.5.4 checked the budget first, `check_finished` in
    python/sglang/srt/managers/schedule_batch.py; 0.5.23's `update_finish_state` checks stop
    strings and EOS before the length cap, as here). Returns (None, None) while generation goes on.
    """
    if tokens and tokens[-1] in eos_ids:
        return "eos", None
    hit = checker.feed(tokens) if checker is not None else None
    if hit is not None:
        return "stop", hit
    if len(tokens) >= max_new_tokens:
        return "length", None
    return None, None


def classify_finish(
    tokens: list[int],
    stops: list[str],
    eos_ids: Collection[int],
    decode: Callable[[list[int]], str] | None,
    reported: str,
    matched: Any = None,
    text: str | None = None,
) -> tuple[FinishReason, str | None]:
    """Finish of a whole answer from a server: `finish_after_token` on its last token, then the
    server's own report, accepted only where it names an EOS or one of the request's stops.

    reported: "stop" | "length" (SGLang's finish_reason.type); matched: its `matched` (an int
    token id or a str). decode: ids -> text; without one, `text` (the server's decoded output,
    stop strings kept) is searched instead: a server that checks stops after every token would
    have ended at an earlier occurrence, so any occurrence was completed by the final token.
    Raises FinishError for a `matched` that is neither (the answer must not be trained on).
    """
    checker = StopChecker(decode, stops) if decode is not None else None
    finish, stop_text = finish_after_token(tokens, eos_ids, checker, len(tokens) + 1)
    if finish is not None:
        return finish, stop_text
    if decode is None and text is not None:
        found = [(text.find(s), s) for s in dict.fromkeys(stops) if s and s in text]
        if found:
            return "stop", min(found)[1]
    if reported == "length":
        return "length", None
    if reported == "stop":
        if isinstance(matched, str) and matched in stops:
            return "stop", matched  # the server saw it in its full decoded text
        if isinstance(matched, int) and tokens and matched == tokens[-1]:
            # the server's EOS set (generation_config, stop_token_ids) can be wider than ours
            return "eos", None
    raise FinishError(
        f"finish_reason type={reported!r} matched={matched!r} is neither an EOS id "
        f"ending the output nor one of the request's stop strings {stops}; the "
        "answer is dropped (a NaN or out-of-vocabulary token on the server?)"
    )
