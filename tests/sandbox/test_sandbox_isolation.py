"""Local backend: how the read-only root and the raw system calls are built (root mode)."""

from __future__ import annotations

import ast
import ctypes
import os
import re
import sys
import tempfile
from pathlib import Path

import pytest

from sandbox.local import _isolation

pytestmark = pytest.mark.xdist_group("sandbox-local")
SANDBOX = Path(_isolation.__file__).resolve().parent


def test_every_raw_syscall_has_a_number_on_every_supported_architecture():
    used = set()
    for path in SANDBOX.rglob("*.py"):
        text = path.read_text()
        used |= set(re.findall(r"_syscall\(\s*\"(\w+)\"", text))
        # a raw call must go through _syscall(), which picks the number for this architecture
        assert path.name == "_isolation.py" or "libc.syscall(" not in text, path
    assert {"pivot_root", "mount_setattr"} <= used
    for arch, table in _isolation.SYSCALLS.items():
        assert used <= set(table), (arch, used - set(table))
    assert {"x86_64", "aarch64"} <= set(_isolation.SYSCALLS)
    assert "os.chroot(" not in (SANDBOX / "_isolation.py").read_text()  # no fallback that keeps host mounts


def test_an_unknown_architecture_is_a_clear_error(monkeypatch):
    fake = os.uname_result(os.uname()[:4] + ("riscv64",))
    monkeypatch.setattr(_isolation.os, "uname", lambda: fake)
    with pytest.raises(OSError, match="riscv64.*SYSCALLS.*docker"):
        _isolation._syscall("pivot_root", b".", b".")


def test_host_mounts_do_not_reach_the_code_and_the_root_is_read_only(make_box):
    if os.geteuid() != 0:
        pytest.skip("mounting the test's submount needs root")
    # a writable mount below the interpreter's directory (like a volume under the venv in a container)
    point = tempfile.mkdtemp(prefix="stare-submount-", dir=os.path.realpath(sys.prefix))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"tmpfs", point.encode(), b"tmpfs", 0, b"size=1m") != 0:
        os.rmdir(point)
        pytest.skip(f"cannot mount a tmpfs here: {os.strerror(ctypes.get_errno())}")
    try:
        box = make_box("local")
        try:
            r = box.run(
                f"import os\nprint(os.path.exists({point!r}))\n"
                "print(sorted((l.split()[4], 'ro' in l.split()[5].split(',')) for l in open('/proc/self/mountinfo')))"
            )
        finally:
            box.close()
        exists, mounts = r.stdout.split("\n")[:2]
        assert exists == "False", r  # the root is the sandbox's own tree, not the host's directories
        writable = {point for point, ro in ast.literal_eval(mounts) if not ro}
        devices = {f"/dev/{name}" for name in ("null", "zero", "full", "random", "urandom")}
        assert writable <= {"/tmp", "/dev/shm", "/proc"} | devices, writable
    finally:
        libc.umount2(point.encode(), 2)
        os.rmdir(point)
