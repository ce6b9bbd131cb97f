"""Start and stop the real SGLang server and sglang-router on a CPU-only machine (tests, benches).

Standard library only: the test suite and scripts/bench/bench_sglang.py load this file by path from the
project's venv, and the processes it starts run in .venv-sglang (`make sglang-cpu`). The launch
flags and why each is there: README "Real SGLang on CPU". Every process gets its own session, so
`stop` ends it with every child (SGLang's scheduler and detokenizer).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SGLANG_PYTHON = ROOT / ".venv-sglang" / "bin" / "python"
TINY_BASE = ROOT / "stare_tir" / "assets" / "tiny-base"
SERVER_READY = "The server is fired up"
# `python -m sglang_router.launch_router` without its module-level import of the debug-only Python
# load balancer (sglang_router/mini_lb.py imports all of sglang and torch: ~8 s of CPU per start on
# these machines, about 0.3 s without); the Rust router it starts is the same.
ROUTER_MAIN = (
    "import sys, types; stub = types.ModuleType('sglang_router.mini_lb'); stub.MiniLoadBalancer = None; "
    "sys.modules['sglang_router.mini_lb'] = stub; from sglang_router.launch_router import main; main()"
)


class Unavailable(RuntimeError):
    """The real server or router could not be started (not installed, exited, or too slow)."""


@dataclass
class Process:
    """A started server or router: its URL, process (None: one this session did not start) and log."""

    url: str
    proc: subprocess.Popen | None
    log_path: Path
    start_s: float = 0.0

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(model: Path, port: int, tp_size: int = 1, max_total_tokens: int = 4096) -> list[str]:
    """`sglang.launch_server` with the CPU flags; max_total_tokens sizes the KV pool (and so the
    radix cache: a bench that measures cache hits needs room for every trajectory in flight)."""
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
        str(max_total_tokens),
        "--sleep-on-idle",
        "--log-level",
        "info",
        "--tp",
        str(tp_size),
    ]


def start(
    cmd: list[str],
    url: str,
    log_path: Path,
    ready: str,
    timeout_s: float,
    env: dict | None = None,
    health_path: str = "/health",
    name: str = "",
) -> Process:
    """Run `cmd` (its output appended to `log_path`) until its log shows `ready` and GET
    `health_path` answers 200; raises Unavailable with the log's tail otherwise. name: what
    the messages call it (default: the module after `-m`)."""
    name = name or cmd[2]
    if not Path(cmd[0]).exists():
        raise Unavailable(f"{Path(cmd[0]).relative_to(ROOT)} does not exist: run `make sglang-cpu`")
    t0 = time.monotonic()
    skip = log_path.stat().st_size if log_path.exists() else 0  # a restart appends to the log
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
    started = Process(url, proc, log_path)
    while True:
        if proc.poll() is not None:
            raise Unavailable(f"{name} exited with {proc.returncode} while starting:\n{started.log_tail()}")
        if ready in started.log_text()[skip:] and _healthy(url + health_path):
            break
        if time.monotonic() - t0 > timeout_s:
            stop(started)
            raise Unavailable(f"{name} not ready after {timeout_s:.0f} s:\n{started.log_tail()}")
        time.sleep(0.5)
    started.start_s = time.monotonic() - t0
    return started


def sglang_env(tp_size: int = 1) -> dict:
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    if tp_size > 1:
        # one core per TP rank: the CPU engine otherwise wants one NUMA node per rank
        # (python/sglang/srt/utils/numa_utils.py `init_threads_binding`)
        env["SGLANG_CPU_OMP_THREADS_BIND"] = "|".join(str(i % (os.cpu_count() or 1)) for i in range(tp_size))
    env.pop("PYTHONPATH", None)  # the server runs in its own venv, not this one
    return env


def start_server(
    log_path: Path,
    model: Path = TINY_BASE,
    port: int = 0,
    tp_size: int = 1,
    max_total_tokens: int = 4096,
    timeout_s: float = 480.0,
) -> Process:
    """A real SGLang server on `port` (0: a free one), ready to serve."""
    port = port or free_port()
    cmd = server_command(model, port, tp_size, max_total_tokens)
    return start(cmd, f"http://127.0.0.1:{port}", log_path, SERVER_READY, timeout_s, sglang_env(tp_size))


def start_router(log_path: Path, worker_urls: list[str], flags: list[str], timeout_s: float = 300.0) -> Process:
    """sglang-router (`python -m sglang_router.launch_router`, see ROUTER_MAIN) over `worker_urls`
    with `flags`, once it has registered every worker (they join in the background after "Router ready")."""
    port = free_port()
    cmd = [str(SGLANG_PYTHON), "-c", ROUTER_MAIN, "--host", "127.0.0.1", "--port", str(port)]
    # its Prometheus exporter takes port 29000 unless told otherwise: two routers would collide
    cmd += ["--prometheus-port", str(free_port()), "--worker-urls", *worker_urls, *flags]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "NO_COLOR": "1"}
    env.pop("PYTHONPATH", None)
    url = f"http://127.0.0.1:{port}"
    router = start(cmd, url, log_path, "Router ready", timeout_s, env, "/readiness", "sglang_router.launch_router")
    deadline = time.monotonic() + timeout_s
    while _ready_workers(url) < len(worker_urls):
        if time.monotonic() > deadline or router.proc.poll() is not None:
            stop(router)
            raise Unavailable(f"sglang-router did not register {worker_urls}:\n{router.log_tail()}")
        time.sleep(0.5)
    return router


def router_version() -> str:
    """The installed sglang-router's version (in .venv-sglang)."""
    code = "from importlib.metadata import version; print(version('sglang-router'))"
    return subprocess.run([str(SGLANG_PYTHON), "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def stop(process: Process) -> None:
    """SIGTERM (SGLang stops its children), then SIGKILL the process group if anything is left."""
    proc = process.proc
    if proc is None:
        return
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    try:  # children left behind by a crash: the group is this process's own (new session)
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def _healthy(url: str) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=30) as resp:
            return resp.status == 200
    except OSError:
        return False


def _ready_workers(router_url: str) -> int:
    """Healthy workers a router reports on /readiness (0 while it has none)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(router_url + "/readiness", timeout=30) as resp:
            return int(json.loads(resp.read()).get("healthy_workers", 0))
    except (OSError, ValueError):
        return 0
