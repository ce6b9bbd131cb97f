"""Start-up checks that run before any expensive work (model loading, SFT, DeepSpeed).

A new user's mistakes should end in one line that names the problem and the fix, not in a
traceback after the model has loaded: a model path that does not exist, a data file that is
missing or has a bad row, a sandbox backend that cannot start (no Docker engine, no e2b key), a
registry name that does not exist. `check_*` functions raise `StartupError`; the console entry
points (`stare_tir.cli`) print its message alone unless `--debug` is given.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Literal

from envs.data import DataError
from sandbox import SandboxConfig, SandboxError, make_sandbox
from stare_tir.components import TINY_MODELS, ModelConfig
from stare_tir.data import DataConfig, load_split


class StartupError(RuntimeError):
    """A setting that cannot work, found before the run started; the message says how to fix it."""


def _looks_like_a_path(name: str) -> bool:
    # A hub id is "name" or "owner/name"; anything else with a separator or a leading ./~ is a path.
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name


def check_model(model: ModelConfig, key: str = "model.path") -> None:
    """The model is a built-in name, an HF directory, or something that can only be a hub id."""
    if model.path in TINY_MODELS:
        return
    path = Path(model.path).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise StartupError(
                f"{key}={model.path!r} exists but holds no config.json: point it at a Hugging "
                "Face model directory (save_pretrained output) or a hub id"
            )
    elif _looks_like_a_path(model.path):
        raise StartupError(
            f"{key}={model.path!r}: no such directory; point it at a Hugging Face model "
            "directory (e.g. a run's final/ or sft/model/), a hub id, or 'tiny'"
        )
    if model.tokenizer and _looks_like_a_path(model.tokenizer) and not Path(model.tokenizer).expanduser().exists():
        raise StartupError(
            f"model.tokenizer={model.tokenizer!r}: no such directory; leave it empty to use the model's own tokenizer"
        )
    template = model.chat_template
    if template and "{" not in template and not Path(template).is_file():
        raise StartupError(
            f"model.chat_template={template!r} is neither a Jinja template nor an existing "
            "file; pass the template text or a path to a .jinja file"
        )


def check_data(data: DataConfig) -> dict[str, int]:
    """Both splits load and validate (a missing file or a bad row is reported here, by name)."""
    counts = {}
    for split in ("train", "eval"):
        try:
            counts[split] = len(load_split(data, split))  # type: ignore[arg-type]
        except FileNotFoundError as e:
            raise StartupError(f"data.{split}={getattr(data, split)!r}: {e}") from None
        except DataError as e:
            if ": row " in str(e):  # the source opened, one of its rows is bad
                raise StartupError(
                    f"data.{split}: {e} (fix the row, or set data.on_bad_row=skip to count and skip bad rows)"
                ) from None
            raise StartupError(f"data.{split}={getattr(data, split)!r}: {e}") from None
        except ValueError as e:
            raise StartupError(f"data.{split}={getattr(data, split)!r}: {e}") from None
    return counts


_SANDBOX_FIXES = {
    "local": "run as root or enable unprivileged user namespaces (see sandbox/README.md), or set "
    "sandbox.backend=docker",
    "docker": "start the Docker engine (e.g. `sudo systemctl start docker` or `dockerd &`) and build the "
    "image with `python -m sandbox.docker.build`, or set sandbox.backend=local",
    "e2b": "set E2B_API_KEY (or sandbox.e2b.api_key) and check the network, or set sandbox.backend=local",
}


def check_sandbox(cfg: SandboxConfig) -> dict:
    """Start and stop the configured sandbox once: the cheapest proof that the backend works here."""

    async def start_stop() -> dict:
        async with make_sandbox(cfg) as box:
            return dict(getattr(box, "info", {}) or {})

    try:
        return asyncio.run(start_stop())
    except (SandboxError, OSError, ImportError) as e:
        raise StartupError(
            f"sandbox.backend={cfg.backend} cannot start: {e}. Fix: {_SANDBOX_FIXES[cfg.backend]}"
        ) from None


def check_registry_names(advantage: str, policy_loss: str) -> None:
    """algo.advantage / algo.policy_loss name registered functions (unknown names list valid ones)."""
    from stare_tir.algos.advantage import get_advantage_estimator
    from stare_tir.algos.policy_loss import get_policy_loss

    for key, lookup, name in (
        ("algo.advantage", get_advantage_estimator, advantage),
        ("algo.policy_loss", get_policy_loss, policy_loss),
    ):
        try:
            lookup(name)
        except ValueError as e:
            raise StartupError(f"{key}={name!r}: {e}") from None


def check_backend(kind: Literal["hf", "sglang"], urls: list[str]) -> None:
    if kind == "sglang" and not urls:
        raise StartupError(
            "trainer.backend=sglang needs rollout.sglang.urls (one or more SGLang server URLs, "
            "e.g. rollout.sglang.urls=[http://127.0.0.1:30000])"
        )
