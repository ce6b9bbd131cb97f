"""The code of the adversarial cells, shared by the tests (every backend) and rootless_probe.py
(run as another user, stdlib only). Each string is a cell; its comment says what it attacks."""

from __future__ import annotations

import asyncio
import json
import os
import time

# A child renames itself (prctl PR_SET_NAME) to bytes that are not UTF-8, or that mimic the
# layout of /proc/<pid>/stat and status, then lingers; the worker reads its name after the cell.
ODD_NAMES = [b"\xff\xfe", b"x) R 1 (", b"a\nUid:\t0"]
RENAMED_CHILD = (
    "import ctypes, os, time\nlibc = ctypes.CDLL(None)\n"
    f"for name in {ODD_NAMES!r}:\n"
    "    if os.fork() == 0:\n        libc.prctl(15, name, 0, 0, 0)\n        time.sleep(30)\n        os._exit(0)\n"
    "time.sleep(0.1)\nprint('parent')"
)
# The same name on a daemon that leaves its session (setsid): found by its marker in argv.
RENAMED_DAEMON = (
    "import subprocess, sys\n"
    "subprocess.Popen([sys.executable, '-c', 'import ctypes, time\\nctypes.CDLL(None).prctl(15, b\"\\\\xff\\\\xfe\", 0, 0, 0)"
    "\\ntime.sleep(60)', '{marker}'], start_new_session=True)\n"
    "import time; time.sleep(0.3)"
)

# A child whose main thread ends with the raw exit system call while another thread runs: the
# process shows as a zombie, and its thread appends to a file every 10 ms.
ZOMBIE_LEADER = (
    "import ctypes, os, threading, time\nlibc = ctypes.CDLL(None)\n"
    "if os.fork() == 0:\n"
    "    def spin():\n"
    "        while True:\n"
    "            with open('/tmp/spin', 'a') as f: f.write('x')\n"
    "            time.sleep(0.01)\n"
    "    threading.Thread(target=spin).start()\n"
    "    time.sleep(0.05)\n"
    "    libc.syscall(60, 0)  # SYS_exit (x86-64) of the main thread only; aarch64: 93\n"
    "time.sleep(0.2)\nprint('parent')"
)


def grows(path: str) -> str:
    """A cell printing how much `path` grows while it runs (0: nothing writes to it)."""
    return (
        f"import os, time\nsize = lambda: os.path.getsize({path!r}) if os.path.exists({path!r}) else 0\n"
        "a = size()\ntime.sleep(0.3)\nprint(size() - a)"
    )


def zombie_leader() -> str:
    """ZOMBIE_LEADER with this architecture's number of the exit system call."""
    return ZOMBIE_LEADER.replace("syscall(60,", "syscall(93,") if os.uname().machine == "aarch64" else ZOMBIE_LEADER


# The cell patches the runner so that, right after sending each reply, the session forks a child
# that appends the wall-clock time to a file every 5 ms. 150 MB of ballast make each fork take
# milliseconds, so the worker's stop lands while it is under way (a worker that looked for
# leftovers, then sent SIGSTOP, would miss a child whose fork was in flight). Whatever the
# patched runner does after its reply goes on when the session resumes, in the next cell; only
# the gap between cells must be quiet.
FORK_AFTER_REPLY = (
    "import os, sys, time\nballast = bytearray(150 << 20)\nc = sys.modules['_cells']\nreal = c.send\n"
    "def send(*a, **k):\n"
    "    with open('/tmp/replied', 'w') as f: f.write(repr(time.time()))\n"
    "    real(*a, **k)\n"
    "    if os.fork() == 0:\n"
    "        while True:\n"
    "            with open('/tmp/hop', 'a') as f: f.write(repr(time.time()) + ' ')\n"
    "            time.sleep(0.005)\n"
    "c.send = send"
)


def wrote_between_cells(until: float) -> str:
    """A cell, run after FORK_AFTER_REPLY and a pause: how often a child wrote between the previous
    reply (plus 0.2 s for the worker to stop the session) and `until`, the host's wall-clock time
    just before it sent this cell."""
    return (
        "import os\nreplied = float(open('/tmp/replied').read())\n"
        "times = [float(t) for t in open('/tmp/hop').read().split()] if os.path.exists('/tmp/hop') else []\n"
        f"print(sum(replied + 0.2 < t < {until!r} for t in times))"
    )


# The runner lives in the session's interpreter: this makes later cells report exit code 0.
PATCHED_RUNNER = "import sys\nc = sys.modules['_cells']\nreal = c.run_cell\nc.run_cell = lambda *a: real(*a) and 0"
# Exception class names whose length the code chooses (old limits: 200 characters, a 4 KiB reply).
LONG_NAMES = {"300 chars": "'E' * 300", "4 KiB escaped": "'\\u00e9' * 700"}

TIMERS = {
    "setitimer": "import signal\nsignal.signal(signal.SIGALRM, lambda *a: print('late', flush=True))\n"
    "signal.setitimer(signal.ITIMER_REAL, 0.1, 0.05)",
    "alarm, default action": "import signal\nsignal.alarm(1)",  # would end the next cell (docker)
    "posix timer": (
        "import ctypes, signal\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "class Ev(ctypes.Structure):\n"
        "    _fields_ = [('value', ctypes.c_void_p), ('signo', ctypes.c_int), ('notify', ctypes.c_int),"
        " ('pad', ctypes.c_byte * 48)]\n"
        "class Ts(ctypes.Structure):\n    _fields_ = [('s', ctypes.c_long), ('ns', ctypes.c_long)]\n"
        "class Its(ctypes.Structure):\n    _fields_ = [('interval', Ts), ('value', Ts)]\n"
        "signal.signal(signal.SIGUSR1, lambda *a: print('late', flush=True))\n"
        "timer = ctypes.c_void_p()\n"
        "assert libc.timer_create(1, ctypes.byref(Ev(None, signal.SIGUSR1, 0)), ctypes.byref(timer)) == 0\n"
        "assert libc.timer_settime(timer, 0, ctypes.byref(Its(Ts(0, 50_000_000), Ts(0, 100_000_000))), None) == 0"
    ),
}


# Run inside the sandbox: every file the cell may execute (a non-empty regular file with an exec bit
# it may use, on any mount but its own /tmp and the kernel's; Docker's empty /.dockerenv runs nothing), and which of them are programs: ELF files
# with an interpreter (or static executables) and #! scripts.
LIST_EXECUTABLES = r"""
import hashlib, json, os, stat, struct
def program(head):
    if head[:2] == b'#!':
        return True
    if head[:4] != b'\x7fELF' or head[4] != 2 or head[5] != 1:  # 64-bit little-endian only
        return head[:4] == b'\x7fELF'
    e_type, = struct.unpack_from('<H', head, 16)
    phoff, = struct.unpack_from('<Q', head, 32)
    phentsize, phnum = struct.unpack_from('<HH', head, 54)
    if e_type == 2:
        return True
    return any(struct.unpack_from('<I', head, phoff + i * phentsize)[0] == 3 for i in range(phnum)
               if phoff + i * phentsize + 4 <= len(head))
found, programs = [], []
for top, dirs, files in os.walk('/'):
    if top in ('/proc', '/sys', '/dev', '/tmp'):
        dirs[:] = []
        continue
    for name in files:
        path = os.path.join(top, name)
        try:
            st = os.stat(path)
            if not stat.S_ISREG(st.st_mode) or not st.st_size or not os.access(path, os.X_OK):
                continue
            with open(path, 'rb') as f:
                head = f.read(4096)
        except OSError:
            continue
        found.append(path)
        if program(head):
            programs.append(path)
print(json.dumps({'count': len(found), 'sha': hashlib.sha256('\n'.join(sorted(found)).encode()).hexdigest(),
                  'programs': sorted(programs)}))
"""


async def between_cells(sb, listing: bool = True) -> dict:
    """Run the attacks on a started sandbox (for the probes that run it as another user or in
    another mount namespace); returns what was observed, for `failures`."""
    out: dict = {}
    async with sb.session() as a, sb.session() as b:
        await a.run("state = 1")
        await b.run("mine = 2")

        async def later(coro):
            await asyncio.sleep(0.2)
            return await coro

        rb, ra = await asyncio.gather(b.run("import time; time.sleep(1.0); print(mine)"), later(a.run(RENAMED_CHILD)))
        out["odd_names"] = [ra.status.value, ra.error, rb.status.value, rb.stdout, (await a.run("print(state)")).stdout]
    async with sb.session() as s:
        r = await s.run(zombie_leader())
        await asyncio.sleep(0.3)
        out["zombie_leader"] = [r.status.value, r.error, (await s.run(grows("/tmp/spin"))).stdout]
    async with sb.session() as s:
        await s.run(FORK_AFTER_REPLY)
        await asyncio.sleep(0.6)
        first = await s.run(wrote_between_cells(time.time()))
        await asyncio.sleep(0.6)
        second = await s.run(wrote_between_cells(time.time()))
        out["fork_after_reply"] = [r.stdout or f"{r.status.value}: {r.stderr[-300:]}" for r in (first, second)]

    async def timer(code: str) -> str:
        async with sb.session() as s:
            await s.run(code)
            return (await s.run("import time; time.sleep(1.2); print('mine')")).stdout

    out["timers"] = dict(zip(TIMERS, await asyncio.gather(*map(timer, TIMERS.values()))))
    for kind, name in LONG_NAMES.items():
        r = await sb.run(f"raise type({name}, (Exception,), {{}})()")
        out.setdefault("long_names", {})[kind] = [r.status.value, r.exit_code, r.error]
    r = await sb.run("raise MemoryError")
    out["memory_error"] = [r.status.value, r.exit_code]
    if listing:
        r = await sb.run(LIST_EXECUTABLES)
        out["executables"] = json.loads(r.stdout) if r.status.value == "ok" else r.stderr
    return out


def failures(out: dict) -> list[str]:
    """What `between_cells` saw that must not happen (empty: every attack failed)."""
    bad = []
    status, note, other_status, other_out, state = out["odd_names"]
    if status != "ok" or "killed" not in note or (other_status, other_out, state) != ("ok", "2\n", "1\n"):
        bad.append(f"odd process names: {out['odd_names']}")
    status, note, grown = out["zombie_leader"]
    if status != "ok" or "1 process(es)" not in note or grown != "0\n":
        bad.append(f"a zombie leader's thread ran on: {out['zombie_leader']}")
    if out["fork_after_reply"] != ["0\n", "0\n"]:
        bad.append(f"a child forked after the reply ran on: {out['fork_after_reply']}")
    if out["timers"] != dict.fromkeys(TIMERS, "mine\n"):
        bad.append(f"a timer fired into the next cell: {out['timers']}")
    for kind, (status, code, error) in out["long_names"].items():
        if status != "error" or code != 1 or "control channel" in error:
            bad.append(f"a long exception name ({kind}) was not the code's error: {error}")
    if out["memory_error"] != ["error", 1]:
        bad.append(f"a MemoryError the code raised became {out['memory_error']}")
    return bad


# Clear the parent-death signal (prctl 1), make itself dumpable (prctl 4), lower its OOM score;
# prints what worked: "-1 -1 OSError 1000" when the worker's hold stands.
LOOSEN_HOLD = """import ctypes
libc = ctypes.CDLL(None, use_errno=True)
pdeath = libc.prctl(1, 0, 0, 0, 0)
dumpable = libc.prctl(4, 1, 0, 0, 0)
try:
    open('/proc/self/oom_score_adj', 'w').write('0')
    oom = 'lowered'
except OSError as e:
    oom = type(e).__name__
print(pdeath, dumpable, oom, open('/proc/self/oom_score_adj').read().strip())
"""

# Memory no process owns, kept after the cell ends, asked for in pieces that each fit the
# per-process limits (RLIMIT_AS for a mapping, RLIMIT_FSIZE for a file): 24 SysV segments of 32 MB,
# each attached, filled and detached; 24 memfds of 16 MB written through write() (never mapped);
# a POSIX shm file. Prints the MB held of each kind.
SHARED_MEMORY = """import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
libc.shmdt.argtypes = [ctypes.c_void_p]
held = {'sysv': 0, 'memfd': 0, 'posix': 0}
for _ in range(24):
    shm = libc.shmget(0, 32 << 20, 0o1600)
    if shm < 0:
        break
    addr = libc.shmat(shm, None, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        break
    ctypes.memset(addr, 1, 32 << 20)
    libc.shmdt(addr)
    held['sysv'] += 32
chunk = b'x' * (1 << 20)
keep = []
for _ in range(24):
    try:
        fd = os.memfd_create('hold')
    except OSError:
        break
    keep.append(fd)
    try:
        for _ in range(16):
            os.write(fd, chunk)
            held['memfd'] += 1
    except OSError:
        pass
try:
    with open('/dev/shm/hold', 'wb') as f:
        for _ in range(512):
            f.write(chunk)
            held['posix'] += 1
except OSError:
    pass
print(held)
"""


def meminfo_kb(key: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


# Leaves `n` sleeping processes behind at every cell (the worker kills them when it parks it)
NOISY = "import os, time\nfor _ in range({n}):\n    if os.fork() == 0:\n        time.sleep(60)\n        os._exit(0)\n"


async def victim_under_neighbours(sandbox, runs: int, neighbours: int = 4, leftovers: int = 24) -> list:
    """`runs` cells of 0.7 s under a 1 s limit in one session while `neighbours` sessions each
    leave `leftovers` processes per cell, as fast as they can."""
    stop = asyncio.Event()

    async def noisy() -> None:
        async with sandbox.session() as s:
            while not stop.is_set():
                await s.run(NOISY.format(n=leftovers))

    async def victim() -> list:
        out = []
        async with sandbox.session() as s:
            await s.run("import time")
            for _ in range(runs):
                t = time.monotonic()
                r = await s.run("import time; time.sleep(0.7)", timeout=1.0)
                out.append((r.status.value, time.monotonic() - t, r.error))
        return out

    tasks = [asyncio.ensure_future(noisy()) for _ in range(neighbours)]
    await asyncio.sleep(1.0)  # the neighbours are under way
    try:
        return await victim()
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
