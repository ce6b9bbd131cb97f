"""No cell outlives its worker (root mode; rootless in rootless_probe.py, whose worker is pid 1 of
the namespace every session lives in). The worker holds its cells by the parent-death signal, by
their cgroups (its guard kills every process of them when the worker is gone) and by their
non-dumpable, read-only /proc (their OOM score stays at the top). A cell that tries to loosen any of
these, or forks away, is dead within a second of its worker's SIGKILL, checked by a process scan."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

pytestmark = pytest.mark.xdist_group("sandbox-local")

# Clear the parent-death signal, make itself dumpable, lower its OOM score, then fork a daemon
# named by the test's marker into a new session and process group, and report what worked.
LOOSEN = """import ctypes, os, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
pdeath = libc.prctl(1, 0, 0, 0, 0)
dumpable = libc.prctl(4, 1, 0, 0, 0)
try:
    open('/proc/self/oom_score_adj', 'w').write('0')
    oom = 'lowered'
except OSError as e:
    oom = type(e).__name__
subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', '{marker}'], start_new_session=True)
print(pdeath, dumpable, oom, open('/proc/self/oom_score_adj').read().strip())
"""


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(c) for c in f.read().split()]


def _guard_of(worker: int) -> int:
    """The worker's child that lives in the host's pid namespace (sessions are pid 1 of their own)."""
    for child in _children(worker):
        with open(f"/proc/{child}/status") as f:
            nspid = next(line for line in f if line.startswith("NSpid:")).split()[1:]
        if len(nspid) == 1:
            return child
    raise AssertionError("the worker has no guard")


def _uid_holders(uid: int) -> list[int]:
    """Live processes of `uid` (a zombie, dead and waiting for its reaper, does not count)."""
    out = []
    for p in os.listdir("/proc"):
        try:
            with open(f"/proc/{p}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if int(fields.get("Uid", "-1 ").split()[0]) == uid and not fields.get("State", "").strip().startswith("Z"):
            out.append(int(p))
    return out


def _sessions(box, marker: str) -> tuple:
    """An idle (frozen) session and an in-flight one, both having run LOOSEN."""
    idle = box.session().__enter__()
    busy = box.session().__enter__()
    r = idle.run(LOOSEN.format(marker=marker + "-idle") + "import time\n")
    assert r.status == "ok", r
    return idle, busy, r


def test_a_cell_cannot_loosen_its_workers_hold(make_box, marker, procs):
    box = make_box("local")
    try:
        with box.session() as s:
            r = s.run(LOOSEN.format(marker=marker))
            assert r.status == "ok", r
            assert r.stdout == "-1 -1 OSError 1000\n", r  # prctl denied (EPERM), /proc read-only
            worker_score = open(f"/proc/{box.sandbox.popen.pid}/oom_score_adj").read().strip()
            assert worker_score == "900", worker_score  # the sandbox before the trainer (0)
    finally:
        box.close()
    assert not procs.wait_gone(marker, timeout=2.0), "a daemon of a closed sandbox still runs"


def test_no_cell_outlives_its_workers_sigkill(make_box, marker, procs):
    """An in-flight cell and a frozen idle session, both having tried to loosen the hold and forked
    daemons away: all of it is dead within 1 s of the worker's SIGKILL, and nothing of the sandbox
    runs after close() or after a new worker started."""
    box = make_box("local")
    try:
        idle, busy, _ = _sessions(box, marker)
        worker = box.sandbox.popen.pid
        code = LOOSEN.format(marker=marker + "-busy") + "import time\ntime.sleep(30)\n"
        threading.Timer(1.0, os.kill, (worker, signal.SIGKILL)).start()
        t0 = time.monotonic()
        r = busy.run(code)
        assert r.status == "sandbox_error" and "worker" in r.error, r
        killed_at = t0 + 1.0
        left = procs.wait_gone(marker, timeout=max(0.0, killed_at + 1.0 - time.monotonic()))
        assert not left, f"{len(left)} process(es) of a killed worker's sessions live on after 1 s"
        assert box.run("print(1)").stdout == "1\n"  # a new worker
        for s in (idle, busy):
            s.__exit__(None, None, None)
    finally:
        box.close()
    assert not procs.with_marker(marker), "something of the closed sandbox still runs"


def test_sessions_die_with_their_worker_even_when_its_guard_died_first(make_box, marker, procs):
    """The guard killed first, then the worker: the worker restarts its guard when it reaps the
    first, and a frozen idle session is dead within 1 s of the worker's SIGKILL all the same."""
    box = make_box("local")
    try:
        idle, busy, _ = _sessions(box, marker)
        worker = box.sandbox.popen.pid
        first = _guard_of(worker)
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                if _guard_of(worker) != first:
                    break
            except (AssertionError, OSError):
                pass
            time.sleep(0.02)
        assert _guard_of(worker) != first, "the worker did not restart its guard"
        os.kill(worker, signal.SIGKILL)
        assert not procs.wait_gone(marker, timeout=1.0), "a frozen session outlived its worker and guard"
        for s in (idle, busy):
            s.__exit__(None, None, None)
    finally:
        box.close()


def test_a_uid_is_never_free_while_a_process_of_it_lives(make_box, marker):
    """After the worker's SIGKILL, the uid of its sessions goes back to the host-wide pool only once
    none of their processes lives: whenever the pool's lock on that uid can be taken, no process
    with that uid exists."""
    import fcntl

    from sandbox.local._uids import pool_dir

    box = make_box("local")
    try:
        with box.session() as s:
            r = s.run(LOOSEN.format(marker=marker) + "print(os.getuid())\n")
            assert r.status == "ok", r
            uid = int(r.stdout.split()[-1])
            os.kill(box.sandbox.popen.pid, signal.SIGKILL)
            fd = os.open(os.path.join(pool_dir(), str(uid)), os.O_RDWR)
            try:
                deadline = time.monotonic() + 3
                while time.monotonic() < deadline:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        time.sleep(0.001)
                        continue
                    left = _uid_holders(uid)
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    assert not left, f"uid {uid} was free while its processes {left} lived"
                    break
                else:
                    raise AssertionError(f"uid {uid} never went back to the pool")
            finally:
                os.close(fd)
    finally:
        box.close()
