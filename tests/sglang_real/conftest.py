"""The real SGLang server (CPU build from `make sglang-cpu`) for the tests in this folder.

One server per test session on the tiny base model: starting it takes ~20 s and ~2 GB, so every
test shares it (the tests are grouped on one xdist worker) and puts its weights back when done.
Without `.venv-sglang` the tests skip locally with the reason, but FAIL under CI (env CI set):
there the real engine is the point, and a broken install must not pass as green.
Starting and stopping: tools/sglang_cpu/launch.py (shared with scripts/bench/bench_sglang.py).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from stare_tir.rollout.backends._http import request_sync

ROOT = Path(__file__).resolve().parents[2]


def _load_launch():
    """tools/sglang_cpu/launch.py (tools are no package: loaded by path, once)."""
    mod = sys.modules.get("sglang_cpu_launch")
    if mod is None:
        spec = importlib.util.spec_from_file_location("sglang_cpu_launch", ROOT / "tools" / "sglang_cpu" / "launch.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["sglang_cpu_launch"] = mod
        spec.loader.exec_module(mod)
    return mod


LAUNCH = _load_launch()
SGLANG_PYTHON = LAUNCH.SGLANG_PYTHON
TINY_BASE = LAUNCH.TINY_BASE
START_TIMEOUT_S = 480.0  # ~20 s on an idle 2-core machine; minutes when other jobs share it


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def _unavailable(reason: str) -> None:
    if in_ci():
        pytest.fail(f"real SGLang unavailable in CI: {reason}", pytrace=False)
    pytest.skip(f"real SGLang unavailable: {reason}")


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


def start_server(
    log_path: Path, model: Path = TINY_BASE, port: int = 0, tp_size: int = 1, max_total_tokens: int = 4096
) -> RealServer:
    """Launch a server (port 0: a free one) and wait until it serves; its log is appended to."""
    try:
        started = LAUNCH.start_server(log_path, model, port, tp_size, max_total_tokens, timeout_s=START_TIMEOUT_S)
    except LAUNCH.Unavailable as exc:
        _unavailable(str(exc))
    request_sync("GET", started.url + "/health", timeout_s=30)
    return RealServer(started.url, started.proc, log_path, model, started.start_s)


def stop_server(server: RealServer) -> None:
    """SIGTERM (SGLang stops its scheduler and detokenizer children), SIGKILL the group if stuck."""
    LAUNCH.stop(server)


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
