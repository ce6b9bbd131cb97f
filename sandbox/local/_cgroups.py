"""Per-session cgroups for the local backend (root): limits and the freezer. Stdlib only.

Each session gets a group below one owned by the worker in every hierarchy used: memory + pids
(+ cpu) for its limits (cgroup v1 or v2), and a freezer, which stops every task of the session at
once between cells (v1 `freezer.state`; v2 `cgroup.freeze`, also on hybrid hosts whose v1 side
has no freezer). A frozen group lists its live threads (v1 `tasks`, v2 `cgroup.threads`),
threads of a zombie leader included, so leftovers are counted by thread, never by process state.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import time
from typing import Iterator

try:
    from ._procfs import cgroup_mounts, cgroup_paths, freezer_state, int_list, keyed_counter, read_at
except ImportError:  # in the worker, which imports its siblings by name
    from _procfs import cgroup_mounts, cgroup_paths, freezer_state, int_list, keyed_counter, read_at

CPU_PERIOD_US = 100_000
TWIN = "t"  # suffix of a session's twin freezer group (cgroup v1): s<sid>t


def _mounts_and_own() -> tuple[dict[str, str], dict[str, str]]:
    """{controller: mount point} ("" = cgroup2) and {controller: our own group path}."""
    with open("/proc/self/mountinfo", "rb") as f:
        mounts = cgroup_mounts(f.read())
    with open("/proc/self/cgroup", "rb") as f:
        return mounts, cgroup_paths(f.read())


class Cgroups:
    """The worker's parent groups; `make` adds one group per session in each."""

    def __init__(self, name: str, dirs: list[str], v2: bool, cpu: bool, freezer: int | None, freezer_v2: bool):
        self.name, self.v2, self.cpu = name, v2, cpu  # v2: the limits are cgroup v2's
        self.freezer, self.freezer_v2 = freezer, freezer_v2  # index into dirs, or None
        self.grandparents, self.parents = [], []
        # v1 freezer: a session whose cell left processes gets a twin freezer group (sid -> its fd),
        # empty between parks. A park that finds leftovers moves the session's interpreter into it
        # (one migration) and thaws the old group, where the killed leftovers then die: no
        # migration per leftover (each can wait for an RCU grace period, and blocks every fork).
        self.twins: dict[int, int] = {}
        self.twin_dirs: set[int] = set()  # sessions that have a twin group (to remove with them)
        for i, d in enumerate(dirs):
            try:
                self._add(d)
            except OSError:
                if i != freezer or i == 0:
                    raise
                self.freezer = None  # a freezer-only hierarchy we may not use: stop by signals instead

    def _add(self, d: str) -> None:
        _remove_stale(d)  # groups left by workers that were killed: empty, so rmdir is safe
        gfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            try:
                os.mkdir(self.name, dir_fd=gfd)
            except FileExistsError:
                pass
            self.parents.append(os.open(self.name, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=gfd))
        except OSError:
            os.close(gfd)
            raise
        self.grandparents.append(gfd)

    @classmethod
    def create(cls, name: str) -> Cgroups:
        """Make `name` below our own cgroup(s); OSError saying why when cgroups cannot be used here."""
        mounts, own = _mounts_and_own()
        try:
            if "memory" in mounts and "pids" in mounts:  # cgroup v1 limits
                ctrls = ["memory", "pids"] + (["cpu"] if "cpu" in mounts and "cpu" in own else [])
                dirs = [mounts[c] + own[c] for c in ctrls]
                freezer, freezer_v2 = None, False
                if "freezer" in mounts and "freezer" in own:
                    freezer = len(dirs)
                    dirs.append(mounts["freezer"] + own["freezer"])
                elif "" in mounts and "" in own and os.access(mounts[""] + own[""], os.W_OK):
                    freezer, freezer_v2 = len(dirs), True  # hybrid host: freeze in the v2 tree
                    dirs.append(mounts[""] + own[""])
                return cls(name, dirs, v2=False, cpu="cpu" in ctrls, freezer=freezer, freezer_v2=freezer_v2)
            if "" in mounts:  # cgroup v2: needs memory+pids delegated to our own group
                base = mounts[""] + own[""]
                with open(os.path.join(base, "cgroup.controllers")) as f:
                    have = set(f.read().split())
                if not {"memory", "pids"} <= have:
                    raise OSError(
                        errno.EPERM,
                        f"cgroup v2 at {base} does not delegate memory and pids "
                        f"(it has: {' '.join(sorted(have)) or 'none'})",
                    )
                enable = "+memory +pids" + (" +cpu" if "cpu" in have else "")
                with open(os.path.join(base, "cgroup.subtree_control"), "w") as f:
                    f.write(enable)
                group = cls(name, [base], v2=True, cpu="cpu" in have, freezer=0, freezer_v2=True)
                with open(os.path.join(base, name, "cgroup.subtree_control"), "w") as f:
                    f.write(enable)
                return group
        except KeyError as e:
            raise OSError(errno.ENOENT, f"this process is in no {e} cgroup") from None
        raise OSError(errno.ENOENT, "no cgroup v1 memory+pids hierarchies and no cgroup v2 mounted")

    @property
    def freezer_kind(self) -> str:
        if self.freezer is None:
            return ""
        return "cgroup v2 cgroup.freeze" if self.freezer_v2 else "cgroup v1 freezer"

    def make(self, sid: int, memory_mb: int, max_processes: int, cpus: float) -> list[int]:
        """Create the session's groups with their limits; returns directory fds to join."""
        fds = []
        quota = max(1000, int(cpus * CPU_PERIOD_US))
        limits = (
            {"memory.max": memory_mb << 20, "memory.swap.max": 0, "pids.max": max_processes}
            if self.v2
            else {
                "memory.limit_in_bytes": memory_mb << 20,
                "memory.memsw.limit_in_bytes": memory_mb << 20,
                "pids.max": max_processes,
            }
        )
        if self.cpu:  # each file exists in one of the groups only (v1); the others skip it below
            limits.update(
                {"cpu.max": f"{quota} {CPU_PERIOD_US}"}
                if self.v2
                else {"cpu.cfs_period_us": CPU_PERIOD_US, "cpu.cfs_quota_us": quota}
            )
        try:
            for i, pfd in enumerate(self.parents):
                os.mkdir(f"s{sid}", dir_fd=pfd)
                fd = os.open(f"s{sid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=pfd)
                fds.append(fd)
                if i == self.freezer and i > 0 and not self.v2:
                    continue  # a freezer-only hierarchy: no limit files
                for key, value in limits.items():
                    try:
                        _write_at(fd, key, str(value))
                    except FileNotFoundError:  # memsw/swap files exist only with swap accounting
                        pass
        except OSError:
            for fd in fds:
                os.close(fd)
            self.remove(sid)
            raise
        return fds

    def guard(self) -> tuple[int, socket.socket]:
        """Fork the guard: a small process that outlives the worker. When the worker is gone (any
        cause: its end of the socket closes) it kills every process of every session group of
        this worker, frozen or running, and only then gives their uids back: the worker sends it
        each uid lock it takes (SCM_RIGHTS) and tells it when one is free, so the guard holds a
        copy of every lock of a session that may still have a process. Returns (pid, socket)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = os.fork()
        if pid == 0:
            try:
                os.setsid()  # outside the worker's process group: a kill of that group spares it
                ours.close()
                keep = sorted({theirs.fileno(), *self.parents})
                low = 0
                for fd in keep:
                    os.closerange(low, fd)
                    low = fd + 1
                os.closerange(low, 1 << 20)
                _guard_loop(theirs, list(self.parents))
            finally:
                os._exit(0)
        theirs.close()
        return pid, ours

    def _freezer_fd(self, fds: list[int]) -> int | None:
        return fds[self.freezer] if self.freezer is not None and len(fds) > self.freezer else None

    def freeze(self, fds: list[int], deadline: float) -> Iterator[float]:
        """Stop every task of the session, threads and tasks forked meanwhile included. A step of
        the worker's park (_park.py): yields how long to wait before looking again, returns once
        the kernel says the group is frozen, raises TimeoutError past `deadline`."""
        fd = self._freezer_fd(fds)
        if self.freezer_v2:
            _write_at(fd, "cgroup.freeze", "1")
        else:
            _write_at(fd, "freezer.state", "FROZEN")
        pause = 0.00005
        while not self._frozen(fd):
            if time.monotonic() > deadline:
                raise TimeoutError("the session's cgroup did not freeze in time")
            # the session's tasks must run to reach the freezer (2 cores, many jobs): wait, and
            # let the worker serve other sessions meanwhile
            yield pause
            pause = min(pause * 2, 0.002)

    def _frozen(self, fd: int) -> bool:
        if self.freezer_v2:
            return keyed_counter(read_at(fd, "cgroup.events") or b"", b"frozen") == 1
        return freezer_state(read_at(fd, "freezer.state") or b"") == b"FROZEN"

    def thaw(self, fds: list[int]) -> None:
        fd = self._freezer_fd(fds)
        if fd is not None:
            _write_at(fd, "cgroup.freeze" if self.freezer_v2 else "freezer.state", "0" if self.freezer_v2 else "THAWED")

    def threads(self, fds: list[int]) -> list[int] | None:
        """Live threads (host tids) in the session's freezer group; None without a freezer."""
        fd = self._freezer_fd(fds)
        if fd is None:
            return None
        data = read_at(fd, "cgroup.threads" if self.freezer_v2 else "tasks", 1 << 22)
        return None if data is None else int_list(data)

    def release(self, fds: list[int], pid: int) -> None:
        """Let a killed process of a frozen session die now: v1 holds a frozen task's SIGKILL
        until it thaws, so the process moves to the worker's (thawed) freezer group; v2 delivers
        fatal signals to frozen tasks by itself."""
        if self.freezer is not None and not self.freezer_v2:
            try:
                _write_at(self.parents[self.freezer], "cgroup.procs", str(pid))
            except ProcessLookupError:
                pass

    def hand_over(self, fds: list[int], sid: int, pid: int) -> bool:
        """Let the killed processes of a frozen session die, in one cgroup migration whatever their
        number (v1): the session's interpreter `pid` moves, still frozen, into the session's twin
        group (frozen, empty: a task moving into a frozen group stays frozen), the group it left
        thaws, and the twin becomes the session's freezer group (`fds` is updated in place). Only
        once every other process of the group has its SIGKILL: they die as they thaw, none runs
        user code again. False when it cannot be done (cgroup v2, the interpreter gone...): the
        caller then releases each process (`release`)."""
        fd = self._freezer_fd(fds)
        if fd is None or self.freezer_v2 or sid < 0:
            return False
        try:
            if sid not in self.twins:  # made at the first park that needs it: most sessions never do
                pfd = self.parents[self.freezer]
                os.mkdir(f"s{sid}{TWIN}", dir_fd=pfd)
                self.twin_dirs.add(sid)
                self.twins[sid] = os.open(f"s{sid}{TWIN}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=pfd)
            twin = self.twins[sid]
            _write_at(twin, "freezer.state", "FROZEN")  # empty (new, or emptied by the last hand-over): frozen at once
            _write_at(twin, "cgroup.procs", str(pid))
        except OSError:
            return False
        fds[self.freezer], self.twins[sid] = twin, fd
        _write_at(fd, "freezer.state", "THAWED")
        return True

    def procs(self, fds: list[int]) -> list[int]:
        """Host pids of the session's processes (a zombie leader with live threads included)."""
        for fd in fds:
            data = read_at(fd, "cgroup.procs", 1 << 22)
            if data is not None:
                return int_list(data)
        return []

    def oom_kills(self, fds: list[int]) -> int:
        key = "memory.events" if self.v2 else "memory.oom_control"
        for fd in fds:
            try:
                return oom_count(fd, key)
            except FileNotFoundError:
                continue
        return 0

    def remove(self, sid: int) -> bool:
        ok = True
        twin = self.twins.pop(sid, None)
        if twin is not None:
            os.close(twin)
            self.twin_dirs.add(sid)
        for i, pfd in enumerate(self.parents):
            for name in (f"s{sid}", f"s{sid}{TWIN}") if i == self.freezer and sid in self.twin_dirs else (f"s{sid}",):
                try:
                    os.rmdir(name, dir_fd=pfd)
                except FileNotFoundError:
                    pass
                except OSError:  # EBUSY while the kernel finishes tearing the session down
                    ok = False
        if ok:
            self.twin_dirs.discard(sid)
        return ok

    def close(self) -> None:
        for pfd, gfd in zip(self.parents, self.grandparents):
            try:
                os.rmdir(self.name, dir_fd=gfd)
            except OSError:
                pass
            os.close(pfd)
            os.close(gfd)


def _guard_loop(sock: socket.socket, parents: list[int]) -> None:
    held: dict[int, int] = {}  # uid -> a copy of its lock fd
    # The worker's words (`take:UID ` with its lock fd, `free:UID `) come as one stream of bytes: a
    # read may end inside a word, so the unfinished tail waits for the next read, and each lock fd
    # waits for its `take:` word to be whole (the kernel hands it over with the word's first byte).
    # Dropping a cut word once kept a freed uid's lock here for good: the pool leaked under load.
    tail, locks = b"", []
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(sock, 4096, 1)
        except OSError:
            msg, fds = b"", []
        locks += fds
        if not msg:
            break  # the worker is gone
        *words, tail = (tail + msg).split(b" ")
        for word in words:
            kind, _, uid = word.decode(errors="replace").partition(":")
            if kind == "take" and locks and uid.isdigit():
                held[int(uid)] = locks.pop(0)
            elif kind == "free" and uid.isdigit() and int(uid) in held:
                os.close(held.pop(int(uid)))
    for fd in locks:
        os.close(fd)
    kill_groups(parents)  # before the uids go back: no process of a released uid may live
    for fd in held.values():
        os.close(fd)


def _is_session_group(name: str) -> bool:
    """s<sid>, or its twin freezer group s<sid>t."""
    digits = name[1:-1] if name.endswith(TWIN) else name[1:]
    return name.startswith("s") and digits.isdigit() and digits.isascii()


def _session_groups(parent: int) -> list[int]:
    out = []
    for sub in os.listdir(parent):
        if _is_session_group(sub):
            try:
                out.append(os.open(sub, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=parent))
            except OSError:
                pass
    return out


def kill_groups(parents: list[int], timeout: float = 5.0) -> None:
    """SIGKILL every process of every session group below `parents` (the groups of one worker, in
    each hierarchy), thaw the frozen ones (cgroup v1 holds a frozen task's SIGKILL until it thaws),
    and wait until the groups are empty, then remove them."""
    deadline = time.monotonic() + timeout
    while True:
        groups = [(p, g) for p in parents for g in _session_groups(p)]
        alive = False
        for _, g in groups:
            try:
                _write_at(g, "cgroup.kill", "1")  # v2 (Linux >= 5.14): every task at once
            except OSError:
                pass
            for pid in int_list(read_at(g, "cgroup.procs", 1 << 22) or b""):
                alive = True
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            for name, value in (("freezer.state", "THAWED"), ("cgroup.freeze", "0")):
                try:
                    _write_at(g, name, value)
                except OSError:
                    pass
            os.close(g)
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.005)
    for p in parents:
        for sub in os.listdir(p):
            if _is_session_group(sub):
                try:
                    os.rmdir(sub, dir_fd=p)
                except OSError:
                    pass


def kill_worker_groups(name: str) -> None:
    """From the host, after its worker `name` (stare-sandbox-<pid>) is gone: kill what is left of
    its sessions in case its guard died too (a no-op when the guard did its work)."""
    try:
        mounts, own = _mounts_and_own()
    except OSError:
        return
    parents = []
    for ctrl, path in own.items():
        if ctrl in mounts:
            try:
                parents.append(os.open(os.path.join(mounts[ctrl] + path, name), os.O_RDONLY | os.O_DIRECTORY))
            except OSError:
                pass
    try:
        if parents:
            kill_groups(parents)
    finally:
        for fd in parents:
            os.close(fd)


def _remove_stale(d: str) -> None:
    """Remove the groups of workers that are gone, killing every process still in them first (a
    worker and its guard both killed leave their sessions running, or frozen holding the SIGKILL
    of their worker's death until they thaw)."""
    for old in os.listdir(d):
        pid = old.rpartition("-")[2]
        if old.startswith("stare-sandbox-") and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            try:
                fd = os.open(os.path.join(d, old), os.O_RDONLY | os.O_DIRECTORY)
            except OSError:
                continue
            try:
                kill_groups([fd], timeout=2.0)
            finally:
                os.close(fd)
            _rmdir_quietly(os.path.join(d, old))


def _rmdir_quietly(path: str) -> bool:
    try:
        os.rmdir(path)
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


def _write_at(dir_fd: int, name: str, value: str) -> None:
    fd = os.open(name, os.O_WRONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def join_cgroups(fds: list[int]) -> None:
    for fd in fds:
        _write_at(fd, "cgroup.procs", "0")  # "0" = the writing process
        os.close(fd)


def oom_count(dir_fd: int, name: str) -> int:
    """OOM kills so far in a memory cgroup (v1 memory.oom_control, v2 memory.events)."""
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    return keyed_counter(data, b"oom_kill") or 0
