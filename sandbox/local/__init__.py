"""Local backend: kernel isolation on this host, with a warm fork server.

Guarantees (each has an adversarial test in tests/sandbox/test_sandbox_local.py):
- Wall time: a cell past its limit is SIGKILLed together with every process it started (the
  session is pid 1 of its own pid namespace, so setsid/double-fork do not escape). status=timeout.
- Memory: all processes of a session share one memory cgroup of `memory_mb` (no swap); the
  kernel OOM-kills inside it. status=oom. Without usable cgroups: RLIMIT_AS per process (weaker).
- Processes: pids cgroup of `max_processes` (threads count); fork bombs stop there.
- Disk: the only writable place is a private tmpfs of `disk_mb` at /tmp (also /dev/shm), gone
  with the session; RLIMIT_FSIZE caps single files. The rest of the tree is read-only.
- Output: stdout/stderr are read while the cell runs; past `max_output_bytes` per stream the cell
  is killed. status=output_limit, with what was read so far.
- Network: a new network namespace without configured interfaces (loopback is down), and (with
  libseccomp) a filter allowing only AF_UNIX sockets.
- Secrets and programs: the code sees a fresh minimal environment, a read-only root holding the
  same files as the Docker image (sandbox/local/_rootfs.py: the interpreter, its stdlib, the preloaded
  packages, a few shell utilities and their libraries; no home directories, project tree, /var,
  /run, host /tmp or host programs), its own /proc (only its own processes) and runs as an
  unprivileged uid with no capabilities and no_new_privs. Optional seccomp denies ptrace, mount,
  user namespaces, bpf, keyctl, io_uring...
- CPU: a cgroup quota of `limits.cpus` per session. Between cells nothing of the session runs:
  it is frozen (cgroup freezer; rootless: stopped by signals), leftover processes are killed,
  leftover threads restart the session, the timers it armed are disarmed (sandbox/local/_park.py).
- Robustness: the host never parses the code's output to decide anything; the status comes from
  what the host observes (the cell's pipes, its clock, the kernel's wait status and cgroup OOM
  counter) and one validated reply per cell carrying its exit code (cell-reported); anything
  else on that channel is tampering, scored as failed code. Nothing read from /proc can take the
  worker down (sandbox/local/_procfs.py). A dead session interpreter is replaced at the next cell (its
  state is lost); a dead worker is restarted, and the next cell says the state is gone.
Not covered: kernel exploits (use Docker or a VM for hostile code at scale); the code can forge
its own cell's exit code and change what later cells of its session report (see sandbox/README.md).
Root gives all of the above. Without root the worker runs rootless in a user namespace of its
own: the same namespaces, root, seccomp and limits, except that memory and processes are bounded
by per-process rlimits (no cgroups) and each session is uid 0 of its own nested user namespace
with no capabilities (instead of a per-session host uid); `info["not_enforced"]` says so, and
root mode without cgroups or seccomp refuses to start unless allowed. See sandbox/README.md.

This package is the local backend: its host side (this module; `_client`, the connection to a
worker; `_session`, the public Session over it) and its worker, the fork server and everything it
runs (`_worker`, `_cells`, `_isolation`, `_cgroups`, `_park`, `_reaper`, `_procfs`, `_proto`,
`_uids`, `_rootfs`: stdlib only, imported by the worker as siblings by bare name). The Docker
backend runs this same worker as the init of each container, so it imports the host side and the
uid pool from here, and `python -m sandbox.docker.build` copies the worker's files into the image.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
from dataclasses import asdict

from ..base import SANDBOX_BACKENDS, SandboxBase, SandboxError
from ..config import SandboxConfig
from ..slots import Slots
from . import _cgroups
from ._client import Proc, WorkerClient, new_stats
from ._session import ProcSession

log = logging.getLogger("sandbox")
WORKER_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_worker.py")


def effective_isolation(hello: dict, cfg: SandboxConfig) -> dict:
    """What this sandbox really enforces (from the worker's report), for logs and run summaries."""
    info = {
        k: hello[k]
        for k in ("cgroups", "seccomp", "cpu_quota", "rootless", "cgroup_error", "stop", "root")
        if k in hello
    }
    info.update(
        backend="local",
        network=cfg.limits.network,
        huge_mb=hello.get("huge_mb", 0),
        uids="own user namespace per session" if hello.get("rootless") else "per-session uid from a host-wide pool",
    )
    weaker = []
    if not hello.get("cgroups"):
        weaker += [
            "memory summed over a session's processes (RLIMIT_AS per process instead; memfd and SysV shm "
            "escape it; a cell over it gets a MemoryError, status error, since no kernel OOM kill is seen)",
            "a pids cgroup (RLIMIT_NPROC in the session's own user namespace instead)",
        ]
    if not hello.get("cpu_quota"):
        weaker.append("a CPU quota per session (a cell's CPU is bounded by its wall time x max_processes)")
    if not hello.get("seccomp"):
        weaker.append("the seccomp filter (kernel surface: io_uring, bpf, perf, keyctl... are reachable)")
    if hello.get("rootless"):
        weaker.append(
            "a per-session host uid (all sessions are the starting user on the host: they share its "
            "inotify instances and may lower their own oom_score_adj)"
        )
    if cfg.limits.network:
        weaker.append(
            "network isolation (network=True: the host's network namespace, loopback and abstract "
            "Unix sockets included; trusted code only)"
        )
    info["not_enforced"] = weaker
    return info


@SANDBOX_BACKENDS.register("local")  # its settings are SandboxConfig's own fields
class LocalSandbox(SandboxBase):
    def __init__(self, cfg: SandboxConfig | None = None):
        super().__init__()
        self.cfg = cfg or SandboxConfig()
        self.limits = self.cfg.limits
        self.slots = Slots(self.cfg.workers, self.cfg.queue_size, self.cfg.queue_timeout_s)
        self.worker: WorkerClient | None = None
        self.popen: subprocess.Popen | None = None
        self.stats = new_stats()  # tampering and leftovers, counted over the sandbox's life
        self.spares: list[Proc] = []  # started, isolated, never used: a session takes one at once
        self.refill: asyncio.Task | None = None
        self.starting: asyncio.Lock | None = None
        self.closed = False

    async def start(self) -> None:
        await self._ensure_worker()

    async def _ensure_worker(self) -> WorkerClient:
        if self.closed:
            raise SandboxError("sandbox is closed")
        if self.worker is not None and not self.worker.dead:
            return self.worker
        self.starting = self.starting or asyncio.Lock()
        async with self.starting:
            if self.worker is None or self.worker.dead:
                self._stop_worker()  # a dead worker is replaced; its sessions restart on next use
                self.worker = await self._start_worker()
        return self.worker

    async def _start_worker(self) -> WorkerClient:
        from . import _rootfs

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        args = {
            "mode": "local",
            "fd": theirs.fileno(),
            "limits": asdict(self.limits),
            "preload": list(self.cfg.preload),
            "seccomp": self.cfg.seccomp,
            "allow_no_seccomp": self.cfg.allow_no_seccomp,
            "allow_no_cgroups": self.cfg.allow_no_cgroups,
            "rootfs_cache": self.cfg.rootfs_cache,
            "rootfs_default": _rootfs.default_cache_dir(),  # ours: the worker's HOME is the code's
        }
        env = self.cfg.code_env(dict(os.environ))
        env.setdefault("USER", "sandbox")
        try:
            self.popen = subprocess.Popen(
                [sys.executable, "-I", WORKER_PY, json.dumps(args)],
                env=env,
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as e:
            raise SandboxError(f"cannot start the sandbox worker: {e}") from None
        finally:
            theirs.close()
        client = WorkerClient(ours, "sandbox worker", self.stats)
        try:
            hello = await client.ready(self.cfg.spawn_timeout_s)
        except BaseException:
            client.close()
            self.popen.kill()
            self._reap_worker()
            raise
        first = not self.info
        self.info = effective_isolation(hello, self.cfg)
        if first:  # once per sandbox, not at every worker restart
            for item in self.info["not_enforced"]:
                log.warning("local sandbox: not enforced: %s (see sandbox/README.md)", item)
        return client

    def _drop_worker(self) -> None:
        """Closing our end of the worker and its spares makes it kill its sessions and exit."""
        if self.worker is not None:
            self.worker.close()
            self.worker = None
        for proc in self.spares:
            proc._close_ctl()
        self.spares.clear()

    def _stop_worker(self) -> None:
        """Runs on the loop: drop the worker and wait for it."""
        self._drop_worker()
        self._reap_worker()

    def _reap_worker(self) -> None:
        if self.popen is not None:
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
            if os.geteuid() == 0:  # its guard kills what its sessions left; this covers a dead guard
                _cgroups.kill_worker_groups(f"stare-sandbox-{self.popen.pid}")
            self.popen = None

    async def _spawn(self) -> Proc:
        worker = await self._ensure_worker()
        while self.spares:
            proc = self.spares.pop()
            if proc.alive and proc.client is worker:
                self._refill()
                return proc
        try:
            proc = await worker.spawn(self.cfg.spawn_timeout_s)
        except SandboxError:
            if not worker.dead:
                raise
            worker = await self._ensure_worker()  # it died under us: one retry on a fresh one
            proc = await worker.spawn(self.cfg.spawn_timeout_s)
        self._refill()
        return proc

    def _refill(self) -> None:
        """Keep `workers` spare interpreters ready, started in the background."""
        if self.refill is None or self.refill.done():
            self.refill = asyncio.ensure_future(self._refill_loop())

    async def _refill_loop(self) -> None:
        try:
            while not self.closed and len(self.spares) < self.cfg.workers:
                worker = await self._ensure_worker()
                self.spares.append(await worker.spawn(self.cfg.spawn_timeout_s))
        except SandboxError:
            pass  # the next real spawn reports it

    def session(self, stateless: bool = False) -> ProcSession:
        return ProcSession(self._spawn, self.slots, self.limits, stateless)

    async def close(self) -> None:
        self.closed = True
        if self.refill is not None:
            self.refill.cancel()
            await asyncio.gather(self.refill, return_exceptions=True)
        self._drop_worker()
        await asyncio.get_running_loop().run_in_executor(None, self._reap_worker)
