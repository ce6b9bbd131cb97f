"""Run as a user who is not root: exercise the local sandbox's rootless mode and print what was
observed as one JSON object (read by test_sandbox_rootless.py). Needs only the stdlib."""

from __future__ import annotations

import asyncio
import json
import os
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
    os.unlink(marker)
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(probe())))
    sys.stdout.flush()
