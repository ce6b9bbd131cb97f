"""One rollout record: a prompt, everything after it, and which tokens the model wrote.

`Trajectory` is the unit the rollout engine produces and the learner consumes. There is exactly one
way to grow it, `append(ids, logprobs, kind)`, which keeps `response_ids`, `loss_mask` and
`rollout_logprobs` the same length and records a span per segment, so no caller can leave the
three arrays out of step.

Invariants (checked by `check()` and by the tests):
- `response_ids` is exactly what the backend was conditioned on after `prompt_ids`: model tokens are
  the ids the backend sampled (never re-tokenized from text) and observation tokens are the ids
  the engine fed it (tokenized once: as plain text, or for a chat tool format as the chat
  template's rendering of the tool turn, its control tokens included).
- `loss_mask[k]` is 1 for model tokens and 0 for observation tokens; `rollout_logprobs[k]` is the
  sampling logprob for model tokens and 0.0 for observation tokens.
- `turns` tiles `response_ids` without gaps: (start, end, kind) with kind "model" or "obs".
- `weight_versions` holds (start, end, version) spans inside model turns: which policy weights
  sampled those tokens, as the backend reported them (per turn, or finer when the weights changed
  mid-turn). A trainer can bound how stale any span is before training on it.

No torch here: the learner turns the lists into tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

TrajFinish = Literal["answer", "eos", "max_turns", "max_tokens", "error"]
SpanKind = Literal["model", "obs"]
FINISH_REASONS: tuple[str, ...] = ("answer", "eos", "max_turns", "max_tokens", "error")


@dataclass
class Trajectory:
    """A prompt and its multi-turn response, token-in/token-out (see module docstring)."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    # 1 = sampled by the model (trained on), 0 = observation (never trained on); per response token.
    loss_mask: list[int] = field(default_factory=list)
    # Backend's sampling logprob per response token; 0.0 on observation tokens.
    rollout_logprobs: list[float] = field(default_factory=list)
    reward: float = 0.0
    # Why the trajectory ended: answer (env done), eos (model ended without the env finishing),
    # max_turns, max_tokens (total budget or a turn cut by its budget), error (env or backend raised).
    finish_reason: TrajFinish | None = None
    # (start, end, kind) over response_ids, in order, tiling it.
    turns: list[tuple[int, int, SpanKind]] = field(default_factory=list)
    # (start, end, weight version) over response_ids: the weights that sampled model tokens.
    weight_versions: list[tuple[int, int, str]] = field(default_factory=list)
    num_turns: int = 0  # model turns
    tool_calls: int = 0
    void_turns: int = 0  # model turns with neither code nor answer (as counted by the env)
    timeouts: int = 0  # tool calls that hit the sandbox time limit
    sandbox_error: bool = False  # infrastructure failure: exclude from the update, never score
    text: str = ""  # decoded response (special tokens skipped)
    problem_id: str = ""
    group_id: int = 0  # index of the problem in the batch handed to the engine
    info: dict = field(default_factory=dict)

    def append(
        self,
        ids: list[int],
        logprobs: list[float] | None,
        kind: SpanKind,
        weight_versions: list[tuple[int, int, str]] = (),
    ) -> None:
        """Append one segment: model tokens with their logprobs, or observation tokens (None).

        weight_versions: (start, end, version) spans over `ids` (model segments only; a backend's
        `Generation.weight_versions`)."""
        if kind == "model":
            if logprobs is None or len(logprobs) != len(ids):
                raise ValueError(
                    f"model segment needs one logprob per token: {len(ids)} ids, "
                    f"{None if logprobs is None else len(logprobs)} logprobs"
                )
            mask, lps = 1, [float(x) for x in logprobs]
        elif kind == "obs":
            if logprobs is not None:
                raise ValueError("observation segments carry no logprobs (pass None)")
            mask, lps = 0, [0.0] * len(ids)
            if weight_versions:
                raise ValueError("observation segments carry no weight versions")
        else:
            raise ValueError(f"kind={kind!r}: must be 'model' or 'obs'")
        if not ids:
            return
        start = len(self.response_ids)
        self.response_ids.extend(int(i) for i in ids)
        self.loss_mask.extend([mask] * len(ids))
        self.rollout_logprobs.extend(lps)
        self.turns.append((start, len(self.response_ids), kind))
        for lo, hi, version in weight_versions:
            if not 0 <= lo < hi <= len(ids):
                raise ValueError(f"weight version span ({lo}, {hi}) outside the {len(ids)} new tokens")
            self.weight_versions.append((start + lo, start + hi, str(version)))

    @property
    def infra_failure(self) -> bool:
        """True when the record must not reach the loss: the sandbox infrastructure failed, or the
        env/backend raised (finish "error"). Such a trajectory is neither right nor wrong."""
        return self.sandbox_error or self.finish_reason == "error"

    @property
    def num_model_tokens(self) -> int:
        return sum(self.loss_mask)

    def model_spans(self) -> list[tuple[int, int]]:
        return [(s, e) for s, e, k in self.turns if k == "model"]

    def check(self) -> None:
        """Raise AssertionError if an invariant of the record is broken."""
        n = len(self.response_ids)
        assert len(self.loss_mask) == n and len(self.rollout_logprobs) == n, "length mismatch"
        pos = 0
        for start, end, kind in self.turns:
            assert start == pos and end > start, f"span ({start}, {end}) does not tile at {pos}"
            want = 1 if kind == "model" else 0
            assert all(m == want for m in self.loss_mask[start:end]), f"mask wrong in {kind} span"
            if kind == "obs":
                assert all(lp == 0.0 for lp in self.rollout_logprobs[start:end])
            pos = end
        assert pos == n, "spans do not cover the response"
        model = self.model_spans()
        for lo, hi, _ in self.weight_versions:
            assert any(s <= lo < hi <= e for s, e in model), f"weight span ({lo}, {hi}) outside model turns"
        assert self.finish_reason is None or self.finish_reason in FINISH_REASONS
