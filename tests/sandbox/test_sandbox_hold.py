"""The worker's hold on its cells, on both backends: a cell cannot clear its parent-death signal,
make itself dumpable or lower its OOM score, and one that forks a daemon away is dead within 1 s
of its worker's SIGKILL (local: the worker process; Docker: the container's init)."""

from __future__ import annotations

import importlib.util
import os
import signal
import threading
import time
from pathlib import Path

_spec = importlib.util.spec_from_file_location("sandbox_attacks", Path(__file__).with_name("attacks.py"))
_attacks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_attacks)
LOOSEN_HOLD = _attacks.LOOSEN_HOLD


def test_a_cell_cannot_loosen_the_hold(box):
    r = box.run(LOOSEN_HOLD)
    pdeath, dumpable, oom, score = r.stdout.split()
    assert r.status == "ok" and (pdeath, dumpable) == ("-1", "-1"), r  # EPERM from the filter
    assert oom in ("OSError", "PermissionError") and score == "1000", r  # read-only /proc, or root-owned


def test_a_daemon_dies_with_its_worker(box, marker, procs):
    daemon = (
        LOOSEN_HOLD + "import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', "
        f"'import time; time.sleep(600)', '{marker}'], start_new_session=True)\ntime.sleep(30)"
    )
    with box.session() as s:
        assert s.run("x = 1").ok

        def kill_worker() -> None:
            if box.backend == "local":
                os.kill(box.sandbox.popen.pid, signal.SIGKILL)
            else:
                s.session.spawn.__self__.container.obj.kill()

        threading.Timer(1.5, kill_worker).start()
        t0 = time.monotonic()
        r = s.run(daemon)
        assert r.status == "sandbox_error", r
        left = procs.wait_gone(marker, timeout=max(0.0, t0 + 2.5 - time.monotonic()))
        assert not left, f"{len(left)} daemon(s) outlived their worker by more than 1 s"
