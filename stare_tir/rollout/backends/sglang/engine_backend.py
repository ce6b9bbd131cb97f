"""`SGLangEngineBackend`: an in-process `sglang.Engine` (GPU only; sglang is imported when built)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from stare_tir.rollout.backends._weights import buckets
from stare_tir.rollout.backends.base import BackendBase, Generation, SamplingParams
from stare_tir.rollout.backends.sglang.config import MEMORY_TAGS, SGLangConfig
from stare_tir.rollout.backends.sglang.push import bucket_bytes
from stare_tir.rollout.backends.sglang.wire import parse_generate_output, sampling_payload

if TYPE_CHECKING:
    import torch


class SGLangEngineBackend(BackendBase):
    """An in-process `sglang.Engine`.

    engine_kwargs go to `sglang.Engine` (ServerArgs), e.g. tp_size, mem_fraction_static,
    enable_memory_saver=True (needed for release/resume_memory_occupation).
    Weight updates use the Engine's update_weights_from_tensor (colocated, in buckets; the Engine
    serializes one payload per TP rank itself, entrypoints/engine.py) inside its begin/end
    weight-update session where the Engine has one (0.5.23 refuses tensor updates outside it),
    and update_weights_from_disk.
    """

    def __init__(self, model_path: str, cfg: SGLangConfig | None = None, **engine_kwargs) -> None:
        try:
            import sglang
        except ImportError as exc:
            raise ImportError(
                "the in-process SGLang backend needs sglang on a CUDA machine: pip install 'stare-tir[sglang]'"
            ) from exc
        self.cfg = cfg or SGLangConfig()
        self.engine = sglang.Engine(model_path=model_path, **engine_kwargs)
        self.weight_version: str | None = None
        self._pushes = 0

    @property
    def colocated(self) -> bool:  # type: ignore[override]
        return self.cfg.colocate

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, stop: list[str]) -> Generation:
        out = await self.engine.async_generate(
            input_ids=list(prompt_ids),
            return_logprob=True,
            sampling_params=sampling_payload(sampling, stop, self.cfg.send_seed),
        )
        return parse_generate_output(out, stop)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: str | None = None) -> None:
        has_session = hasattr(self.engine, "begin_weight_update")
        if has_session:
            _check_engine_result(self.engine.begin_weight_update())
        try:
            for bucket, last in buckets(named_tensors, bucket_bytes(self.cfg)):
                res = self.engine.update_weights_from_tensor(named_tensors=bucket, load_format=None, flush_cache=last)
                _check_engine_result(res)
        finally:
            if has_session:
                _check_engine_result(self.engine.end_weight_update())
        self._pushed(version)

    def update_weights_from_disk(self, path: str, version: str | None = None) -> None:
        _check_engine_result(self.engine.update_weights_from_disk(str(path)))
        self._pushed(version)

    def _pushed(self, version: str | None) -> None:
        self._pushes += 1
        self.weight_version = version if version is not None else str(self._pushes)

    def flush_cache(self) -> None:
        self.engine.flush_cache()

    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        self.engine.flush_cache()  # idle first (the scheduler asserts it, see SGLangBackend)
        self.engine.release_memory_occupation(tags=list(tags or MEMORY_TAGS))

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        self.engine.resume_memory_occupation(tags=list(tags or MEMORY_TAGS))

    def close(self) -> None:
        self.engine.shutdown()


def _check_engine_result(res: Any) -> None:
    """Engine weight calls answer (success, message, ...) or a dict with "success"."""
    if isinstance(res, tuple) and res and res[0] is False:
        raise RuntimeError(f"SGLang weight update failed: {res[1] if len(res) > 1 else res}")
    if isinstance(res, dict) and res.get("success") is False:
        raise RuntimeError(f"SGLang weight update failed: {res.get('message')}")
