"""Run as a user who is not root: exercise the local sandbox's rootless mode and print what was
observed as one JSON object (read by test_sandbox_rootless.py). Needs only the stdlib."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tempfile
import time

import attacks  # noqa: E402 - next to this script (sys.path[0])

from sandbox import Limits, SandboxConfig, make_sandbox

CODE_PROBE = """import os
caps = {l.split(':')[0]: l.split()[1] for l in open('/proc/self/status') if l.startswith(('CapEff', 'CapPrm', 'CapBnd'))}
print(os.getpid(), sorted(caps.items()), sorted(os.listdir('/')), [p for p in os.listdir('/proc') if p.isdigit()],
      os.environ.get('PROBE_SECRET'))
"""


async def probe() -> dict:
    os.environ["PROBE_SECRET"] = "hunter2"  # must never reach the code
    fd, marker = tempfile.mkstemp(prefix="rootless-probe-", dir="/tmp")  # must stay invisible to the code
    os.write(fd, b"host")
    os.close(fd)
    limits = Limits(wall_time_s=10.0, memory_mb=256, max_output_bytes=1 << 16, disk_mb=16, max_processes=32)
    out: dict = {"euid": os.geteuid()}
    cache = sys.argv[1] if len(sys.argv) > 1 else ""  # the root file system tree goes there
    async with make_sandbox(SandboxConfig(backend="local", limits=limits, workers=2, rootfs_cache=cache)) as sb:
        out["info"] = sb.info
        r = await sb.run(CODE_PROBE)
        out["probe"] = [r.status.value, r.stdout]
        async with sb.session() as s:
            out["state"] = [(await s.run("x = 41")).status.value, (await s.run("print(x + 1)")).stdout]
            out["write_tmp"] = (await s.run("open('/tmp/mine', 'w').write('a')")).status.value
            t0 = time.monotonic()
            r = await s.run("while True: pass", timeout=3.0)
            out["timeout"] = [r.status.value, round(time.monotonic() - t0, 1)]
            out["after_timeout"] = (await s.run("print('x' in dir())")).stdout
        async with sb.session() as s:  # between cells: leftovers killed, threads restart, session stopped
            r = await s.run("import os, time\nif os.fork() == 0:\n    time.sleep(60)\nprint('parent')")
            out["leftover_process"] = [r.status.value, r.error]
            out["pids_after"] = (
                await s.run("import os; print([p for p in os.listdir('/proc') if p.isdigit()])")
            ).stdout
            r = await s.run(
                "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()"
            )
            out["leftover_thread"] = [r.status.value, r.error]
            out["forged"] = (await s.run("import os, struct\nos.write(3, struct.pack('!II', 3, 0) + b'[[[')")).error
        async with sb.session() as other:  # a fresh session sees neither the host's /tmp nor another's
            out["tmp_other"] = (await other.run("import os; print(sorted(os.listdir('/tmp')))")).stdout
        r = await sb.run("import socket; socket.socket().connect(('127.0.0.1', 22))")
        out["network"] = [r.status.value, r.stderr.strip().splitlines()[-1] if r.stderr else ""]
        out["write_usr"] = (await sb.run("open('/usr/x', 'w')")).stderr.strip().splitlines()[-1]
        r = await sb.run("b = bytearray(600 << 20)")
        out["memory"] = [r.status.value, r.stderr]
        out["setuid"] = (await sb.run("import os; os.setuid(1)")).stderr.strip().splitlines()[-1]
        out["unshare"] = (
            await sb.run(
                "import ctypes; l = ctypes.CDLL(None, use_errno=True); print(l.unshare(0x10000000), ctypes.get_errno())"
            )
        ).stdout
        out["stdlib"] = (await sb.run("import fractions; print(fractions.Fraction(6, 4))")).stdout
        # Two fork bombs at once: each session is held to its own max_processes (itself included).
        bomb = (
            "import os, time\nn = 0\nfor i in range(200):\n    try:\n        if os.fork() == 0:\n"
            "            time.sleep(2)\n            os._exit(0)\n        n += 1\n    except OSError:\n"
            "        break\nprint(n)"
        )
        a, b = await asyncio.gather(sb.run(bomb), sb.run(bomb))
        out["bombs"] = [[a.status.value, a.stdout.strip()], [b.status.value, b.stdout.strip()]]
        out["after_bombs"] = (await sb.run("print('ok')")).stdout
        out.update(await attacks.between_cells(sb))
        out["loosen"] = (await sb.run(attacks.LOOSEN_HOLD)).stdout
        out["worker_oom_score"] = _worker_oom_score(sb)
    # Memory that no process owns, across cells, under a 128 MB limit: the host's shared memory
    # (Shmem: SysV, memfd, tmpfs) grows by at most what /tmp may hold (disk_mb), never by the 1.5 GB
    # asked for, while the session sits idle holding whatever it got.
    small = Limits(wall_time_s=20.0, memory_mb=128, max_output_bytes=1 << 16, disk_mb=16, max_processes=32)
    async with make_sandbox(SandboxConfig(backend="local", limits=small, workers=1, rootfs_cache=cache)) as sb:
        async with sb.session() as s:
            before = attacks.meminfo_kb("Shmem")
            r = await s.run(attacks.SHARED_MEMORY)
            await s.run("x = 1")  # the next cell: whatever the first one kept is still held
            out["shared_memory"] = [r.status.value, r.stdout.strip(), (attacks.meminfo_kb("Shmem") - before) >> 10]
    # Worker death: a cell that tried to loosen the hold and forked a daemon away, in flight when
    # the worker is SIGKILLed, is dead within 1 s (the worker is pid 1 of every session's namespace).
    async with make_sandbox(SandboxConfig(backend="local", limits=limits, workers=1, rootfs_cache=cache)) as sb:
        async with sb.session() as s:
            tag = f"rootless-daemon-{os.getpid()}"
            code = attacks.LOOSEN_HOLD + (
                f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', 'import time; "
                f"time.sleep(600)', '{tag}'], start_new_session=True)\ntime.sleep(30)"
            )
            task = asyncio.ensure_future(s.run(code))
            await asyncio.sleep(1.0)
            os.kill(sb.popen.pid, signal.SIGKILL)
            t0 = time.monotonic()
            r = await task
            while _with_marker(tag) and time.monotonic() - t0 < 1.0:
                await asyncio.sleep(0.02)
            out["worker_death"] = [r.status.value, len(_with_marker(tag)), round(time.monotonic() - t0, 2)]
    out["after_close"] = len(_with_marker(tag))
    # Timing isolation: 4 neighbour sessions leave 24 processes per cell (killed by the stop loop at
    # every park); the victim's 0.7 s cells under a 1 s limit never time out
    async with make_sandbox(SandboxConfig(backend="local", limits=limits, workers=5, rootfs_cache=cache)) as sb:
        seen = await attacks.victim_under_neighbours(sb, runs=10)
        out["neighbours"] = [x[0] for x in seen]
    os.unlink(marker)
    return out


def _worker_oom_score(sb) -> str:
    """The rootless worker is the child of the process the host started (pid 1 of its namespace)."""
    with open(f"/proc/{sb.popen.pid}/task/{sb.popen.pid}/children") as f:
        child = f.read().split()[0]
    with open(f"/proc/{child}/oom_score_adj") as f:
        return f.read().strip()


def _with_marker(tag: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if tag.encode() in f.read():
                        found.append(int(pid))
            except OSError:
                pass
    return found


if __name__ == "__main__":
    print(json.dumps(asyncio.run(probe())))
    sys.stdout.flush()
