"""The real SGLang server (CPU build from `make sglang-cpu`) for the tests in this folder.

One server per test session on the tiny base model: starting it takes ~20 s and ~2 GB, so every
test shares it (the tests are grouped on one xdist worker) and puts its weights back when done.
Without `.venv-sglang` the tests skip locally with the reason, but FAIL under CI (env CI set):
there the real engine is the point, and a broken install must not pass as green.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from stare_tir.rollout.backends._http import request_sync

ROOT = Path(__file__).resolve().parents[2]
SGLANG_PYTHON = ROOT / ".venv-sglang" / "bin" / "python"
TINY_BASE = ROOT / "stare_tir" / "assets" / "tiny-base"
START_TIMEOUT_S = 480.0  # ~20 s on an idle 2-core machine; minutes when other jobs share it


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def _unavailable(reason: str) -> None:
    if in_ci():
        pytest.fail(f"real SGLang unavailable in CI: {reason}", pytrace=False)
    pytest.skip(f"real SGLang unavailable: {reason}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RealServer:
    """A running `sglang.launch_server` process and its log."""

    url: str
    proc: subprocess.Popen | None  # None: a server this session did not start
    log_path: Path
    model_path: Path
    start_s: float

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def count_requests(self, route: str) -> int:
        """How many `route` requests the server logged (uvicorn's access log, one line each)."""
        return sum(1 for line in self.log_text().splitlines() if f'"POST {route} ' in line)


def launch_command(model: Path, port: int, tp_size: int = 1) -> list[str]:
    """The CPU launch flags (see README "Real SGLang on CPU" for why each is there)."""
    return [
        str(SGLANG_PYTHON),
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(model),
        "--device",
        "cpu",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--attention-backend",
        "torch_native",
        "--disable-overlap-schedule",
        "--disable-cuda-graph",
        "--dtype",
        "float32",
        "--max-total-tokens",
        "4096",
        "--sleep-on-idle",
        "--log-level",
        "info",
        "--tp",
        str(tp_size),
    ]


def start_server(log_path: Path, model: Path = TINY_BASE, port: int = 0, tp_size: int = 1) -> RealServer:
    """Launch a server (port 0: a free one) and wait until it serves; its log is appended to."""
    if not SGLANG_PYTHON.exists():
        _unavailable(f"{SGLANG_PYTHON.relative_to(ROOT)} does not exist: run `make sglang-cpu`")
    port = port or _free_port()
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    if tp_size > 1:
        # one core per TP rank: the CPU engine otherwise wants one NUMA node per rank
        # (python/sglang/srt/utils/numa_utils.py `init_threads_binding`)
        env["SGLANG_CPU_OMP_THREADS_BIND"] = "|".join(str(i % (os.cpu_count() or 1)) for i in range(tp_size))
    env.pop("PYTHONPATH", None)  # the server runs in its own venv, not this one
    t0 = time.monotonic()
    skip = log_path.stat().st_size if log_path.exists() else 0  # a restart appends to the log
    log = open(log_path, "ab")
    proc = subprocess.Popen(
        launch_command(model, port, tp_size),
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )
    log.close()
    server = RealServer(f"http://127.0.0.1:{port}", proc, log_path, model, 0.0)
    while True:
        if proc.poll() is not None:
            _unavailable(f"the server exited with {proc.returncode} while starting:\n{server.log_tail()}")
        if "The server is fired up" in server.log_text()[skip:]:
            break
        if time.monotonic() - t0 > START_TIMEOUT_S:
            stop_server(server)
            _unavailable(f"not ready after {START_TIMEOUT_S:.0f} s:\n{server.log_tail()}")
        time.sleep(0.5)
    request_sync("GET", server.url + "/health", timeout_s=30)
    server.start_s = time.monotonic() - t0
    return server


def stop_server(server: RealServer) -> None:
    """SIGTERM (SGLang stops its scheduler and detokenizer children), SIGKILL the group if stuck."""
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    try:  # children left behind by a crash: the group is this server's own (new session)
        os.killpg(server.proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    server.proc.wait(timeout=30)


def restart_server(server: RealServer) -> None:
    """Stop the server and start it again on the same port (same log), as after a crash."""
    stop_server(server)
    fresh = start_server(server.log_path, server.model_path, port=int(server.url.rsplit(":", 1)[1]))
    server.proc, server.start_s = fresh.proc, fresh.start_s


@pytest.fixture(scope="session")
def sglang_tp2_server(tmp_path_factory) -> RealServer:
    """A server with 2 tensor-parallel ranks (gloo between them on CPU), for the TP tests only."""
    server = start_server(tmp_path_factory.mktemp("sglang_tp2") / "server.log", tp_size=2)
    print(f"\nreal SGLang server (--tp 2) ready in {server.start_s:.1f} s at {server.url}")
    yield server
    stop_server(server)


@pytest.fixture(scope="session")
def sglang_server(tmp_path_factory) -> RealServer:
    # A server someone already runs (same launch flags, tiny base, `--log-level info`):
    # SGLANG_REAL_URL=http://127.0.0.1:PORT SGLANG_REAL_LOG=path/to/its/log (saves ~20 s a run).
    if os.environ.get("SGLANG_REAL_URL"):
        yield RealServer(
            os.environ["SGLANG_REAL_URL"].rstrip("/"), None, Path(os.environ["SGLANG_REAL_LOG"]), TINY_BASE, 0.0
        )
        return
    server = start_server(tmp_path_factory.mktemp("sglang") / "server.log")
    print(f"\nreal SGLang server ready in {server.start_s:.1f} s at {server.url}")
    yield server
    stop_server(server)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing test that used the server gets the server's log tail in its report."""
    outcome = yield
    report = outcome.get_result()
    for name in ("sglang_server", "sglang_tp2_server"):
        server = getattr(item, "funcargs", {}).get(name)
        if report.failed and isinstance(server, RealServer):
            report.sections.append((f"real SGLang server log (tail): {name}", server.log_tail(80)))
