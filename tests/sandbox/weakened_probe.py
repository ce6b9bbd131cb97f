"""Run as root: change what the local sandbox finds in a private mount namespace (the host's
mounts are untouched), start it, and print what happened as one JSON object (read by
test_sandbox_weakened.py).

    weakened_probe.py hide-all       no cgroup hierarchies and no libseccomp: with and without the
                                     allow_* keys; the attacks of attacks.py on the result (stop loop)
    weakened_probe.py v2-freezer     the v1 freezer hierarchy unmounted: sessions are stopped with
                                     cgroup v2's cgroup.freeze (hybrid hosts); the same attacks
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import json
import sys

import attacks  # next to this script (sys.path[0])

from sandbox import Limits, SandboxConfig, SandboxError, make_sandbox

MS_BIND, MS_REC, MS_PRIVATE, CLONE_NEWNS, MNT_DETACH = 4096, 16384, 1 << 18, 0x00020000, 2
LIMITS = Limits(wall_time_s=3.0, memory_mb=256, max_output_bytes=4096, disk_mb=16, max_processes=16)


def private_mounts(libc: ctypes.CDLL) -> None:
    assert libc.unshare(CLONE_NEWNS) == 0, ctypes.get_errno()
    assert libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) == 0


def hide_all(libc: ctypes.CDLL) -> None:
    assert libc.mount(b"tmpfs", b"/sys/fs/cgroup", b"tmpfs", 0, b"size=64k") == 0  # no hierarchies left
    ctypes.CDLL(ctypes.util.find_library("seccomp") or "libseccomp.so.2")
    with open("/proc/self/maps") as f:
        path = next(line.split()[-1] for line in f if "libseccomp" in line)
    assert libc.mount(b"/dev/null", path.encode(), None, MS_BIND, None) == 0  # loads as an empty file


async def attempt(run_attacks: bool = False, **keys) -> dict:
    try:
        async with make_sandbox(SandboxConfig(limits=LIMITS, workers=2, preload=[], **keys)) as sb:
            r = await sb.run("b = bytearray(400 << 20)")
            out = {"info": sb.info, "memory": [r.status.value, r.stderr]}
            if run_attacks:
                out["attacks"] = attacks.failures(await attacks.between_cells(sb, listing=False))
            return out
    except SandboxError as e:
        return {"error": str(e)}


async def main(mode: str) -> dict:
    if mode == "hide-all":
        return {
            "no_seccomp_allowed": await attempt(allow_no_seccomp=True),
            "no_cgroups_only": await attempt(allow_no_cgroups=True),
            "both_allowed": await attempt(True, allow_no_cgroups=True, allow_no_seccomp=True),
        }
    return {"v2_freezer": await attempt(True)}


if __name__ == "__main__":
    libc = ctypes.CDLL(None, use_errno=True)
    private_mounts(libc)
    mode = sys.argv[1]
    if mode == "hide-all":
        hide_all(libc)
    else:  # a hybrid host without a v1 freezer: the worker freezes in the cgroup v2 tree
        assert libc.umount2(b"/sys/fs/cgroup/freezer", MNT_DETACH) == 0, ctypes.get_errno()
    print(json.dumps(asyncio.run(main(mode))))
    sys.stdout.flush()
