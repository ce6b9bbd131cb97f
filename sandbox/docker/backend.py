"""Docker backend: one container per session, from the locally built image, reused once clean.

Guarantees (tests/sandbox/test_sandbox_docker.py runs them against a real engine):
- No network (`--network none`), read-only root, a private tmpfs /tmp of `disk_mb`, no
  capabilities except SETUID/SETGID (used once per session to drop to the container's code uid,
  drawn from the host-wide pool) and KILL (the worker stops and kills the code's processes
  between cells), no-new-privileges, Docker's default seccomp profile plus the local backend's
  filter for the code (AIO, socketpair families, modify_ldt...), a CPU quota.
- Memory: the container's cgroup, `memory_mb` + 128 MB for the preloaded worker whose pages the
  session shares copy-on-write. Processes: `--pids-limit` of `max_processes` + 8.
- The same worker as the local backend runs inside as the container's init and forks one
  interpreter per session; wall time, output caps and statuses come from the same host-side code.
  Between cells it stops the session with SIGSTOP/SIGKILL over every process of the code's uid
  until none can run (sandbox/local/_park.py). The image holds the same files as the local
  backend's root (sandbox/local/_rootfs.py), so a cell finds the same programs and packages.
- Reuse: when a session ends (or its interpreter dies) a reaper running as the code's uid SIGKILLs
  every process of that uid and empties /tmp, /dev/shm, /dev/mqueue and the SysV IPC tables, then
  the container goes back to a warm pool of `docker.warm`. A container whose worker died is
  removed, never reused.
The Engine API is used through the docker SDK; cells and results travel over a Unix socket in a
host directory mounted at /ctl (root-only, so the code cannot reach it).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import asdict

from ..base import SANDBOX_BACKENDS, SandboxBase, SandboxError
from ..config import DockerConfig, SandboxConfig
from ..local._client import Proc, WorkerClient, new_stats
from ..local._session import ProcSession
from ..local._uids import UidPool
from ..slots import Slots

WORKER_OVERHEAD_MB = 128
CONTAINER_MOUNTS = ("/tmp",)  # what the container mounts over the image where files could be


def _under(path: str, mount: str) -> bool:
    return os.path.realpath(path).startswith(mount + "/") or os.path.abspath(path).startswith(
        mount + "/"
    )  # the preloaded worker (numpy, sympy) lives in the same memory cgroup


class _Container:
    def __init__(self, obj, ctl_dir: str, client: WorkerClient, uid_lock: int):
        self.obj, self.ctl_dir, self.client, self.uid_lock = obj, ctl_dir, client, uid_lock
        self.spare: Proc | None = None  # a fresh interpreter, started while the container was idle


class _Lease:
    """The container one session holds from its first cell until it closes."""

    def __init__(self, sandbox: DockerSandbox):
        self.sandbox, self.container, self.last = sandbox, None, None

    async def spawn(self) -> Proc:
        c = self.container
        if c is None or c.client.dead:
            if c is not None:
                await self.sandbox._remove(c)
            c = self.container = await self.sandbox._lease()
        proc, c.spare = c.spare, None
        if proc is None or not proc.alive:
            proc = await c.client.spawn(self.sandbox.cfg.spawn_timeout_s)
        self.last = proc
        return proc

    async def release(self) -> None:
        c, self.container = self.container, None
        if c is not None:
            await self.sandbox._release(c, self.last)


@SANDBOX_BACKENDS.register("docker", config=DockerConfig)
class DockerSandbox(SandboxBase):
    """The local backend's worker as the init of one container per session (sandbox/local/)."""

    def __init__(self, cfg: SandboxConfig | None = None):
        super().__init__()
        self.cfg = cfg or SandboxConfig(backend="docker")
        self.limits = self.cfg.limits
        self.slots = Slots(self.cfg.workers, self.cfg.queue_size, self.cfg.queue_timeout_s)
        self.api = None
        self.dir: str | None = None
        self.idle: list[_Container] = []  # clean, each with a spare interpreter
        self.pending = 0  # containers being started or cleaned, on their way to the idle list
        self.waiting = 0  # leases waiting for one of those
        self.returned: asyncio.Condition | None = None
        self.live: set[_Container] = set()
        self.tasks: set[asyncio.Task] = set()  # recycling in the background
        self.filling: asyncio.Task | None = None
        self.closed = False
        self.stats = new_stats()  # tampering and leftovers, counted over the sandbox's life
        self.uids: UidPool | None = None  # each container's code runs as its own host uid
        self.label = f"{os.getpid()}-{id(self):x}"  # finds every container of ours at close
        self.hidden: dict = {}  # read-only binds of image files the container's /tmp would hide

    async def _call(self, fn, *args, **kwargs):
        """The docker SDK blocks: run it off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(None, functools.partial(fn, *args, **kwargs))

    async def start(self) -> None:
        import docker  # here, not at import: the registry loads this module to read the names

        from .build import code_hash  # reads the root file system's module (importlib.metadata)

        image = self.cfg.docker.image
        try:
            if self.cfg.docker.base_url:
                self.api = docker.DockerClient(base_url=self.cfg.docker.base_url, timeout=60)
            else:
                self.api = await self._call(docker.from_env, timeout=60)
            await self._call(self.api.ping)
            labels = (await self._call(self.api.images.get, image)).labels or {}
        except docker.errors.ImageNotFound:
            raise SandboxError(
                f"docker image {image} not found: build it with `python -m sandbox.docker.build`"
            ) from None
        except Exception as e:  # noqa: BLE001 - any engine problem is an infrastructure failure
            raise SandboxError(f"docker engine unavailable: {type(e).__name__}: {e}") from None
        if labels.get("stare-sandbox.code") != code_hash():  # its worker must speak our protocol
            raise SandboxError(
                f"docker image {image} holds other sandbox code than this checkout: "
                "rebuild it with `python -m sandbox.docker.build`"
            )
        wanted = {m.split(".")[0] for m in self.cfg.preload} - set(sys.stdlib_module_names)
        missing = sorted(wanted - set(labels.get("stare-sandbox.packages", "").split()))
        if missing:  # the local root holds the preloaded packages: the image must hold the same
            raise SandboxError(
                f"docker image {image} was built without {' '.join(missing)} (sandbox.preload): rebuild it with "
                f"`python -m sandbox.docker.build --packages {' '.join(sorted(set(self.cfg.preload)))}`"
            )
        self.dir = tempfile.mkdtemp(prefix="stare-docker-")
        self.hidden = await asyncio.get_running_loop().run_in_executor(None, self._hidden_binds)
        self.uids = UidPool()
        self.info = {
            "backend": "docker",
            "cgroups": True,
            "cpu_quota": True,
            "rootless": False,
            "seccomp": "Docker's default profile + the sandbox's filter",
            "network": False,
            "uids": "per-container uid from a host-wide pool",
            "stop": "SIGSTOP/SIGKILL loop",
            "not_enforced": [
                "per-session uid inside a container (its sessions run one after another, each cleaned up by the reaper)"
            ],
        }
        self._fill()

    async def _new(self) -> _Container:
        lim = self.limits
        ctl = tempfile.mkdtemp(dir=self.dir)  # 0700, root: the code's uid cannot enter it
        uid, uid_lock = self.uids.take()  # held while the container lives: no other session has this uid
        args = {
            "mode": "docker",
            "listen": "/ctl/worker.sock",
            "limits": asdict(lim),
            "preload": list(self.cfg.preload),
            "seccomp": self.cfg.seccomp,
            "allow_no_seccomp": self.cfg.allow_no_seccomp,
            "uid_base": uid,
        }
        mem = f"{lim.memory_mb + WORKER_OVERHEAD_MB}m"
        obj = None
        try:
            obj = await self._call(
                self.api.containers.create,
                self.cfg.docker.image,
                [json.dumps(args)],
                network_mode="none",
                read_only=True,
                mem_limit=mem,
                memswap_limit=mem,
                pids_limit=lim.max_processes + 8,
                nano_cpus=int(self.cfg.docker.cpus * 1e9),
                tmpfs={"/tmp": f"rw,nosuid,nodev,size={lim.disk_mb}m,uid={uid},gid={uid},mode=0700"},
                shm_size=f"{lim.disk_mb}m",
                volumes={ctl: {"bind": "/ctl", "mode": "rw"}, **self.hidden},
                cap_drop=["ALL"],
                cap_add=["SETUID", "SETGID", "KILL"],
                security_opt=["no-new-privileges"],
                environment=self.cfg.code_env(dict(os.environ)),
                hostname="sandbox",
                user="0:0",
                labels={"stare-sandbox": self.label},
            )
            await self._call(obj.start)
        except Exception as e:  # noqa: BLE001
            if obj is not None:
                await self._call(obj.remove, force=True)
            shutil.rmtree(ctl, ignore_errors=True)
            os.close(uid_lock)
            raise SandboxError(f"cannot start a sandbox container: {type(e).__name__}: {e}") from None
        path, deadline = os.path.join(ctl, "worker.sock"), time.monotonic() + self.cfg.spawn_timeout_s
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            while True:
                try:
                    sock.connect(path)
                    break
                except (FileNotFoundError, ConnectionRefusedError):
                    if time.monotonic() > deadline:
                        raise SandboxError(f"container {obj.short_id}: worker socket never appeared") from None
                    await asyncio.sleep(0.02)
            client = WorkerClient(sock, f"container {obj.short_id}", self.stats)
            c = _Container(obj, ctl, client, uid_lock)
            uid_lock = -1  # the container holds it now
            self.live.add(c)
            await client.ready(max(0.1, deadline - time.monotonic()))
            c.spare = await client.spawn(self.cfg.spawn_timeout_s)
        except BaseException:
            sock.close()
            await self._call(obj.remove, force=True)
            shutil.rmtree(ctl, ignore_errors=True)
            if uid_lock >= 0:
                os.close(uid_lock)
            raise
        return c

    def _hidden_binds(self) -> dict:
        """The image keeps the interpreter at its host path; where that path lies under a mount
        the container makes itself (its tmpfs /tmp: a checkout or virtualenv under /tmp), the
        image's copy is hidden. The same files are then bound read-only from the local backend's
        root file system tree (the very set the image holds, sandbox/local/_rootfs.py), so the
        interpreter and its packages are where the image expects them, wherever the project lives."""
        from ..local import _rootfs

        covered = [p for p in CONTAINER_MOUNTS if _under(sys.executable, p) or _under(sys.prefix, p)]
        if not covered:
            return {}
        try:
            tree = _rootfs.cached_tree(list(self.cfg.preload), self.cfg.rootfs_cache, _rootfs.default_cache_dir())
        except OSError as e:
            raise SandboxError(
                f"the interpreter lives under {covered[0]}, which the container covers, and its files cannot be "
                f"prepared to bind there ({e}): set sandbox.rootfs_cache to a writable directory, or install "
                "the project outside /tmp"
            ) from None
        binds = {}
        for mount in covered:
            for name in os.listdir(tree + mount):
                binds[f"{tree}{mount}/{name}"] = {"bind": f"{mount}/{name}", "mode": "ro"}
        return binds

    def _fill(self) -> None:
        if not self.closed and (self.filling is None or self.filling.done()):
            self.filling = asyncio.ensure_future(self._fill_loop())

    async def _fill_loop(self) -> None:
        while not self.closed and len(self.idle) + self.pending < self.cfg.docker.warm:
            self.pending += 1
            try:
                self.idle.append(await self._new())
            except SandboxError:
                return  # the next lease reports it
            finally:
                self.pending -= 1
                await self._notify()

    async def _notify(self) -> None:
        self.returned = self.returned or asyncio.Condition()
        async with self.returned:
            self.returned.notify_all()

    async def _lease(self) -> _Container:
        """An idle container; else one being cleaned or started (if no one else waits for it);
        else a new one."""
        self.returned = self.returned or asyncio.Condition()
        while True:
            if self.closed:
                raise SandboxError("sandbox is closed")
            if self.idle:
                c = self.idle.pop()
                if not c.client.dead:
                    return c
                await self._remove(c)
                self._fill()
            elif self.waiting < self.pending:
                self.waiting += 1
                try:
                    async with self.returned:
                        await asyncio.wait_for(
                            self.returned.wait_for(lambda: self.idle or not self.pending), self.cfg.spawn_timeout_s
                        )
                finally:
                    self.waiting -= 1
            else:
                return await self._new()

    async def _release(self, c: _Container, last: Proc | None) -> None:
        if self.closed or c.client.dead or len(self.idle) + self.pending >= self.cfg.docker.warm:
            return await self._remove(c)
        self.pending += 1
        task = asyncio.ensure_future(self._recycle(c, last))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _recycle(self, c: _Container, last: Proc | None) -> None:
        """Back to the idle list once the worker has killed and wiped the last session, with a
        fresh interpreter waiting; the session that released it does not wait for any of this."""
        try:
            if last is not None:
                await last.kill()  # returns after the worker's reaper has run
            if c.spare is None or not c.spare.alive:
                c.spare = await c.client.spawn(self.cfg.spawn_timeout_s)
            self.idle.append(c)
        except SandboxError:
            await self._remove(c)
        finally:
            self.pending -= 1
            await self._notify()

    async def _remove(self, c: _Container) -> None:
        self.live.discard(c)
        c.client.close()
        try:
            await self._call(c.obj.remove, force=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
        shutil.rmtree(c.ctl_dir, ignore_errors=True)
        if c.uid_lock >= 0:  # its processes are gone with it: the uid is free again
            os.close(c.uid_lock)
            c.uid_lock = -1

    def session(self, stateless: bool = False) -> ProcSession:
        lease = _Lease(self)
        return ProcSession(lease.spawn, self.slots, self.limits, stateless, on_close=lease.release)

    async def close(self) -> None:
        self.closed = True
        for c in list(self.live):  # ends every wait on these workers at once; they exit on EOF
            c.client.close()
        pending = [t for t in [self.filling, *self.tasks] if t is not None]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        self.idle.clear()
        await asyncio.gather(*(self._remove(c) for c in list(self.live)), return_exceptions=True)
        if self.api is not None:  # also those a cancelled start left behind
            try:
                left = await self._call(
                    self.api.containers.list, all=True, filters={"label": f"stare-sandbox={self.label}"}
                )
                await asyncio.gather(*(self._call(c.remove, force=True) for c in left), return_exceptions=True)
            except Exception:  # noqa: BLE001 - the engine went away: nothing left to clean
                pass
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
        if self.uids is not None:
            self.uids.close()
            self.uids = None
