"""Docker mode: the reaper that cleans the container between sessions. Stdlib only.

The container is reused from one session to the next, so when a session ends every process of
the code's uid is killed and what it may have left in shared places is removed: /tmp, /dev/shm,
POSIX message queues and SysV IPC objects. The reaper is forked by the worker in advance and
waits for a byte on a pipe: a fork bomb at the pids limit cannot keep it from existing. It then
becomes the code's uid (it needs no privilege to kill and remove what that uid owns).
"""

from __future__ import annotations

import os
import shutil
import signal
import time

from _park import session_members_by_uid
from _procfs import live, sysvipc_ids, task_states


def fork_reaper(uid: int) -> tuple[int, int]:
    """Fork a reaper for `uid`; returns (its pid, the pipe that starts it)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.closerange(3, r)
            os.closerange(r + 1, 1 << 20)
            signal.set_wakeup_fd(-1)
            if os.read(r, 1) != b"x":  # the worker went away
                os._exit(0)
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            reap(uid)
        finally:
            os._exit(0)
    os.close(r)
    return pid, w


def reap(uid: int) -> None:
    """As `uid`: kill all its processes, then remove its files and IPC objects."""
    proc_fd = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    deadline = time.monotonic() + 5
    while True:
        try:  # everything we may signal: our uid; a pending SIGKILL also stops fork bombs
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if not live_processes(proc_fd, uid) or time.monotonic() > deadline:
            break
        time.sleep(0.001)
    for d in ("/tmp", "/dev/shm", "/dev/mqueue"):  # mqueue: POSIX message queues
        wipe(d)
    wipe_sysv_ipc()  # the container's IPC namespace outlives the session: empty it too


def live_processes(proc_fd: int, uid: int) -> bool:
    """Any process of `uid` with a thread that may still run? (kill() 'succeeds' on zombies, and a
    zombie leader's other threads may still run: count threads, not the leader's state.)"""
    me = os.getpid()
    return any(p != me and live(task_states(proc_fd, p)) for p in session_members_by_uid(proc_fd, uid))


def wipe_sysv_ipc() -> None:
    """Remove every SysV shared memory segment, message queue and semaphore set we may remove
    (the reaper runs as the code's uid: exactly the ones the code made)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    ipc_rmid = 0
    for kind, remove in (
        ("shm", lambda i: libc.shmctl(i, ipc_rmid, None)),
        ("msg", lambda i: libc.msgctl(i, ipc_rmid, None)),
        ("sem", lambda i: libc.semctl(i, 0, ipc_rmid)),
    ):
        try:
            with open(f"/proc/sysvipc/{kind}", "rb") as f:
                table = f.read()
        except OSError:
            continue
        for ipc_id in sysvipc_ids(table):
            remove(ipc_id)


def wipe(path: str) -> None:
    def fix(func, p, _exc):  # a dir the code made unreadable: make it ours again, retry
        os.chmod(os.path.dirname(p) or p, 0o700)
        if os.path.isdir(p) and not os.path.islink(p):
            os.chmod(p, 0o700)
            shutil.rmtree(p, ignore_errors=True)
        else:
            os.unlink(p)

    try:
        entries = list(os.scandir(path))
    except OSError:
        return
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                os.chmod(entry.path, 0o700)
                shutil.rmtree(entry.path, onerror=fix)
            else:
                os.unlink(entry.path)
        except OSError:
            pass
