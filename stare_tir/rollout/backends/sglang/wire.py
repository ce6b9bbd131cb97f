"""SGLang's `/generate` wire format: the request's sampling params, the answer parsed into a
`Generation` (see the package docstring for the fields)."""

from __future__ import annotations

from typing import Any, Iterable

from stare_tir.rollout.backends.base import Generation, SamplingParams, classify_finish

SEED_MOD = 2**31 - 1  # SGLang keeps seeds in an int64 tensor, but some kernels take int32


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


def weight_version_spans(meta: dict, n_tokens: int) -> list[tuple[int, int, str]]:
    """(start, end, version) spans of the answer's tokens from `meta_info`.

    0.5.23 reports `weight_version` (the weights when the answer ended) and `weight_versions`,
    spans of output tokens per version when the weights changed mid-request
    (python/sglang/srt/utils/weight_versions.py `add_weight_versions_to_meta_info`). Older
    servers report neither: no spans.
    """
    spans = meta.get("weight_versions")
    if spans:
        return [(int(s["start"]), int(s["end"]), str(s["version"])) for s in spans]
    version = meta.get("weight_version")
    return [(0, n_tokens, str(version))] if version is not None else []


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
        # 0.5.0-0.5.4 prefix output_ids with prompt ids (see the package docstring): the sampled
        # ids must still end it; anything else is a real disagreement.
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
    return Generation(ids, logprobs, finish, stop_text, weight_version_spans(meta, len(ids)))
