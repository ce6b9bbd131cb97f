"""Start-up checks of every remote piece: the Hugging Face hub (model ids, `hf:` datasets), SGLang
servers, the weight-sync directory, trackers, and the e2b key. Each failure is one line naming
the problem and the fix, within seconds, and nothing is written to the run directory.

The hub here is a local HTTP server answering as huggingface.co does for the one route the check
uses (`GET /api/{models,datasets}/<id>`: 200 with the repo's JSON, or an error with the
`X-Error-Code` header that huggingface_hub/utils/_http.py `hf_raise_for_status` turns into
RepositoryNotFoundError / GatedRepoError). SGLang servers are local servers answering `/health`
as python/sglang/srt/entrypoints/http_server.py does (200 when ready, 503 while not).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import pytest

from stare_tir.app.preflight import (
    StartupError,
    check_backend,
    check_hub_dataset,
    check_hub_repo,
    check_sync_dir,
    check_trackers,
)
from stare_tir.rollout.backends.sglang import SGLangConfig

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def http_server(answer) -> Iterator[str]:
    """A local server; `answer(path) -> (status, headers, body)` for every GET."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            status, headers, body = answer(self.path)
            self.send_response(status)
            for k, v in {"Content-Type": "application/json", **headers}.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def hub(path: str) -> tuple[int, dict, bytes]:
    """huggingface.co's answers: `org/exists` exists, `org/gated` is gated, the rest not found."""
    kind, _, repo = path.split("?")[0].removeprefix("/api/").partition("/")
    if repo == "org/exists":
        return 200, {}, json.dumps({"id": repo, "sha": "0" * 40, "siblings": []}).encode()
    if repo == "org/gated":
        return 401, {"X-Error-Code": "GatedRepo"}, b'{"error": "gated"}'
    return 404, {"X-Error-Code": "RepoNotFound"}, json.dumps({"error": "Repository not found"}).encode()


@pytest.fixture
def fake_hub(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))  # nothing cached
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with http_server(hub) as url:
        monkeypatch.setenv("HF_ENDPOINT", url)
        yield url


def closed_port_url() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # closed once the block ends


def test_hub_model_ids_are_checked_with_the_hub(fake_hub):
    check_hub_repo("org/exists", "model.path")
    with pytest.raises(StartupError, match=r"model.path='org/typo': no such model on the Hugging Face hub"):
        check_hub_repo("org/typo", "model.path")
    with pytest.raises(StartupError, match=r"gated model: accept its terms"):
        check_hub_repo("org/gated", "model.path")
    check_hub_dataset("hf:org/exists:train", "data.train")
    with pytest.raises(StartupError, match=r"data.train='hf:typo/set:train': no such dataset on the Hugging Face hub"):
        check_hub_dataset("hf:typo/set:train", "data.train")
    check_hub_dataset("arithmetic", "data.train")  # not a hub source: nothing asked


def test_an_unreachable_or_offline_hub_is_one_line_with_the_download_command(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", closed_port_url())
    t0 = time.monotonic()
    with pytest.raises(
        StartupError,
        match=r"is no local path, and the Hugging Face hub is unreachable .*`hf download Qwen/Qwen2.5-0.5B --local-dir DIR`",
    ):
        check_hub_repo("Qwen/Qwen2.5-0.5B", "model.path")
    assert time.monotonic() - t0 < 10
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(StartupError, match=r"HF_HUB_OFFLINE is set and this model is not in the local"):
        check_hub_repo("Qwen/Qwen2.5-0.5B", "model.path")


def test_a_model_in_the_local_hub_cache_needs_no_network(monkeypatch, tmp_path):
    cache = tmp_path / "hub-cache"
    snapshot = cache / "models--org--cached" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (cache / "models--org--cached" / "refs").mkdir()
    (cache / "models--org--cached" / "refs" / "main").write_text("a" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_ENDPOINT", closed_port_url())
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    check_hub_repo("org/cached", "model.path")


def test_sglang_servers_must_answer_health():
    def health(status: int):
        return lambda path: (status if path == "/health" else 404, {}, b"")

    quick = dict(startup_timeout_s=0.5)
    with http_server(health(200)) as up, http_server(health(503)) as loading, http_server(health(404)) as other:
        check_backend("sglang", SGLangConfig(urls=[up]))
        with pytest.raises(
            StartupError, match=r"rollout.sglang.urls\[1\]=.*HTTP 503, still loading.*startup_timeout_s"
        ):
            check_backend("sglang", SGLangConfig(urls=[up, loading], **quick))
        with pytest.raises(StartupError, match=r"rollout.sglang.weight_urls\[0\]=.*no SGLang server answers"):
            check_backend("sglang", SGLangConfig(urls=[up], weight_urls=[closed_port_url()], **quick))
        t0 = time.monotonic()
        with pytest.raises(StartupError, match=r"is no SGLang server \(it answered /health with HTTP 404\)"):
            check_backend("sglang", SGLangConfig(urls=[other]))  # the default wait: not for this one
        assert time.monotonic() - t0 < 5
    with pytest.raises(StartupError, match=r"needs rollout.sglang.urls"):
        check_backend("sglang", SGLangConfig())
    check_backend("hf", SGLangConfig(urls=[closed_port_url()]))  # not used: not asked


def test_a_server_still_loading_is_waited_for_with_progress_lines(monkeypatch, capfd):
    """Refused for 2 s (nothing listens while the model loads), then 503 for 2 s (warming up),
    then ready: the check waits, says what it waits for, and passes. One that never comes up ends
    within the (lowered) timeout naming its URL."""
    import socket

    import stare_tir.app.preflight as preflight

    monkeypatch.setattr(preflight, "STARTUP_POLL_S", 0.2)
    monkeypatch.setattr(preflight, "STARTUP_LOG_EVERY_S", 1.0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    opened_at: list[float] = []

    def answer(path: str):
        ready = time.monotonic() - opened_at[0] > 2.0
        return (200 if ready else 503) if path == "/model_info" else 404, {}, b"{}"

    def serve_later(stop: threading.Event) -> None:
        time.sleep(2.0)
        server = ThreadingHTTPServer(("127.0.0.1", port), _handler(answer))
        opened_at.append(time.monotonic())
        threading.Thread(target=server.serve_forever, daemon=True).start()
        stop.wait()
        server.shutdown()
        server.server_close()

    stop = threading.Event()
    threading.Thread(target=serve_later, args=(stop,), daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    try:
        check_backend("sglang", SGLangConfig(urls=[url], startup_timeout_s=30))
    finally:
        stop.set()
    assert 4.0 <= time.monotonic() - t0 < 15
    log = capfd.readouterr().err
    assert f"waiting for the SGLang server rollout.sglang.urls[0]={url} (no answer:" in log, log
    assert "HTTP 503, still loading" in log and "is ready after" in log, log
    dead = closed_port_url()
    t0 = time.monotonic()
    with pytest.raises(StartupError) as err:
        check_backend("sglang", SGLangConfig(urls=[dead], startup_timeout_s=2))
    assert 2.0 <= time.monotonic() - t0 < 6
    assert f"rollout.sglang.urls[0]='{dead}': no SGLang server answers there" in str(err.value)
    assert "after waiting 2 s (rollout.sglang.startup_timeout_s=2)" in str(err.value) and "\n" not in str(err.value)


def _handler(answer):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            status, headers, body = answer(self.path)
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    return Handler


def test_sync_dir_must_be_named_and_writable(tmp_path):
    with pytest.raises(StartupError, match=r"weight_sync=disk needs rollout.sglang.sync_dir"):
        check_sync_dir(SGLangConfig(weight_sync="disk"))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(StartupError, match=r"sync_dir=.*cannot be written"):
        check_sync_dir(SGLangConfig(weight_sync="disk", sync_dir=str(blocker / "sync")))
    check_sync_dir(SGLangConfig(weight_sync="disk", sync_dir=str(tmp_path / "sync")))
    assert list((tmp_path / "sync").iterdir()) == []  # the probe is gone


def test_requested_trackers_that_are_missing_fail_with_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(
        StartupError, match=r"trainer.tensorboard=true needs the tensorboard package.*stare-tir\[tracking\]"
    ):
        check_trackers(True, None)
    with pytest.raises(StartupError, match=r"trainer.wandb_project='proj' needs the wandb package"):
        check_trackers(False, "proj")
    check_trackers(False, None)


def run_cli(script: str, *args: str, cwd: Path, env: dict | None = None) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )
    return proc, time.monotonic() - t0


def assert_one_line(proc: subprocess.CompletedProcess, message: str) -> None:
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and message in errors[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("script", ["train_tir.py", "eval_aime.py"])
def test_a_dead_sglang_url_ends_the_command_in_seconds_with_one_line(tmp_path, script):
    """No server ever comes up: the start-up wait (lowered here from 900 s) ends with the URL."""
    dead = closed_port_url()
    wait = "rollout.sglang.startup_timeout_s=3"
    args = (
        [f"trainer.run_dir={tmp_path / 'run'}", "trainer.backend=sglang", f"rollout.sglang.urls=[{dead}]", wait]
        if script == "train_tir.py"
        else ["model.path=tiny", "backend=sglang", f"rollout.sglang.urls=[{dead}]", f"out_dir={tmp_path / 'ev'}", wait]
    )
    proc, seconds = run_cli(script, *args, cwd=tmp_path)
    assert_one_line(proc, f"rollout.sglang.urls[0]='{dead}': no SGLang server answers there")
    assert "after waiting 3 s (rollout.sglang.startup_timeout_s=3)" in proc.stderr
    assert "waiting for the SGLang server rollout.sglang.urls[0]" in proc.stderr  # progress, before the end
    assert seconds < 60, seconds  # start-up only: no model was loaded
    assert not (tmp_path / "run" / "config.yaml").exists() and not (tmp_path / "ev").exists()


def test_the_readme_launch_lines_work_as_printed(tmp_path):
    """`launch_server ... &` then the trainer at once: the server (the stand-in, its port opened
    only after a few seconds, as a real one opens it once its model is loaded) is waited for and
    the start-up checks go on. They stop at the next piece, a missing data file here, so that the
    test ends before any model loads: that is then the only problem reported."""
    import socket

    from stare_tir.model import ensure_tiny_checkpoint

    standin = ROOT / "tests" / "rollout" / "sglang_standin.py"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, str(standin), "--model-path", str(ensure_tiny_checkpoint()), "--port", str(port)]
        + ["--threads", "1", "--start-delay-s", "4"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        proc, _ = run_cli(
            "train_tir.py",
            f"trainer.run_dir={tmp_path / 'run'}",
            "trainer.backend=sglang",
            f"rollout.sglang.urls=[http://127.0.0.1:{port}]",
            f"rollout.sglang.sync_dir={tmp_path / 'sync'}",
            f"data.train={tmp_path / 'missing.jsonl'}",
            cwd=tmp_path,
        )
    finally:
        server.kill()
        server.wait(timeout=30)
    assert_one_line(proc, f"data.train='{tmp_path / 'missing.jsonl'}'")
    assert f"SGLang server rollout.sglang.urls[0]=http://127.0.0.1:{port} is ready after" in proc.stderr


@pytest.mark.parametrize("script", ["train_tir.py", "eval_aime.py"])
def test_e2b_without_a_key_ends_the_command_in_seconds_with_one_line(tmp_path, script):
    args = (
        [f"trainer.run_dir={tmp_path / 'run'}", "sandbox.backend=e2b"]
        if script == "train_tir.py"
        else ["model.path=tiny", "sandbox.backend=e2b", f"out_dir={tmp_path / 'ev'}"]
    )
    env = {k: v for k, v in os.environ.items() if k != "E2B_API_KEY"}
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
    )
    assert_one_line(proc, "sandbox.backend=e2b needs an API key: set E2B_API_KEY")
    assert time.monotonic() - t0 < 60
    assert not (tmp_path / "run" / "config.yaml").exists()


def test_a_hub_model_id_that_does_not_exist_is_one_line_before_anything_loads(tmp_path, fake_hub):
    proc, seconds = run_cli("train_tir.py", f"trainer.run_dir={tmp_path / 'run'}", "model.path=org/typo", cwd=tmp_path)
    assert_one_line(proc, "model.path='org/typo': no such model on the Hugging Face hub")
    proc, _ = run_cli(
        "train_tir.py", f"trainer.run_dir={tmp_path / 'run'}", "data.train=hf:org/nodata:train", cwd=tmp_path
    )
    assert_one_line(proc, "data.train='hf:org/nodata:train': no such dataset on the Hugging Face hub")
    assert not (tmp_path / "run" / "config.yaml").exists()


def test_a_gpu_recipe_on_a_machine_without_gpus_says_so_at_start(monkeypatch):
    """configs/retool_qwen2.5_7b_*.yaml (bf16 learner, SGLang rollouts) started where no CUDA
    device is visible: one warning line naming why it is a GPU recipe and what to run instead.
    Where a GPU is visible, and for the CPU configs, nothing."""
    import torch
    from loguru import logger

    from stare_tir.app import pipeline
    from stare_tir.app.preflight import gpu_recipe_without_gpu
    from stare_tir.config import load_config
    from stare_tir.train_config import TrainConfig

    gpu = load_config(TrainConfig, ROOT / "configs" / "retool_qwen2.5_7b_stare.yaml", ["model.path=tiny"])
    cpu = load_config(TrainConfig, ROOT / "configs" / "tiny_cpu.yaml")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    said = gpu_recipe_without_gpu(gpu)
    assert said is not None and "\n" not in said
    assert "(learner.dtype=bf16, trainer.backend=sglang)" in said and "configs/tiny_cpu.yaml" in said
    assert gpu_recipe_without_gpu(cpu) is None
    for name in ("check_model", "check_trackers", "check_backend", "check_sandbox", "check_sft_traces", "check_data"):
        monkeypatch.setattr(pipeline, name, lambda *a: None)  # only the warning is under test
    monkeypatch.setattr(pipeline, "check_sync_dir", lambda *a: None)
    monkeypatch.setattr(pipeline, "check_router", lambda *a: None)
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="WARNING", format="{message}")
    try:
        assert pipeline.preflight_problems(gpu) == []
    finally:
        logger.remove(sink)
    assert [line for line in lines if "made for GPUs" in line] == [said + "\n"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert gpu_recipe_without_gpu(gpu) is None
