"""Run as root: hide the cgroup hierarchies and libseccomp in a private mount namespace, then
start the local sandbox with and without the allow_* keys; print what happened as one JSON
object (read by test_sandbox_weakened.py). The host's mounts are untouched (private namespace)."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import json
import sys

from sandbox import Limits, SandboxConfig, SandboxError, make_sandbox

MS_BIND, MS_REC, MS_PRIVATE, CLONE_NEWNS = 4096, 16384, 1 << 18, 0x00020000


def hide(libc: ctypes.CDLL) -> None:
    assert libc.unshare(CLONE_NEWNS) == 0, ctypes.get_errno()
    assert libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) == 0
    assert libc.mount(b"tmpfs", b"/sys/fs/cgroup", b"tmpfs", 0, b"size=64k") == 0  # no hierarchies left
    ctypes.CDLL(ctypes.util.find_library("seccomp") or "libseccomp.so.2")
    with open("/proc/self/maps") as f:
        path = next(line.split()[-1] for line in f if "libseccomp" in line)
    assert libc.mount(b"/dev/null", path.encode(), None, MS_BIND, None) == 0  # loads as an empty file


async def attempt(**keys) -> dict:
    limits = Limits(wall_time_s=3.0, memory_mb=128, max_output_bytes=4096, disk_mb=16, max_processes=16)
    try:
        async with make_sandbox(SandboxConfig(limits=limits, workers=1, preload=[], **keys)) as sb:
            r = await sb.run("b = bytearray(400 << 20)")
            return {"info": sb.info, "memory": r.status.value}
    except SandboxError as e:
        return {"error": str(e)}


async def main() -> dict:
    return {
        "no_seccomp_allowed": await attempt(allow_no_seccomp=True),
        "no_cgroups_only": await attempt(allow_no_cgroups=True),
        "both_allowed": await attempt(allow_no_cgroups=True, allow_no_seccomp=True),
    }


if __name__ == "__main__":
    hide(ctypes.CDLL(None, use_errno=True))
    print(json.dumps(asyncio.run(main())))
    sys.stdout.flush()
