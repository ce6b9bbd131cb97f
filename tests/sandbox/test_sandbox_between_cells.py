"""Nothing of a session runs between its cells, nothing of one cell reaches the next, and nothing
a cell can put into /proc or into its reply harms the worker, other sessions or later cells.
Each test is one way through between cells; all run on every backend."""

from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path

import pytest

from sandbox import ExecStatus

_spec = importlib.util.spec_from_file_location("sandbox_attacks", Path(__file__).with_name("attacks.py"))
attacks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(attacks)


def test_a_process_name_that_is_not_utf8_hurts_no_other_trajectory(box):
    with box.session() as a, box.session() as b:
        assert a.run("state = 1").ok and b.run("mine = 2").ok
        other = {}
        thread = threading.Thread(
            target=lambda: other.setdefault("r", b.run("import time; time.sleep(1.0); print(mine)"))
        )
        thread.start()
        time.sleep(0.2)  # b's cell is in flight while the worker looks at a's leftovers
        r = a.run(attacks.RENAMED_CHILD)
        thread.join()
        assert r.status == "ok" and r.stdout == "parent\n" and "killed" in r.error, r
        assert other["r"].status == "ok" and other["r"].stdout == "2\n", other["r"]  # b never noticed
        assert a.run("print(state)").stdout == "1\n"  # a keeps its state: no worker was restarted
    r = box.run(attacks.RENAMED_CHILD)  # a stateless cell: the session is torn down
    assert r.status == "ok", r
    assert box.run("print('fine')").stdout == "fine\n"


def test_a_daemon_with_an_odd_name_does_not_outlive_its_session(box, marker, procs):
    with box.session() as s:
        assert s.run(attacks.RENAMED_DAEMON.format(marker=marker)).status == "ok"
    assert not procs.wait_gone(marker), "a renamed daemon survived its session"
    assert box.run("print('next')").stdout == "next\n"  # docker: the reused container is clean


def test_a_process_whose_main_thread_exited_is_killed_after_its_cell(box):
    with box.session() as s:
        r = s.run(attacks.zombie_leader())
        assert r.status == "ok" and "1 process(es)" in r.error, r  # counted by its live thread
        time.sleep(0.3)  # between cells: it would run now
        r = s.run(attacks.grows("/tmp/spin"))
        assert r.status == "ok" and r.stdout == "0\n", r


def test_a_child_forked_right_after_the_reply_does_not_run_between_cells(box):
    with box.session() as s:
        assert s.run(attacks.FORK_AFTER_REPLY).ok
        for _ in range(2):
            time.sleep(0.6)  # between cells: a child the stop missed would write now
            r = s.run(attacks.wrote_between_cells(time.time()))
            assert r.status == "ok" and r.stdout == "0\n", r


def test_memory_error_is_the_cells_exception_and_oom_is_the_kernels_word(box):
    r = box.run("raise MemoryError('the code says so')")
    assert r.status == "error" and r.exit_code == 1 and "MemoryError" in r.stderr, r
    r = box.run("b = bytearray(1 << 30)")  # over the 256 MB cgroup: the kernel's OOM kill
    assert r.status == "oom" and r.signal == 9, r


def test_a_patched_runner_changes_only_what_its_own_cells_report(box):
    # The runner lives in the session's interpreter: a cell can make later cells of the same
    # session report exit code 0 (cell-reported). What the host observes stays true.
    tampered = box.sandbox.stats["tampered"]
    with box.session() as s:
        assert s.run(attacks.PATCHED_RUNNER).ok
        r = s.run("1 / 0")
        assert r.status == "ok" and "ZeroDivisionError" in r.stderr, r  # the exit code: cell-reported
        r = s.run("import os; os._exit(3)")  # the wait status: the kernel's
        assert r.status == "error" and r.exit_code == 3, r
        assert s.run("print('x' * 10**6)").status == "output_limit"  # the pipes: read by the host
        r = s.run("while True: pass", timeout=0.5)  # the clock: the host's
        assert r.status == "timeout", r
    assert box.sandbox.stats["tampered"] == tampered  # well-formed replies: nothing here is tampering


@pytest.mark.parametrize("name", sorted(attacks.LONG_NAMES))
def test_a_long_exception_name_is_the_codes_error_not_tampering(box, name):
    name = attacks.LONG_NAMES[name]
    with box.session() as s:
        assert s.run("kept = 1").ok
        r = s.run(f"raise type({name}, (Exception,), {{}})()")
        assert r.status == "error" and r.exit_code == 1 and "control channel" not in r.error, r
        assert eval(name)[:50] in r.stderr  # noqa: S307 - our own literal
        assert s.run("print(kept)").stdout == "1\n"  # the session was not killed


@pytest.mark.parametrize("kind", sorted(attacks.TIMERS))
def test_a_timer_armed_in_one_cell_does_not_fire_in_the_next(box, kind):
    with box.session() as s:
        assert s.run(attacks.TIMERS[kind]).ok
        r = s.run("import time; time.sleep(1.2); print('mine')")
        assert r.status == "ok" and r.stdout == "mine\n", r


def test_signals_of_killed_leftovers_are_handled_between_cells(box):
    code = (
        "import os, signal, time\nsignal.signal(signal.SIGCHLD, lambda *a: print('child ended', flush=True))\n"
        "if os.fork() == 0:\n    time.sleep(30)\n    os._exit(0)\nprint('parent')"
    )
    with box.session() as s:
        r = s.run(code)
        assert r.status == "ok" and r.stdout == "parent\n" and "killed" in r.error, r
        r = s.run("import time; time.sleep(0.3); print('mine')")
        assert r.stdout == "mine\n", r
        assert s.run("print('again')").stdout == "again\n"


def test_statuses_are_from_the_host_for_every_kind_of_end(box):
    with box.session() as s:
        assert s.run("import sys; sys.exit(True)").exit_code == 1
        assert s.run("import sys\nclass N(int):\n    def __and__(self, o): return 999\nsys.exit(N(7))").exit_code == 7
        r = s.run("import sys\nclass S:\n    def __str__(self): raise RuntimeError\nsys.exit(S())")
        assert r.status == ExecStatus.ERROR and r.exit_code == 1 and "control channel" not in r.error, r
        assert s.run("print('alive')").stdout == "alive\n"
