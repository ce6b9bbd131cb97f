"""The worker: a fork server that starts one isolated interpreter per session. Stdlib only.

Run by the host as `python -I _worker.py '<json>'` (local) or as a container's entry point (docker).
It imports numpy/sympy once, then forks. Per session (local mode) the child becomes pid 1 of new
pid/net/mount/ipc/uts namespaces inside its own memory+pids cgroup, mounts a private tmpfs at /tmp,
drops to a uid no other live session has (_uids.py) with no capabilities, sets no_new_privs and a
seccomp filter, and runs cells (_cells.py) in a root holding the same files as the Docker image
(_rootfs.py). After each cell the host asks it to "park" the session (_park.py): stop all of it
and kill what the cell left behind, until its next cell ("resume"). Its death (any cause) makes
the kernel kill every process of the session; the worker reaps it and reports the wait status.
Without root (rootless) the worker first enters a user namespace of its own and no cgroups are
used; a session then gets its own nested user namespace and drops every capability instead of
switching uid. In docker mode the container is the boundary and a reaper that kills every process
of the code's uid replaces the pid namespace (_reaper.py).

Nothing a session does may take the worker down (every other session in flight would fail with
it): whatever it reads from /proc is parsed as bytes by code that cannot raise (_procfs.py), and
a request that fails anyway costs only its own session.
"""

from __future__ import annotations

import json
import os
import resource
import selectors
import signal
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # siblings; dropped again in main()
import _cgroups  # noqa: E402
from _cells import serve_cells  # noqa: E402
from _park import (  # noqa: E402
    STOP_TIMEOUT_S,
    Park,
    park_frozen,
    park_signalled,
    session_members_by_ns,
    session_members_by_uid,
    signal_quietly,
)
from _procfs import status_field  # noqa: E402
from _proto import recv, send  # noqa: E402
from _reaper import fork_reaper  # noqa: E402
from _uids import UidPool  # noqa: E402

NOFILE = 1024  # open files per session process
WORKER_OOM_SCORE = 900  # after the cells (1000), before anything else (the trainer: 0)


def _write_oom_score(score: int) -> None:
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write(str(score))


class Worker:
    def __init__(self, cfg: dict):
        self.cfg, self.limits = cfg, cfg["limits"]
        self.local = cfg["mode"] == "local"
        self.pids: dict[int, int] = {}  # pid -> sid
        self.sids: dict[int, int] = {}  # sid -> pid
        self.cg_fds: dict[int, list[int]] = {}
        self.cgroups = self.seccomp = None
        self.rootless = False  # local mode without root: user namespaces, no cgroups
        self.oom_fd: int | None = None  # docker: the container's own memory cgroup
        self.dirty = False  # docker: the code's uid may have processes or files left
        self.reaper: tuple[int, int] | None = None  # docker: (pid, go-pipe) of a waiting reaper
        self.cgroup_error = ""  # why root mode runs without cgroups (allow_no_cgroups)
        self.stopped: dict[int, str] = {}  # sid -> how it is stopped between cells: "freezer" | "signal"
        self.uid_pool: UidPool | None = None  # local, root: a host-wide uid per live session
        self.uid_locks: dict[int, tuple[int, int]] = {}  # sid -> (uid, lock fd)
        self.ns: dict[int, int] = {}  # sid -> its pid namespace (local: to find its processes)
        self.procfd = -1  # a /proc that shows every session's processes (to find leftovers)
        self.tree = ""  # local: the root file system (sandbox/local/_rootfs.py)
        self.guard: tuple[int, socket.socket] | None = None  # root: (pid, socket) of the guard
        self.parking: dict[int, Park] = {}  # sid -> its park under way (_park.py)
        self.park_wake: dict[int, float] = {}  # sid -> when to step its park next

    def setup(self) -> dict:
        import _isolation as iso

        self.iso = iso
        if self.local:  # first, as the plain user: hard links need no namespace games
            import _rootfs

            self.tree = _rootfs.cached_tree(
                list(self.cfg["preload"]), self.cfg["rootfs_cache"], self.cfg["rootfs_default"]
            )
        for mod in self.cfg["preload"]:
            try:
                __import__(mod)
            except ImportError:
                pass
        import gc

        gc.collect()
        gc.freeze()  # children's collections skip the preloaded objects: no walk, no copy-on-write
        self.huge_mb = iso.collapse_heap() >> 20
        with open("/proc/self/status", "rb") as f:  # address space after preloading, for RLIMIT_AS
            self.base_vm_mb = int((status_field(f.read(), b"VmSize") or b"0 kB").split()[0]) >> 10
        self.rootless = self.local and os.geteuid() != 0
        # the sandbox's own processes rank before the trainer for the OOM killer (cells: 1000)
        _write_oom_score(WORKER_OOM_SCORE)
        if self.cfg.get("seccomp"):
            try:
                # Rootless, memory is bounded per process (RLIMIT_AS): SysV shm and memfds, whose
                # pages belong to no process, are denied there (cgroups charge them as root)
                self.seccomp = iso.Seccomp(block_network=not self.limits["network"], deny_shared_memory=self.rootless)
            except OSError as e:
                if not self.cfg.get("allow_no_seccomp"):
                    raise OSError(
                        f"no seccomp filter ({e}): install libseccomp2, or set "
                        "sandbox.allow_no_seccomp=true to run without it"
                    ) from None
                self.seccomp = None
        if self.local:
            if self.rootless:
                # Own a user namespace, then serve from pid 1 of a pid namespace it owns: each
                # session's pid namespace can then be entered and left without host privileges.
                try:
                    iso.enter_user_namespace(os.geteuid(), os.getegid())
                except OSError as e:
                    raise OSError(
                        e.errno,
                        f"{e.strerror}: without root the local sandbox needs unprivileged "
                        "user namespaces (sysctl user.max_user_namespaces > 0, and on Debian/Ubuntu "
                        "kernel.unprivileged_userns_clone=1); or run as root, or use "
                        "sandbox.backend=docker",
                    ) from None
                iso.unshare(iso.CLONE_NEWPID)
                _become_child_of_waiter(iso)
            else:
                try:
                    self.cgroups = _cgroups.Cgroups.create(f"stare-sandbox-{os.getpid()}")
                    self.start_guard()
                except OSError as e:
                    if not self.cfg.get("allow_no_cgroups"):
                        raise OSError(
                            f"cannot create per-session cgroups ({e}); fix the cgroup "
                            "setup, or set sandbox.allow_no_cgroups=true for per-process rlimits "
                            "(weaker: memory not summed over processes, no CPU quota)"
                        ) from None
                    self.cgroup_error = str(e)
                # the host's /proc, kept open: build_root hides it, the fd still reaches it
                self.procfd = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
                self.uid_pool = UidPool()  # opened before build_root hides /run
            self.pidns = os.open("/proc/self/ns/pid", os.O_RDONLY)
            iso.build_root(self.tree, rootless=self.rootless)
            if self.rootless:  # the proc of our own pid namespace, mounted by build_root
                self.procfd = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
        else:
            self.reaper = fork_reaper(self.uid(0))
            self.procfd = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
            for path in ("/sys/fs/cgroup/memory", "/sys/fs/cgroup"):
                try:
                    self.oom_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
                    self.oom_kills()
                    break
                except OSError:
                    self.oom_fd = None
        return {
            "op": "ready",
            "cgroups": self.cgroups is not None,
            "seccomp": self.seccomp is not None,
            "cpu_quota": self.cgroups is not None and self.cgroups.cpu,
            "cgroup_error": self.cgroup_error,
            "rootless": self.local and self.rootless,
            "huge_mb": self.huge_mb,
            "stop": (self.cgroups.freezer_kind if self.cgroups is not None else "") or "SIGSTOP/SIGKILL loop",
            "root": self.tree,
            "pid": os.getpid(),
        }

    def oom_kills(self, sid: int | None = None) -> int:
        if self.cgroups is not None and sid is not None:
            return self.cgroups.oom_kills(self.cg_fds.get(sid, []))
        if self.oom_fd is not None:
            for name in ("memory.oom_control", "memory.events"):
                try:
                    return _cgroups.oom_count(self.oom_fd, name)
                except FileNotFoundError:
                    pass
        return 0

    def serve(self, sock: socket.socket) -> None:
        rfd, wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wfd)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        sel = selectors.DefaultSelector()
        sel.register(sock, selectors.EVENT_READ)
        sel.register(rfd, selectors.EVENT_READ)
        self.sock, self.oom_base = sock, self.oom_kills()
        while True:
            wake = min(self.park_wake.values(), default=None)
            timeout = None if wake is None else max(0.0, wake - time.monotonic())
            for key, _ in sel.select(timeout):
                if key.fileobj is sock:
                    msg, _payload, fds = recv(sock, maxfds=1)
                    if msg is None:
                        return self.shutdown()
                    try:
                        if msg["op"] == "spawn" and len(fds) == 1:
                            self.spawn(msg["sid"], fds[0])
                        elif msg["op"] == "kill":
                            self.kill(msg["sid"])
                        elif msg["op"] == "park":
                            self.park(msg["sid"])
                        elif msg["op"] == "resume":
                            self.resume(msg["sid"])
                    except Exception as e:  # noqa: BLE001 - one failed request costs its session, not the worker
                        print(f"sandbox worker: {msg['op']}: {type(e).__name__}: {e}", file=sys.stderr)
                        self._kill_quietly(msg.get("sid"))
                    for fd in fds:
                        os.close(fd)
                else:
                    while os.read(rfd, 512) == 512:
                        pass
                    self.reap()
            now = time.monotonic()
            for sid in [sid for sid, at in self.park_wake.items() if at <= now]:
                self._step_park(sid)

    def uid(self, sid: int) -> int:
        if self.local and self.rootless:
            return 0  # the only uid of our user namespace; sessions get their own namespace instead
        if self.local:
            return self.uid_locks[sid][0]
        return self.cfg["uid_base"]  # docker: the host drew this container's uid from the pool

    def spawn(self, sid: int, ctl_fd: int) -> None:
        if not self.local and self.dirty:  # docker: every session starts from a clean container
            self.reap_uid()
        cg, pid = [], -1
        try:
            if self.uid_pool is not None:
                self.uid_locks[sid] = self.uid_pool.take()
                self._tell_guard(f"take:{self.uid_locks[sid][0]}", self.uid_locks[sid][1])
            if self.cgroups is not None:
                cg = self.cgroups.make(sid, self.limits["memory_mb"], self.limits["max_processes"], self.limits["cpus"])
            if self.local:
                self.iso.unshare(self.iso.CLONE_NEWPID)  # the next child is pid 1 of a new namespace
            pid = os.fork()
        except Exception as e:  # noqa: BLE001 - no session process: say why on its channel
            self.failed(sid, ctl_fd, cg, f"spawn: {type(e).__name__}: {e}")
            return
        finally:
            if pid != 0 and self.local:  # back in the parent: later children stay out of it
                self.iso.setns(self.pidns, self.iso.CLONE_NEWPID)
        if pid == 0:
            try:
                if ctl_fd != 3:  # a fixed place, so a failure below can still be reported
                    os.dup2(ctl_fd, 3, inheritable=False)
                ctl = self.enter(sid, cg)
            except BaseException as e:  # noqa: BLE001 - report why isolation could not be set up
                try:
                    send(socket.socket(fileno=3), {"op": "failed", "error": f"{type(e).__name__}: {e}"[:2000]})
                finally:
                    os._exit(70)
            try:
                serve_cells(ctl, self.iso.cancel_timers)  # returns only if the code broke our control channel
            finally:
                os._exit(70)
        self.cg_fds[sid] = cg  # kept to read the OOM count after the session ends
        self.dirty = True
        self.pids[pid], self.sids[sid] = sid, pid
        if self.local and self.cgroups is None:  # its processes are found by their pid namespace
            try:
                self.ns[sid] = os.stat(f"{pid}/ns/pid", dir_fd=self.procfd).st_ino
            except OSError:
                self.ns[sid] = -1  # it died at once: nothing to find

    def failed(self, sid: int, ctl_fd: int, cg: list[int], error: str) -> None:
        """No session process exists: say why on its channel, and report it ended."""
        for fd in cg:
            os.close(fd)
        self._free_uid(sid)
        if self.cgroups is not None:
            self.cgroups.remove(sid)
        with socket.socket(fileno=os.dup(ctl_fd)) as ctl:
            try:
                send(ctl, {"op": "failed", "error": error})
            except OSError:
                pass
        send(self.sock, {"op": "exit", "sid": sid, "status": None, "oom": False})

    def enter(self, sid: int, cg: list[int]) -> socket.socket:
        """In the new child: isolate, drop privileges, return the control socket (fd 3)."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()  # own process group: killpg from the code reaches nobody else
        lim, uid = self.limits, self.uid(sid)
        if self.local:
            iso = self.iso
            iso.unshare(
                iso.CLONE_NEWNS | iso.CLONE_NEWIPC | iso.CLONE_NEWUTS | (0 if lim["network"] else iso.CLONE_NEWNET)
            )
            iso.sethostname("sandbox")
            iso.enter_session_mounts(lim["disk_mb"], uid)
            _cgroups.join_cgroups(cg)
            if self.rootless:
                # A user namespace of its own, entered before RLIMIT_NPROC is lowered: the kernel
                # then counts this session's processes apart from every other session's.
                iso.enter_user_namespace(0, 0)
        _write_oom_score(1000)  # under memory pressure the code dies first, then the worker
        if self.local:
            # /proc read-only from here on: the code cannot lower its oom_score_adj (rootless it
            # owns the file; as root the worker's write also set 1000 as its floor). Rootless, the
            # remount needs a mount namespace owned by the session's own user namespace.
            if self.rootless:
                iso.unshare(iso.CLONE_NEWNS)
            iso.mount(None, "/proc", None, iso.MS_REMOUNT | iso.MS_BIND | iso.MS_RDONLY | iso.PROC_FLAGS)
        # The worker's descriptors go before RLIMIT_NOFILE is lowered: a worker serving many sessions
        # holds more than NOFILE of them (a few per session), and with all of 0..NOFILE-1 taken the
        # open below failed with EMFILE: every session started then died ("Too many open files").
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(4, 1 << 20)  # the worker's sockets, cgroup and namespace fds stay out
        disk = lim["disk_mb"] << 20
        resource.setrlimit(resource.RLIMIT_FSIZE, (disk, disk))
        # 1, not 0: the kernel skips a piped core_pattern helper (which runs as host root) only at 1
        resource.setrlimit(resource.RLIMIT_CORE, (1, 1))
        # the host's limit (often 20k+) times max_processes would reach into fs.file-max
        resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))
        # a fixed 8 MB stack: C-level runaway recursion is a prompt SIGSEGV on every host
        resource.setrlimit(resource.RLIMIT_STACK, (8 << 20, resource.getrlimit(resource.RLIMIT_STACK)[1]))
        if self.local and self.cgroups is None:  # per uid (ours is unique); docker: the pids limit
            resource.setrlimit(resource.RLIMIT_NPROC, (lim["max_processes"], lim["max_processes"]))
        if self.local and self.cgroups is None:  # no cgroup: cap each process's address space
            vm = (self.base_vm_mb + lim["memory_mb"]) << 20
            resource.setrlimit(resource.RLIMIT_AS, (vm, vm))
        os.chdir("/tmp")
        if self.local and self.rootless:
            self.iso.drop_capabilities()  # uid 0 of its own user namespace, with nothing left to use
        else:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)  # all capabilities are gone from here on
        self.iso.prctl(self.iso.PR_SET_PDEATHSIG, signal.SIGKILL)  # after setuid, which clears it
        self.iso.prctl(self.iso.PR_SET_NO_NEW_PRIVS, 1)
        if self.seccomp is not None:
            self.seccomp.load()
        return socket.socket(fileno=3)

    def park(self, sid: int) -> None:
        """After a cell: stop the whole session and kill what the cell left behind (_park.py),
        until its next cell. Leftover threads of the session's interpreter cannot be killed one by
        one: the session is killed instead (the host restarts it at the next cell), as it is when
        it cannot be stopped at all. Replies {"op": "parked", "sid", "procs": leftover processes
        killed, "threads": leftover threads, and "failed": why, if it had to be killed}. The park
        runs in steps between the worker's other requests (_park.Park): it never delays them."""
        pid = self.sids.get(sid)
        if pid is None:
            return send(self.sock, {"op": "parked", "sid": sid, "procs": 0, "threads": 0})
        deadline = time.monotonic() + STOP_TIMEOUT_S
        if self.cgroups is not None and self.cgroups.freezer is not None:
            self.stopped[sid] = "freezer"
            steps = park_frozen(self.cgroups, self.cg_fds.get(sid, []), pid, self.procfd, deadline, sid)
        else:
            self.stopped[sid] = "signal"
            steps = park_signalled(lambda: self.members(sid), pid, self.procfd, deadline)
        self.parking[sid] = steps
        self._step_park(sid)

    def _step_park(self, sid: int) -> None:
        steps, pid = self.parking.get(sid), self.sids.get(sid)
        self.park_wake.pop(sid, None)
        if steps is None:
            return
        reply = {"op": "parked", "sid": sid, "procs": 0, "threads": 0}
        try:
            self.park_wake[sid] = time.monotonic() + next(steps)
            return  # not done: stepped again after that wait
        except StopIteration as done:
            procs, own = done.value
            threads = len(own) - (1 if pid in own else 0)  # its main thread gone: the others count
            reply.update(procs=procs, threads=threads)
            del self.parking[sid]
            send(self.sock, reply)
            if threads:
                self.kill(sid)
        except Exception as e:  # noqa: BLE001 - e.g. it did not freeze in time: it ends, nothing else
            reply["failed"] = f"{type(e).__name__}: {e}"[:500]
            self.parking.pop(sid, None)
            send(self.sock, reply)
            self._kill_quietly(sid)

    def _drop_park(self, sid: int, answer: bool) -> None:
        """The session ends while its park is under way: stop stepping it (and, if it died by
        itself, answer the park, so the host does not wait for it)."""
        steps = self.parking.pop(sid, None)
        self.park_wake.pop(sid, None)
        if steps is not None:
            steps.close()
            if answer:
                send(self.sock, {"op": "parked", "sid": sid, "procs": 0, "threads": 0})

    def resume(self, sid: int) -> None:
        """Let the session run its next cell; answered at once, as the host starts the cell's
        clock on the answer: time spent before it (behind other sessions' requests) is not the
        cell's."""
        pid, how = self.sids.get(sid), self.stopped.pop(sid, None)
        if pid is not None:
            if how == "freezer":
                self.cgroups.thaw(self.cg_fds.get(sid, []))
            elif how == "signal":
                signal_quietly(pid, signal.SIGCONT)
        send(self.sock, {"op": "resumed", "sid": sid})

    def members(self, sid: int) -> list[int]:
        """The session's processes (host pids), zombie leaders with live threads included."""
        if self.cgroups is not None:
            return self.cgroups.procs(self.cg_fds.get(sid, []))
        if self.local:
            return session_members_by_ns(self.procfd, self.ns.get(sid, -1))
        return session_members_by_uid(self.procfd, self.uid(sid))

    def _free_uid(self, sid: int) -> None:
        """Only once no process of the session lives (its pid 1 reaped: its namespace is empty)."""
        held = self.uid_locks.pop(sid, None)
        if held is not None:
            os.close(held[1])
            self._tell_guard(f"free:{held[0]}")

    def start_guard(self) -> None:
        """(Re)start the guard (_cgroups.Cgroups.guard) and hand it every uid lock held now."""
        self.guard = self.cgroups.guard()
        for uid, fd in self.uid_locks.values():
            self._tell_guard(f"take:{uid}", fd)

    def _tell_guard(self, msg: str, fd: int = -1) -> None:
        if self.guard is not None:
            try:
                socket.send_fds(self.guard[1], [msg.encode() + b" "], [fd] if fd >= 0 else [])
            except OSError:
                pass  # it died: restarted when reaped, with every lock held then

    def kill(self, sid: int) -> None:
        pid = self.sids.get(sid)
        if pid is None:
            return
        self._drop_park(sid, answer=False)
        how = self.stopped.pop(sid, None)
        if self.local:
            signal_quietly(pid, signal.SIGKILL)  # pid 1 of its namespace: everything in it dies with it
            if how == "freezer":  # cgroup v1 holds a frozen task's SIGKILL until it thaws
                self.cgroups.thaw(self.cg_fds.get(sid, []))
        else:
            self.reap_uid()  # a reaper with the code's uid kills every process of it

    def _kill_quietly(self, sid: int | None) -> None:
        """After a failed request: end that session, whatever state it was left in."""
        try:
            if sid in self.sids:
                self.kill(sid)
        except Exception as e:  # noqa: BLE001 - the worker must go on serving the others
            print(f"sandbox worker: kill {sid}: {type(e).__name__}: {e}", file=sys.stderr)

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.guard is not None and pid == self.guard[0]:
                self.guard[1].close()
                self.start_guard()  # killed by someone: its duty outlives it
                continue
            sid = self.pids.pop(pid, None)
            if sid is None:
                continue  # an orphan reparented to us (docker: we are the container's init)
            del self.sids[sid]
            self._drop_park(sid, answer=True)
            self.stopped.pop(sid, None)
            self.ns.pop(sid, None)
            self._free_uid(sid)  # pid 1 of its namespace is reaped last: no process of the uid is left
            if not self.local and self.dirty and not self.sids:  # it died by itself: clean up after it
                self.reap_uid()
            try:
                oom = self.oom_kills(sid) > (0 if self.local else self.oom_base)
                self.oom_base = self.oom_kills()
            except OSError:  # unreadable counter: no OOM is claimed
                oom = False
            if self.cgroups is not None:
                for fd in self.cg_fds.pop(sid, []):
                    os.close(fd)
                for _ in range(100):
                    if self.cgroups.remove(sid):
                        break
                    time.sleep(0.001)
            try:
                send(self.sock, {"op": "exit", "sid": sid, "status": status, "oom": oom})
            except OSError:  # the host is gone: so are we
                self.shutdown()
                os._exit(0)

    def reap_uid(self) -> None:
        """Docker mode: kill every process of the code's uid and empty its writable dirs. The
        reaper is forked in advance: a fork bomb at the pids limit cannot stop it being there."""
        self.dirty = False
        for _ in range(2):  # a reaper that died before its turn is replaced once
            pid, go = self.reaper or fork_reaper(self.uid(0))
            self.reaper = None
            try:
                os.write(go, b"x")
                os.waitpid(pid, 0)
                break
            except (BrokenPipeError, ChildProcessError):
                continue
            finally:
                os.close(go)
        try:
            self.reaper = fork_reaper(self.uid(0))
        except OSError:
            pass  # retried at the next reap

    def shutdown(self) -> None:
        for sid in list(self.sids):
            self._kill_quietly(sid)  # thaws frozen ones too: they could not die otherwise
        for pid in list(self.pids):
            os.waitpid(pid, 0)
        if self.cgroups is not None:
            for sid in list(self.cg_fds):
                self.cgroups.remove(sid)
            self.cgroups.close()


def _become_child_of_waiter(iso) -> None:
    """Fork; the parent (which the host started and watches) waits and exits with the child's
    status, and the child (pid 1 of the pid namespace just unshared) carries on as the worker.
    The child dies with the parent, and with it every session."""
    pid = os.fork()
    if pid != 0:
        os.closerange(3, 1 << 20)  # the host's socket stays with the child only
        _, status = os.waitpid(pid, 0)
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    iso.prctl(iso.PR_SET_PDEATHSIG, signal.SIGKILL)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    worker = Worker(cfg)
    if cfg["mode"] == "local":
        sock = socket.socket(fileno=cfg["fd"])
    else:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(cfg["listen"])
        listener.listen(1)
        sock, _ = listener.accept()
        listener.close()
    try:
        hello = worker.setup()
    except Exception as e:  # noqa: BLE001 - e.g. no privileges for namespaces
        send(sock, {"op": "fatal", "error": f"{type(e).__name__}: {e}"})
        sys.exit(1)
    sys.path.pop(0)  # the code must not import our modules
    send(sock, hello)
    worker.serve(sock)


if __name__ == "__main__":
    main()
