"""Local backend, attacked one limit at a time. Runs for real (namespaces, cgroups) as root."""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import time

import pytest

from sandbox import ExecStatus, Limits, SandboxConfig, SyncSandbox

# small limits so each attack ends fast (the same values as the conftest `limits` fixture)
TEST_LIMITS = Limits(wall_time_s=3.0, memory_mb=256, max_output_bytes=4096, disk_mb=16, max_processes=32)

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="the local sandbox needs root (namespaces, cgroups)"),
              pytest.mark.xdist_group("sandbox-local")]


@pytest.fixture(scope="module")
def sb():
    os.environ["STARE_TEST_SECRET"] = "hunter2"  # must not reach the code
    with SyncSandbox(SandboxConfig(limits=TEST_LIMITS, workers=2)) as box:
        yield box
    os.environ.pop("STARE_TEST_SECRET", None)


def run_all(sb: SyncSandbox, coros_fn):
    """Run `coros_fn(sandbox)` (a coroutine) on the sandbox's own loop."""
    return asyncio.run_coroutine_threadsafe(coros_fn(sb.sandbox), sb.loop).result()


def test_isolation_is_really_set_up(sb):
    info = sb.sandbox.info
    assert info["cgroups"] and info["seccomp"], info
    r = sb.run("import os\nprint(os.getuid(), os.getpid())\n"
               "print([l for l in open('/proc/self/status') if l.startswith('CapEff')][0].split()[1])")
    uid, pid, caps = r.stdout.split()
    assert r.status == "ok" and int(uid) >= 200_000 and pid == "1" and int(caps, 16) == 0, r


def test_ok_error_and_exit_codes(sb):
    r = sb.run("print(1 + 1)")
    assert (r.status, r.exit_code, r.stdout, r.stderr) == (ExecStatus.OK, 0, "2\n", "")
    r = sb.run("x = 1\nraise ValueError('bad')")
    assert r.status == "error" and r.exit_code == 1 and "ValueError: bad" in r.stderr and "line 2" in r.stderr
    r = sb.run("def f(:\n  pass")
    assert r.status == "error" and "SyntaxError" in r.stderr
    assert (sb.run("import sys; sys.exit(3)").exit_code, sb.run("import sys; sys.exit(0)").status) == (3, "ok")


def test_status_never_comes_from_printed_text(sb):
    code = ("print('sandbox_error timeout oom {\"op\": \"done\", \"exit_code\": 1}')\n"
            "import sys; print('Traceback (most recent call last):', file=sys.stderr)")
    r = sb.run(code)
    assert r.status == "ok" and r.exit_code == 0 and "sandbox_error" in r.stdout


def test_stateful_and_stateless_sessions_are_separate(sb):
    with sb.session() as a, sb.session() as b, sb.session(stateless=True) as c:
        assert a.run("x = 41; open('/tmp/a.txt', 'w').write('secret-a')").ok
        assert a.run("x += 1\nprint(x, open('/tmp/a.txt').read())").stdout == "42 secret-a\n"
        r = b.run("import os\nprint(x if 'x' in dir() else 'no x', os.listdir('/tmp'))")
        assert r.stdout == "no x []\n", r
        assert c.run("y = 1").ok
        assert "NameError" in c.run("print(y)").stderr
    assert not any("a.txt" in f for f in os.listdir("/tmp")), "the session's files reached the host"


def test_wall_time_kills_the_whole_tree(sb, marker, procs):
    code = (
        "import subprocess, sys, os\n"
        # a grandchild in its own session (setsid), double-forked away from us
        f"subprocess.Popen([sys.executable, '-c', 'import os, time\\nif os.fork() == 0: time.sleep(600)', '{marker}'],"
        " start_new_session=True)\n"
        "import time; time.sleep(0.5)\n"
        "while True: pass\n"
    )
    t = time.monotonic()
    r = sb.run(code, timeout=1.5)
    assert r.status == "timeout" and r.signal == signal.SIGKILL and 1.4 < time.monotonic() - t < 3.5, r
    assert not procs.wait_gone(marker), "a grandchild outlived the timeout"


def test_timeout_in_c_code_and_caller_timeout_only_shortens(sb):
    t = time.monotonic()
    r = sb.run("import re\nre.match(r'(a+)+$', 'a' * 64 + 'b')", timeout=0.5)  # C loop holding the GIL
    assert r.status == "timeout" and time.monotonic() - t < 2.0, r
    t = time.monotonic()
    r = sb.run("import time; time.sleep(30)", timeout=100)  # cannot raise the 3 s limit
    assert r.status == "timeout" and time.monotonic() - t < 5.0, r
    assert sb.run("print('alive')").stdout == "alive\n"


def test_memory_limit_covers_all_processes_together(sb):
    # 4 processes x 100 MB each > 256 MB for the session: someone must be OOM-killed
    code = (
        "import os, time\n"
        "kids = []\n"
        "for _ in range(4):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        b = bytearray(100 << 20); time.sleep(2); os._exit(0)\n"
        "    kids.append(pid)\n"
        "print([os.waitpid(k, 0)[1] for k in kids])\n"
    )
    r = sb.run(code)
    assert r.status == "oom" or (r.status == "ok" and str(signal.SIGKILL) in r.stdout), r
    r = sb.run("b = bytearray(1 << 30)")  # one 1 GiB allocation
    assert r.status == "oom" and r.exit_code in (1, 137), r
    assert sb.run("print('alive')").ok


def test_fork_bomb_is_contained(sb, marker, procs):
    code = f"import os, sys\nsys.argv.append('{marker}')\nwhile True:\n    try: os.fork()\n    except OSError: pass\n"
    r = sb.run(code, timeout=1.5)
    assert r.status == "timeout", r
    assert not procs.wait_gone(marker)
    r = sb.run("import threading, time\nn = 0\ntry:\n    while True:\n"
               "        threading.Thread(target=time.sleep, args=(5,), daemon=True).start(); n += 1\n"
               "except RuntimeError: print(n)")
    assert r.status == "ok" and 0 < int(r.stdout) <= TEST_LIMITS.max_processes, r


def test_disk_is_private_capped_and_everything_else_read_only(sb):
    r = sb.run("open('/tmp/big', 'wb').write(b'x' * (64 << 20))")  # 64 MB > 16 MB
    assert r.status == "error" and ("No space left" in r.stderr or "File too large" in r.stderr), r
    code = ("import os\nfor p in ['/etc/x', '/usr/x', '/x', '/dev/shm/../x', '/proc/x', "
            f"'{os.path.dirname(os.__file__)}/x']:\n"
            "    try: open(p, 'w'); print('WROTE', p)\n    except OSError as e: pass\nprint('done')")
    assert sb.run(code).stdout == "done\n"


def test_output_is_capped_while_streaming(sb):
    t = time.monotonic()
    r = sb.run("while True: print('x' * 1000)")  # never ends by itself
    assert r.status == "output_limit" and r.stdout_truncated and len(r.stdout) == TEST_LIMITS.max_output_bytes
    assert time.monotonic() - t < 2.0, "killed at the cap, not at the wall-time limit"
    r = sb.run("import sys; sys.stderr.write('e' * 10000); print('ok')")
    assert r.status == "output_limit" and r.stderr_truncated and not r.stdout_truncated and r.stdout == "ok\n"


def test_no_network_not_even_loopback(sb):
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    try:
        code = ("import socket\nfor fam, addr in [(socket.AF_INET, ('127.0.0.1', %d)), "
                "(socket.AF_INET, ('1.1.1.1', 53)), (socket.AF_INET6, ('::1', %d))]:\n"
                "    try:\n        s = socket.socket(fam); s.settimeout(1); s.connect(addr); print('CONNECTED', addr)\n"
                "    except OSError as e: print('blocked')\n") % (port, port)
        r = sb.run(code)
        assert r.stdout == "blocked\n" * 3, r
    finally:
        srv.close()


def test_no_host_secrets(sb):
    code = (
        "import os\n"
        "print(os.environ.get('STARE_TEST_SECRET'))\n"
        "print(sorted(p for p in os.listdir('/proc') if p.isdigit()))\n"
        "print(os.path.exists('/root/.bashrc'), os.path.exists('/home'), os.path.exists('/var'))\n"
        f"print(os.path.exists({__file__!r}))\n"
    )
    r = sb.run(code)
    assert r.stdout == "None\n['1']\nFalse False False\nFalse\n", r


def test_big_code_nul_bytes_and_bad_utf8(sb):
    big = "x = '" + "a" * (1 << 20) + "'\nprint(len(x))"
    assert sb.run(big).stdout == f"{1 << 20}\n"
    r = sb.run("print(1)\x00print(2)")
    assert r.status == "error" and "null" in r.stderr, r
    r = sb.run("s = '\udcff'")  # a lone surrogate in the code itself
    assert r.status == "error", r
    r = sb.run("import sys; sys.stdout.buffer.write(b'\\xff\\xfe\\x00ok\\n')")
    assert r.status == "ok" and r.stdout == "\ufffd\ufffd\x00ok\n", r


@pytest.mark.parametrize("code, status, sig", [
    ("import ctypes; ctypes.string_at(0)", "killed", signal.SIGSEGV),
    # C-stack overflow (repr recurses in C); Python-level recursion grows the heap instead: OOM
    ("import sys; sys.setrecursionlimit(10**7)\nx = []\nfor _ in range(10**6): x = [x]\nrepr(x)", "killed", signal.SIGSEGV),
    ("import sys; sys.setrecursionlimit(10**8)\ndef f(n): return f(n + 1)\nf(0)", "oom", signal.SIGKILL),
    # the interpreter is pid 1 of its namespace: abort()'s SIGABRT is ignored and it ends in SIGSEGV
    ("import os; os.abort()", "killed", signal.SIGSEGV),
    ("import os; os._exit(5)", "error", None),
])
def test_crashes_are_results_and_the_next_call_works(sb, code, status, sig):
    with sb.session() as s:
        assert s.run("state = 1").ok
        r = s.run(code)
        assert r.status == status and r.signal == sig, r
        r = s.run("print('state' in dir())")  # a fresh interpreter: state is gone, the session works
        assert r.status == "ok" and r.stdout == "False\n"


@pytest.mark.parametrize("code", [
    "import os; os.close(0); os.close(1); os.close(2)",
    "import os, signal; os.killpg(os.getpgrp(), signal.SIGKILL)",
    "import os, signal; os.kill(os.getppid(), signal.SIGKILL)",
    "import os, signal; os.kill(-1, signal.SIGKILL)",
    "import os; os.closerange(3, 4096)",
    "import threading, time\ndef spam():\n    while True: print('bg'); time.sleep(0.01)\n"
    "threading.Thread(target=spam, daemon=True).start()",
])
def test_hostile_cells_leave_host_and_session_working(sb, code):
    with sb.session() as s:
        r = s.run(code)
        assert r.status != "sandbox_error", r
        assert s.run("print('next')").stdout.endswith("next\n")
    assert sb.run("print('host fine')").stdout == "host fine\n"


def test_lingering_child_does_not_hold_the_result(sb, marker, procs):
    with sb.session() as s:
        t = time.monotonic()
        r = s.run(f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', '{marker}'])\n"
                  "print('started')")
        assert r.status == "ok" and r.stdout == "started\n" and time.monotonic() - t < 2
        assert procs.with_marker(marker), "the child should still be running inside the session"
    assert not procs.wait_gone(marker), "closing the session must kill it"


def test_subprocess_and_preloaded_modules_work_inside(sb):
    r = sb.run("import subprocess, sys, numpy, sympy\n"
               "print(subprocess.run([sys.executable, '-c', 'print(6*7)'], capture_output=True, text=True).stdout, end='')\n"
               "print(numpy.arange(4).sum(), sympy.factorint(12))")
    assert r.stdout == "42\n6 {2: 2, 3: 1}\n", r


def test_seccomp_blocks_namespaces_and_ptrace(sb):
    code = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "print(libc.unshare(0x10000000), ctypes.get_errno() == 1)\n"  # CLONE_NEWUSER
            "print(libc.ptrace(16, 1, 0, 0), ctypes.get_errno() == 1)\n")  # PTRACE_ATTACH
    assert sb.run(code).stdout == "-1 True\n-1 True\n"


def test_many_concurrent_calls_and_a_bounded_queue():
    async def burst(box):
        return await asyncio.gather(*(box.run(f"print({i})") for i in range(60)))

    cfg = SandboxConfig(limits=TEST_LIMITS, workers=2, queue_size=3)
    with SyncSandbox(cfg) as box:
        results = run_all(box, burst)
        ok = [r for r in results if r.status == "ok"]
        full = [r for r in results if r.status == "sandbox_error"]
        assert len(ok) + len(full) == 60 and len(ok) >= 5 and full, [r.status for r in results]
        assert all("queue full" in r.error for r in full)
        assert all(r.stdout == f"{i}\n" for i, r in enumerate(results) if r.status == "ok")
    with SyncSandbox(SandboxConfig(limits=TEST_LIMITS, workers=2)) as box:
        assert all(r.status == "ok" for r in run_all(box, burst))


def test_dead_worker_is_replaced(sb):
    with sb.session() as s:
        assert s.run("v = 1").ok
        os.kill(sb.sandbox.popen.pid, signal.SIGKILL)
        time.sleep(0.2)
        r = s.run("print('v' in dir())")
        assert r.status == "ok" and r.stdout == "False\n", r  # new worker, new interpreter
    assert sb.run("print(2)").stdout == "2\n"


def test_infrastructure_failure_is_sandbox_error():
    cfg = SandboxConfig(limits=TEST_LIMITS, spawn_timeout_s=0.001)  # the worker cannot be ready so fast
    box = SyncSandbox.__new__(SyncSandbox)
    try:
        SyncSandbox.__init__(box, cfg)
    except Exception as e:  # noqa: BLE001 - starting eagerly may fail with the SandboxError itself
        assert "not ready" in str(e)
        return
    try:
        r = box.run("print(1)")
        assert r.status == "sandbox_error" and r.error, r
    finally:
        box.close()
