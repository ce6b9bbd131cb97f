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
