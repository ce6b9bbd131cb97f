"""Stopping a session between cells (the worker's "park"). Stdlib only; runs in the worker.

After each reply nothing of the session may run until its next cell, and what the cell left
behind is killed: other processes (counted; the session goes on), and threads of the session's
interpreter besides its main thread (the session is then restarted: they would otherwise write
into a later cell's output). Both are found by counting live threads, never by a process's state:
a process whose main thread has exited shows as a zombie while its other threads run.

Two ways, each atomic in effect:
- `park_frozen` (root with a freezer cgroup): freeze the session's group, which stops every task
  in it at once (tasks forked meanwhile included), then read its live threads from the group and
  kill every process but the interpreter while the rest stays frozen.
- `park_signalled` (rootless, Docker, no freezer): SIGSTOP the interpreter and SIGKILL every other
  process of the session, again and again, until a whole pass over the session finds no task
  that can run. A stopped or killed process cannot fork, so each pass can only find fewer.
Either way, the killed processes are dead before the park is answered, so not even their exit
(a SIGCHLD to a handler the cell installed) can reach the next cell. Parks are stepped by the
worker between its other requests (see `Park`), never blocking it.
"""

from __future__ import annotations

import os
import select
import signal
import time
from typing import Callable, Generator, Iterator

from _procfs import STOPPED, listdir_at, live, read_at, status_tgid, status_uid, task_states

STOP_TIMEOUT_S = 2.0  # a session that cannot be stopped by then is killed (and restarted)
KILLS_PER_STEP = 8  # leftovers killed (and released from a frozen group) per step of a park
# A park is a generator the worker steps: each step does a bounded piece of work (one pass over
# the session, one freezer check) and yields how long to wait before the next, so the worker
# serves every other session's requests in between: one session's leftovers never delay another's
# resume. It returns (processes killed, live threads of the session's interpreter).
Park = Generator[float, None, "tuple[int, list[int]]"]


def signal_quietly(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def park_frozen(cgroups, fds: list[int], pid: int, proc_fd: int, deadline: float, sid: int = -1) -> Park:
    """Freeze the session, kill every process but `pid`; returns (processes killed, live threads
    of `pid`). Raises TimeoutError if the group does not freeze or a killed process does not die.
    The killed processes die when they thaw: all at once when `pid` can move to the session's
    twin group (`cgroups.hand_over`, one migration), else each moved out of the frozen group."""
    yield from cgroups.freeze(fds, deadline)
    groups: dict[int, list[int]] = {}
    for tid in cgroups.threads(fds) or []:
        tgid = pid if tid == pid else status_tgid(read_at(proc_fd, f"{tid}/status", 4096) or b"")
        if tgid is not None:  # None: it exited since the listing
            groups.setdefault(tgid, []).append(tid)
    others = [g for g in groups if g != pid]
    yield from kill_and_wait(
        others,
        proc_fd,
        deadline,
        release=lambda g: cgroups.release(fds, g),
        release_all=lambda: cgroups.hand_over(fds, sid, pid),
    )
    return len(others), groups.get(pid, [])


def park_signalled(members: Callable[[], list[int]], pid: int, proc_fd: int, deadline: float) -> Park:
    """Stop `pid` (SIGSTOP) and kill every other process `members()` lists until none of the
    session can run; returns (processes killed, live threads of `pid`). Raises TimeoutError."""
    killed: set[int] = set()
    while True:
        busy = False
        own = task_states(proc_fd, pid)
        if any(own[tid] not in STOPPED for tid in live(own)):
            busy = True
            signal_quietly(pid, signal.SIGSTOP)  # again: a leftover may have sent it SIGCONT
        for p in members():
            if p != pid and live(task_states(proc_fd, p)):
                busy = True
                killed.add(p)
                signal_quietly(p, signal.SIGKILL)
        if not busy:
            return len(killed), live(own)
        if time.monotonic() > deadline:
            raise TimeoutError("the session's processes did not all stop")
        yield 0.0002


def kill_and_wait(
    pids: list[int],
    proc_fd: int,
    deadline: float,
    release: Callable[[int], None] | None = None,
    release_all: Callable[[], bool] | None = None,
) -> Iterator[float]:
    """SIGKILL each process and wait until all have exited (pidfds; a reused pid cannot fool it).
    Frozen processes hold their SIGKILL until they thaw: `release_all()` thaws all of them once
    every one has it (True if it did), else `release(pid)` each. Yields how long to wait before
    looking again."""
    waits = []
    for p in pids:
        try:
            waits.append((p, os.pidfd_open(p)))
        except ProcessLookupError:
            continue  # gone already
        except OSError:  # no pidfds (Linux < 5.3): watch its tasks instead
            waits.append((p, -1))
    try:
        for p, _ in waits:
            signal_quietly(p, signal.SIGKILL)
        if waits and release is not None and not (release_all is not None and release_all()):
            for i, (p, _) in enumerate(waits, 1):
                release(p)  # a cgroup migration each (v1): up to an RCU grace period, tens of ms under load
                if i % KILLS_PER_STEP == 0:
                    yield 0.0  # many leftovers: let the worker serve other sessions in between
        poller, pending = select.poll(), {fd for _, fd in waits if fd >= 0}
        for fd in pending:
            poller.register(fd, select.POLLIN)  # readable once the process has exited
        while pending or any(fd < 0 and live(task_states(proc_fd, p)) for p, fd in waits):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("processes the cell left behind did not die")
            if pending:
                for fd, _ in poller.poll(0):
                    pending.discard(fd)
                    poller.unregister(fd)
            if pending or any(fd < 0 and live(task_states(proc_fd, p)) for p, fd in waits):
                yield 0.0005
    finally:
        for _, fd in waits:
            if fd >= 0:
                os.close(fd)


def session_members_by_ns(proc_fd: int, ns: int) -> list[int]:
    """Processes whose pid namespace is `ns` (rootless, or root without cgroups)."""
    out = []
    for name in os.listdir(proc_fd):
        if name.isdigit() and name.isascii() and _pid_ns(proc_fd, name) == ns:
            out.append(int(name))
    return out


def _pid_ns(proc_fd: int, pid: str) -> int | None:
    try:
        return os.stat(f"{pid}/ns/pid", dir_fd=proc_fd).st_ino
    except OSError:  # a zombie leader may not show its namespaces: ask one of its threads
        for tid in listdir_at(proc_fd, f"{pid}/task"):
            try:
                return os.stat(f"{pid}/task/{tid}/ns/pid", dir_fd=proc_fd).st_ino
            except OSError:
                continue
    return None


def session_members_by_uid(proc_fd: int, uid: int) -> list[int]:
    """Processes whose real uid is `uid` (Docker: the code's uid; the worker and reaper are root)."""
    out = []
    for name in os.listdir(proc_fd):
        if name.isdigit() and name.isascii() and status_uid(read_at(proc_fd, f"{name}/status", 4096) or b"") == uid:
            out.append(int(name))
    return out
