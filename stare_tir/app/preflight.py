"""Start-up checks that run before any expensive work (model loading, SFT, DeepSpeed).

A new user's mistakes should end in one line that names the problem and the fix, not in a
traceback after the model has loaded: a model path that does not exist, a hub id that does not
exist or a hub that cannot be reached, a data file that is missing or has a bad row, an SGLang
server that does not answer, a `sync_dir` that cannot be written, a sandbox backend that cannot
run one cell (no Docker engine, no e2b key), a registry name that does not exist, a requested
tracker that is not installed. Every remote piece is asked once, with a short timeout, except
SGLang servers that are still loading: they are waited for (`rollout.sglang.startup_timeout_s`).
`check_*` functions raise `StartupError`; the console entry points (`stare_tir.app.cli`) print its
message alone unless `--debug` is given.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Literal

from loguru import logger

from envs.data import SHIPPED, DataError
from sandbox import SandboxConfig, SandboxError, make_sandbox
from stare_tir.data import DataConfig, load_split
from stare_tir.errors import StartupError
from stare_tir.model import PACKAGED_MODELS, TINY_MODELS, ModelConfig, check_packaged_model

# Seconds a start-up check waits for a remote piece (hub, SGLang server) before reporting it.
REMOTE_TIMEOUT_S = 10.0


def _looks_like_a_path(name: str) -> bool:
    # A hub id is "name" or "owner/name"; anything else with a separator or a leading ./~ is a path.
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name


def check_model(model: ModelConfig, key: str = "model.path") -> None:
    """The model is a built-in name, an HF directory, or something that can only be a hub id."""
    if model.path in TINY_MODELS:
        return
    if model.path in PACKAGED_MODELS:  # a name, never a hub id: no network
        try:
            check_packaged_model(model.path)
        except FileNotFoundError as exc:
            raise StartupError(str(exc)) from None
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
    else:
        check_hub_repo(model.path, key, "model")
    if model.tokenizer and not Path(model.tokenizer).expanduser().exists():
        if _looks_like_a_path(model.tokenizer):
            raise StartupError(
                f"model.tokenizer={model.tokenizer!r}: no such directory; leave it empty to use the model's own tokenizer"
            )
        check_hub_repo(model.tokenizer, "model.tokenizer", "model")
    template = model.chat_template
    if template and "{" not in template and not Path(template).is_file():
        raise StartupError(
            f"model.chat_template={template!r} is neither a Jinja template nor an existing "
            "file; pass the template text or a path to a .jinja file"
        )


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def check_hub_repo(
    name: str,
    key: str,
    repo_type: Literal["model", "dataset"] = "model",
    timeout_s: float = REMOTE_TIMEOUT_S,
    value: str | None = None,
) -> None:
    """A Hugging Face hub id exists and can be fetched: found in the local cache, or confirmed by
    one hub request with a short timeout. Otherwise one line says why (no such repository, gated,
    hub unreachable, offline) and what to do, instead of minutes of download retries."""
    from huggingface_hub import HfApi, try_to_load_from_cache

    setting = f"{key}={value or repr(name)}"
    probe = "config.json" if repo_type == "model" else "README.md"
    if isinstance(try_to_load_from_cache(name, probe, repo_type=repo_type), str):
        return  # already downloaded: loading needs no network
    fetch = f"`hf download {name}{' --repo-type dataset' if repo_type == 'dataset' else ''} --local-dir DIR`"
    local = "a local directory" if repo_type == "model" else "a local .jsonl/.parquet file"
    if _offline():
        if repo_type == "dataset":
            return  # the datasets library keeps its own offline cache; loading it will tell
        raise StartupError(
            f"{setting}: HF_HUB_OFFLINE is set and this {repo_type} is not in the local Hugging Face "
            f"cache: download it where there is network ({fetch}) and set {key} to {local}"
        )
    api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None)  # read now: tests and mirrors set it late
    info = api.model_info if repo_type == "model" else api.dataset_info
    try:
        info(name, timeout=timeout_s)
    except Exception as e:  # noqa: BLE001 - classified by name: the hub client's errors vary by version
        kind = type(e).__name__
        if kind == "GatedRepoError":
            raise StartupError(
                f"{setting} is a gated {repo_type}: accept its terms on its hub page and log in "
                "(`hf auth login`), or download it and set a local path"
            ) from None
        if kind == "RepositoryNotFoundError":
            raise StartupError(
                f"{setting}: no such {repo_type} on the Hugging Face hub (check the spelling; a private "
                f"one needs `hf auth login`), and no such local path either"
            ) from None
        status = getattr(getattr(e, "response", None), "status_code", None)
        if status is not None:
            raise StartupError(f"{setting}: the Hugging Face hub answered HTTP {status}: {e}") from None
        raise StartupError(
            f"{setting} is no local path, and the Hugging Face hub is unreachable ({kind}: "
            f"{str(e).splitlines()[0] if str(e) else 'no answer'}): if it is a directory, check the path; "
            f"if it is a hub id, download it where there is network ({fetch}) and set {key} to {local}, "
            "or set HF_ENDPOINT to a reachable mirror"
        ) from None


def _hub_dataset(source: str) -> str | None:
    """The hub id of a data source that `envs.data.load_problems` would fetch from the hub."""
    if source in SHIPPED or Path(source).expanduser().exists():
        return None
    if source.startswith("hf:") or re.fullmatch(r"[\w.-]+/[\w.-]+(?::[\w.\[\]%:-]+)?", source):
        return source.removeprefix("hf:").partition(":")[0]
    return None


def check_hub_dataset(source: str, key: str) -> None:
    """An `hf:` (or owner/name) data source exists on the hub, before `datasets` retries for minutes."""
    name = _hub_dataset(source)
    if name is not None:
        check_hub_repo(name, key, "dataset", value=repr(source))


def check_data(data: DataConfig) -> dict[str, int]:
    """Both splits load and validate (a missing file or a bad row is reported here, by name)."""
    counts = {}
    for split in ("train", "eval"):
        if getattr(data, split) != "arithmetic":
            check_hub_dataset(getattr(data, split), f"data.{split}")
        try:
            counts[split] = len(load_split(data, split))  # type: ignore[arg-type]
        except FileNotFoundError as e:
            raise StartupError(f"data.{split}={getattr(data, split)!r}: {e}") from None
        except DataError as e:
            if ": row " in str(e):  # the source opened, one of its rows is bad
                mapping = _field_hint(str(e))
                fix = f"map the source's field with data.fields={mapping}, " if mapping else ""
                raise StartupError(
                    f"data.{split}: {e} ({fix}fix the row, or set data.on_bad_row=skip to count and skip bad rows)"
                ) from None
            raise StartupError(f"data.{split}={getattr(data, split)!r}: {e}") from None
        except ValueError as e:
            raise StartupError(f"data.{split}={getattr(data, split)!r}: {e}") from None
    return counts


# Names other datasets give our fields (a row holding one of them, and not ours, was mapped wrong).
_FIELD_SYNONYMS = {
    "problem": ("question", "prompt", "query", "input", "problem_text"),
    "answer": ("solution", "final_answer", "ground_truth", "gold", "target", "label", "expected_answer"),
}


def _field_hint(message: str) -> str | None:
    """`{answer: solution}` for envs.data's "missing answer (field 'answer'; row has [..., 'solution'])"."""
    m = re.search(r"missing (\w+) \(field '[^']*'; row has \[(.*?)\]\)", message)
    if m is None or m.group(1) not in _FIELD_SYNONYMS:
        return None
    keys = re.findall(r"'([^']*)'", m.group(2))
    near = [k for k in _FIELD_SYNONYMS[m.group(1)] if k in keys]
    return f"{{{m.group(1)}: {near[0]}}}" if near else None


_SANDBOX_FIXES = {
    "local": "run as root or enable unprivileged user namespaces (see sandbox/README.md), or set "
    "sandbox.backend=docker",
    "docker": "start the Docker engine (e.g. `sudo systemctl start docker` or `dockerd &`) and build the "
    "image with `python -m sandbox.docker.build`, or set sandbox.backend=local",
    "e2b": "set E2B_API_KEY (or sandbox.e2b.api_key) and check the network, or set sandbox.backend=local",
}


def check_sandbox(cfg: SandboxConfig, timeout_s: float = 120.0) -> dict:
    """Start the configured sandbox and run one cell in one session: the cheapest proof that the
    backend works here (for e2b: that the key is accepted and a cloud sandbox starts)."""
    fix = _SANDBOX_FIXES.get(cfg.backend, f"check sandbox.{cfg.backend}.*, or set sandbox.backend=local")
    if cfg.backend == "e2b" and not (cfg.e2b.api_key or os.environ.get("E2B_API_KEY") or cfg.e2b.debug):
        raise StartupError(
            "sandbox.backend=e2b needs an API key: set E2B_API_KEY (or sandbox.e2b.api_key; keys at "
            "https://e2b.dev/dashboard), or set sandbox.backend=local"
        )

    async def one_cell() -> tuple[dict, Any]:
        async with make_sandbox(cfg) as box:
            async with box.session() as session:
                result = await session.run("print(6 * 7)")
            return dict(box.info or {}), result

    try:
        info, result = asyncio.run(asyncio.wait_for(one_cell(), timeout_s))
    except asyncio.TimeoutError:
        raise StartupError(
            f"sandbox.backend={cfg.backend}: one cell did not finish within {timeout_s:.0f} s. Fix: {fix}"
        ) from None
    except (SandboxError, OSError, ImportError) as e:
        raise StartupError(f"sandbox.backend={cfg.backend} cannot start: {e}. Fix: {fix}") from None
    if not result.ok or result.stdout.strip() != "42":
        why = result.error or result.stderr.strip().splitlines()[-1:] or result.status.value
        raise StartupError(f"sandbox.backend={cfg.backend} cannot run code ({result.status.value}: {why}). Fix: {fix}")
    return info


def check_backend(kind: str, sglang: Any, key: str = "trainer.backend") -> None:
    """A registered backend (`ROLLOUT_BACKENDS`); with SGLang: servers are named and every one
    answers (`check_sglang_health`), waiting up to `rollout.sglang.startup_timeout_s` in all for
    servers that are still loading."""
    from stare_tir.rollout.backends.base import ROLLOUT_BACKENDS

    if kind not in ROLLOUT_BACKENDS:
        raise StartupError(ROLLOUT_BACKENDS.unknown(kind, key))
    if kind != "sglang":
        return
    if not sglang.urls:
        raise StartupError(
            f"{key}=sglang needs rollout.sglang.urls (one or more SGLang server URLs, "
            "e.g. rollout.sglang.urls=[http://127.0.0.1:30000])"
        )
    deadline = time.monotonic() + sglang.startup_timeout_s  # one wait for all: they load side by side
    for name, urls in (("urls", sglang.urls), ("weight_urls", sglang.weight_urls)):
        for i, url in enumerate(urls):
            check_sglang_health(url, f"rollout.sglang.{name}[{i}]", sglang.startup_timeout_s, deadline=deadline)


# While servers load: seconds between two tries, and between two progress lines in the log.
STARTUP_POLL_S = 2.0
STARTUP_LOG_EVERY_S = 30.0


def _ask_server(url: str, timeout_s: float) -> tuple[str, str]:
    """One look at a server: ("ready" | "loading" | "other", what it answered).

    GET <url>/model_info (a server; /health where that is 404: a router, which forwards it). Not
    /health first: on 0.5.23 it runs a one-token generate (python/sglang/srt/entrypoints/
    http_server.py `health_generate`), which a server left paused by a killed trainer holds until
    it times out, and which computes on freed memory while a colocated server is released.
    Loading: nothing listens yet (a server opens its port once its model is loaded), or 503 (up,
    still warming up; 502/504 from a proxy in front of one). A name that does not resolve, or any
    other answer, is no SGLang server and never will be."""
    status, path = 0, "/model_info"
    for path in ("/model_info", "/health"):
        try:
            with urllib.request.urlopen(url.rstrip("/") + path, timeout=timeout_s) as response:
                status = response.status
        except urllib.error.HTTPError as e:
            status = e.code
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            if isinstance(reason, socket.gaierror):
                return "other", f"its host name does not resolve ({reason})"
            return "loading", f"no answer: {reason}"
        if status != 404:
            break
    if status == 200:
        return "ready", f"{path}: HTTP 200"
    if status in (502, 503, 504):
        return "loading", f"{path}: HTTP {status}, still loading"
    return "other", f"it answered {path} with HTTP {status}"


def check_sglang_health(
    url: str,
    key: str,
    startup_timeout_s: float = 0.0,
    timeout_s: float = REMOTE_TIMEOUT_S,
    deadline: float | None = None,
) -> None:
    """The server at `url` answers as a ready SGLang server. One still loading (nothing listens
    yet, or 503) is asked again every few seconds until `deadline` (default: now +
    `startup_timeout_s`), with a progress line every 30 s; one that answers as something else
    fails at once."""
    start = time.monotonic()
    deadline = start + startup_timeout_s if deadline is None else deadline
    next_log = start + STARTUP_POLL_S  # quiet unless it has to wait
    says = int(os.environ.get("RANK", "0")) == 0  # every rank waits; rank 0 tells
    while True:
        state, said = _ask_server(url, max(1.0, min(timeout_s, deadline - time.monotonic())))
        waited = time.monotonic() - start
        if state == "ready":
            if waited >= STARTUP_POLL_S and says:
                logger.info(f"SGLang server {key}={url} is ready after {waited:.0f} s")
            return
        if state == "other":
            raise StartupError(
                f"{key}={url!r} is no SGLang server ({said}): point it at a server started with "
                "`python -m sglang.launch_server --model-path MODEL --port PORT`"
            )
        if time.monotonic() >= deadline:
            if startup_timeout_s <= 0:
                waiting = ""
            else:
                waiting = f" after waiting {waited:.0f} s (rollout.sglang.startup_timeout_s={startup_timeout_s:g})"
            raise StartupError(
                f"{key}={url!r}: no SGLang server answers there ({said}){waiting}: start one "
                "(`python -m sglang.launch_server --model-path MODEL --port PORT`), fix the URL, or "
                "raise rollout.sglang.startup_timeout_s for a model that loads longer"
            )
        if time.monotonic() >= next_log and says:
            logger.info(
                f"waiting for the SGLang server {key}={url} ({said}); {waited:.0f} s of "
                f"rollout.sglang.startup_timeout_s={startup_timeout_s:g}"
            )
            next_log = time.monotonic() + STARTUP_LOG_EVERY_S
        time.sleep(max(0.0, min(STARTUP_POLL_S, deadline - time.monotonic())))


def check_router(sglang: Any) -> None:
    """A sglang-router among rollout.sglang.urls needs its workers in rollout.sglang.weight_urls:
    weight pushes must reach every worker, and the router answers 404 to them (see
    stare_tir/rollout/backends/sglang/router.py)."""
    from stare_tir.rollout.backends.sglang.router import check_router_urls

    try:
        check_router_urls(sglang.urls, sglang.weight_urls, timeout_s=REMOTE_TIMEOUT_S)
    except ValueError as e:
        raise StartupError(str(e)) from None


def check_sync_dir(sglang: Any) -> None:
    """`weight_sync=disk` writes each sync to rollout.sglang.sync_dir: it must be named and writable."""
    if sglang.weight_sync != "disk":
        return
    if not sglang.sync_dir:
        raise StartupError(
            "rollout.sglang.weight_sync=disk needs rollout.sglang.sync_dir: a directory the trainer writes "
            "and every SGLang server reads (shared storage when servers run on other nodes)"
        )
    path = Path(sglang.sync_dir).expanduser()
    probe = path / f".write-probe-{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as e:
        raise StartupError(
            f"rollout.sglang.sync_dir={sglang.sync_dir!r} cannot be written ({e.strerror or e}): point it at a "
            "directory this process can write and every SGLang server can read"
        ) from None


def gpu_recipe_without_gpu(cfg: Any) -> str | None:
    """The warning for a training config made for GPUs (a bf16 learner, SGLang rollouts, an HF
    backend on cuda: the 7B recipes) started where no CUDA device is visible: it would start and
    run its learner on the CPU, hours per step, without a word. None when nothing is amiss. torch
    is imported only for such a config (it loads in seconds; a CPU config is not made to wait)."""
    wants = [f"learner.dtype={cfg.learner.dtype}"] if cfg.learner.dtype == "bf16" else []
    if cfg.trainer.backend == "sglang":
        wants.append("trainer.backend=sglang")
    if str(cfg.rollout.hf.device).startswith("cuda"):
        wants.append(f"rollout.hf.device={cfg.rollout.hf.device}")
    if not wants:
        return None
    import torch

    if torch.cuda.is_available():
        return None
    return (
        f"this config is made for GPUs ({', '.join(wants)}) but no CUDA device is visible here: the learner "
        "runs on the CPU, hours per step for a 7B model. Run it on a GPU node (check CUDA_VISIBLE_DEVICES "
        "and `stare-env`), or on a CPU start from configs/tiny_cpu.yaml or configs/smollm2_cpu.yaml"
    )


# Optional mirrors of metrics.jsonl: (config key, module to import, package to install).
_TRACKERS = (("trainer.tensorboard", "tensorboard", "tensorboard"), ("trainer.wandb_project", "wandb", "wandb"))


def check_trackers(tensorboard: bool, wandb_project: str | None) -> None:
    """A tracker that is asked for is installed (a run must not start and then log nowhere)."""
    wanted = {"trainer.tensorboard": tensorboard, "trainer.wandb_project": bool(wandb_project)}
    for key, module, package in _TRACKERS:
        if wanted[key] and not _installed(module):
            value = "true" if key == "trainer.tensorboard" else repr(wandb_project)
            off = "trainer.tensorboard=false" if key == "trainer.tensorboard" else "trainer.wandb_project=null"
            raise StartupError(
                f"{key}={value} needs the {package} package, which is not installed: "
                f"pip install 'stare-tir[tracking]' (or pip install {package}), or set {off}"
            )


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a module set to None in sys.modules: blocked, i.e. absent
        return False
