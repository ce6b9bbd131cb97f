"""Version behaviours, the unpickling allow-list and the fatal-error type of the SGLang stand-in
(tests/rollout/sglang_standin.py; each quirk names the upstream SGLang file it mirrors)."""

from __future__ import annotations

import io
import pickle
from typing import Any

LOOPBACK = ("127.0.0.1", "localhost", "::1")
SAMPLING_KEYS = {
    "temperature",
    "top_p",
    "top_k",
    "max_new_tokens",
    "stop",
    "no_stop_trim",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "sampling_seed",
}

# Version behaviours, each with the upstream source it mirrors:
QUIRKS = {
    # 0.5.0-0.5.4: output_ids = the detokenizer's decode_ids, which start with up to 5 prompt ids
    # (managers/detokenizer_manager.py, INIT_INCREMENTAL_DETOKENIZATION_OFFSET in
    # schedule_batch.py; upstream issues 10896, 17240).
    "output_ids_prefix",
    # 0.5.0-0.5.4 `Req.check_finished` (schedule_batch.py) tests max_new_tokens before EOS and
    # stop strings: a budget's last token that is EOS or completes a stop reports "length".
    "length_first",
    # /flush_cache answers 400 while a request runs or is still being retired (http_server.py
    # `flush_cache`; scheduler.py `flush_cache` refuses with running/waiting requests), and an
    # update with flush_cache=true then fails (weight_updater.py
    # `flush_cache_after_weight_update`). Measured on 0.5.23 right after a generate.
    "flush_400",
    # sampling_seed is used only with --enable-deterministic-inference
    # (sampling/sampling_batch_info.py); otherwise the server samples from its own stream.
    "seed_ignored",
    # sampling_params has no sampling_seed before it (0.5.2 sampling/sampling_params.py): the
    # request is refused.
    "seed_refused",
    # 0.5.23: update_weights_from_tensor / _distributed refuse to run outside
    # begin_weight_update ... end_weight_update (weight_updater.py); older servers have no
    # such endpoints (404).
    "session_required",
    # 0.5.23 unpickles tensor payloads with SafeUnpickler, an allow-list of globals
    # (utils/common.py); anything else is refused.
    "safe_unpickle",
    # 0.5.5 and older: /pause_generation takes no mode and aborts every request
    # (managers/tokenizer_manager.py `pause_generation`); modes came in 0.5.6.
    "pause_abort_only",
}
COMPAT = {
    "0.5.23": {"flush_400", "seed_ignored", "session_required", "safe_unpickle"},
    "0.5.2": {"output_ids_prefix", "length_first", "flush_400", "seed_refused", "pause_abort_only"},
}
PROMPT_PREFIX = 5  # INIT_INCREMENTAL_DETOKENIZATION_OFFSET
RETIRE_S = 0.05  # a finished request still counts as running this long (flush_400)


class AllowListUnpickler(pickle.Unpickler):
    """Our own small allow-list in the spirit of SGLang's SafeUnpickler (utils/common.py): the
    globals a by-value pickle of CPU tensors needs, nothing that can run code."""

    ALLOWED = {
        ("torch._utils", "_rebuild_tensor_v2"),
        ("torch._utils", "_rebuild_parameter"),
        ("torch", "Size"),
        ("collections", "OrderedDict"),
        ("builtins", "list"),
        ("builtins", "tuple"),
        ("builtins", "dict"),
        ("torch.multiprocessing.reductions", "rebuild_cuda_tensor"),  # CUDA IPC handles (SafeUnpickler allows it)
    }
    STORAGE = ("torch.storage", "_load_from_bytes")
    # what torch's CUDA reduction (torch/multiprocessing/reductions.py `reduce_tensor`) names as
    # arguments of rebuild_cuda_tensor: the tensor and storage classes, and the dtype (a torch.*
    # global). Read from torch's reduction, not from SGLang's list: a run of the real server on
    # GPUs is what confirms SafeUnpickler admits them.
    CUDA_REDUCTION = {
        ("torch", "Tensor"),
        ("torch.nn.parameter", "Parameter"),
        ("torch.storage", "TypedStorage"),
        ("torch.storage", "UntypedStorage"),
        ("torch", "device"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == self.STORAGE:  # SGLang routes this one through a weights_only load
            import torch

            return lambda data: torch.load(io.BytesIO(data), weights_only=True)
        if (module, name) in self.ALLOWED or (module == "torch" and name.endswith("Storage")):
            return super().find_class(module, name)
        if (module, name) in self.CUDA_REDUCTION or (module == "torch" and isinstance(getattr_torch(name), _dtype())):
            return super().find_class(module, name)
        raise RuntimeError(f"Blocked unsafe global ({module}.{name}) during pickle deserialization")


class Fatal(Exception):
    """A fatal scheduler error: SGLang's server goes down with it (see the stand-in's docstring)."""


def getattr_torch(name: str) -> Any:
    import torch

    return getattr(torch, name, None)


def _dtype() -> type:
    import torch

    return torch.dtype


def die(message: str) -> None:
    raise Fatal(message)
