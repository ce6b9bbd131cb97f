"""The local sandbox without root: user namespaces instead of root, rlimits instead of cgroups.

rootless_probe.py runs the whole sandbox (host side and worker) as uid 65534, so the worker takes
the rootless path. The project's interpreter may sit where that user cannot read it (a home
directory), so the probe runs on a copy of the base interpreter and its stdlib, which is all the
sandbox needs. Needs root to switch user, and unprivileged user namespaces.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.xdist_group("sandbox-rootless")
_spec = importlib.util.spec_from_file_location("sandbox_attacks", Path(__file__).with_name("attacks.py"))
_attacks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_attacks)

ROOT = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).resolve().parent / "rootless_probe.py"
NOBODY = 65534
MAX_PROCESSES = 32  # rootless_probe.py's limit


def _as_nobody() -> None:
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)


def _readable_by_all(path: Path) -> bool:
    """Every directory above `path` searchable and `path` readable by any user."""
    p = path.resolve()
    return all(os.stat(d).st_mode & 0o001 for d in p.parents) and bool(os.stat(p).st_mode & 0o004)


def _stdlib_python(dest: Path) -> tuple[str, dict]:
    """A copy of the running interpreter with its stdlib (no site-packages), readable by anyone."""
    base = Path(sys.base_prefix)
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    (dest / "bin").mkdir(parents=True)
    exe = dest / "bin" / version
    shutil.copy2(os.path.realpath(sys.executable), exe)
    libdir = Path(sysconfig.get_config_var("LIBDIR") or base / "lib")
    (dest / "lib").mkdir()
    for lib in libdir.glob("libpython3*.so*"):
        shutil.copy2(lib, dest / "lib" / lib.name)
    shutil.copytree(
        base / "lib" / version,
        dest / "lib" / version,
        symlinks=True,
        ignore=shutil.ignore_patterns(
            "site-packages", "test", "__pycache__", "idlelib", "tkinter", "ensurepip", "lib2to3"
        ),
    )
    for d, _dirs, files in os.walk(dest):
        os.chmod(d, 0o755)
        for f in files:
            if not os.path.islink(os.path.join(d, f)):
                os.chmod(os.path.join(d, f), 0o755)
    env = {
        "PATH": "/usr/bin:/bin",
        "LD_LIBRARY_PATH": str(dest / "lib"),
        "PYTHONPATH": str(ROOT),
        "PYTHONHOME": str(dest),
        "OMP_NUM_THREADS": "1",
    }
    return str(exe), env


@pytest.fixture(scope="module")
def seen() -> dict:
    if os.geteuid() != 0:
        pytest.skip(
            "needs root to run the probe as another user (as a non-root user, the local sandbox already runs rootless)"
        )
    if not _readable_by_all(ROOT / "sandbox" / "local" / "__init__.py"):
        pytest.skip(f"the checkout at {ROOT} is not readable by uid {NOBODY}")
    home = Path(tempfile.mkdtemp(prefix="rootless-python-"))  # pytest's own tmp dirs are root-only
    os.chmod(home, 0o755)
    try:
        return _probe(home)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _probe(home: Path) -> dict:
    exe, env = _stdlib_python(home / "python")
    check = subprocess.run(
        [exe, "-c", "import ctypes, asyncio"], env=env, preexec_fn=_as_nobody, capture_output=True, text=True
    )
    assert check.returncode == 0, f"copied interpreter does not start as uid {NOBODY}: {check.stderr}"
    cache = home / "cache"  # the sandbox's root file system tree, removed with `home`
    cache.mkdir()
    os.chown(cache, NOBODY, NOBODY)
    proc = subprocess.run(
        [exe, str(PROBE), str(cache)],
        cwd="/",
        env=env,
        preexec_fn=_as_nobody,
        capture_output=True,
        text=True,
        timeout=240,
    )
    if "user namespaces" in proc.stdout + proc.stderr and proc.returncode != 0:
        pytest.skip("no unprivileged user namespaces here: " + proc.stderr.strip().splitlines()[-1])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_worker_took_the_rootless_path(seen):
    assert seen["euid"] == NOBODY
    assert seen["info"]["rootless"] is True and seen["info"]["cgroups"] is False, seen["info"]
    assert seen["info"]["seccomp"] is True
    weaker = " | ".join(seen["info"]["not_enforced"])  # said at start, not left to be found out
    assert "memory summed" in weaker and "CPU quota" in weaker and "per-session host uid" in weaker, weaker


def test_code_runs_as_pid_1_with_no_capabilities_an_allow_listed_root_and_no_secrets(seen):
    status, stdout = seen["probe"]
    assert status == "ok", seen["probe"]
    head, rest = stdout.split(" ", 1)
    caps, rest = rest.split("] ", 1)
    assert head == "1"
    assert all(v == "0000000000000000" for _, v in ast.literal_eval(caps + "]")), caps
    top, rest = rest.split("] ", 1)
    listing = ast.literal_eval(top + "]")
    assert {"usr", "tmp", "proc", "dev"} <= set(listing) and not {"home", "var", "run", "srv"} & set(listing)
    pids, secret = rest.rsplit(" ", 1)
    assert ast.literal_eval(pids) == ["1"]  # its own pid namespace: no host process is visible
    assert secret.strip() == "None"


def test_sessions_keep_state_time_out_and_do_not_share_tmp(seen):
    assert seen["state"] == ["ok", "42\n"] and seen["write_tmp"] == "ok"
    status, seconds = seen["timeout"]
    assert status == "timeout" and seconds < 5.0
    assert seen["after_timeout"] == "False\n"  # the killed interpreter was replaced
    # Neither the host's /tmp (the probe's marker file) nor the other session's file; only the
    # interpreter's own directory, bound back read-only when it lives under /tmp as here.
    tmp = ast.literal_eval(seen["tmp_other"])
    assert "mine" not in tmp and not any(name.startswith("rootless-probe-") for name in tmp), tmp


def test_network_root_memory_and_privileges_are_closed(seen):
    assert seen["network"][0] == "error" and "Errno 97" in seen["network"][1], seen["network"]
    assert "Read-only file system" in seen["write_usr"]
    status, stderr = seen["memory"]  # RLIMIT_AS: the allocation fails; no kernel OOM kill to see
    assert status == "error" and "MemoryError" in stderr, seen["memory"]
    assert seen["setuid"].startswith("OSError")
    assert seen["unshare"] == "-1 1\n"  # no new user namespace from inside (EPERM)
    assert seen["stdlib"] == "3/2\n"


def test_each_session_has_its_own_process_limit(seen):
    # Both bombs ran at once; each stopped at its own limit (the session itself is one process).
    assert seen["bombs"] == [["ok", str(MAX_PROCESSES - 1)]] * 2, seen["bombs"]
    assert seen["after_bombs"] == "ok\n"


def test_between_cells_and_tampering_rootless(seen):
    status, note = seen["leftover_process"]
    assert status == "ok" and "killed" in note, seen["leftover_process"]
    assert seen["pids_after"] == "['1']\n"  # the forked child did not outlive its cell
    status, note = seen["leftover_thread"]
    assert status == "ok" and "restarted" in note, seen["leftover_thread"]
    assert "control channel" in seen["forged"]


def test_between_cells_attacks_fail_rootless(seen):
    # non-UTF-8 process names, a zombie leader's thread, a child forked after the reply, timers
    # firing into the next cell, long exception names, a MemoryError raised (attacks.py)
    assert _attacks.failures(seen) == []


def test_a_rootless_cell_finds_the_same_programs(seen):
    listing = seen["executables"]
    assert isinstance(listing, dict), listing
    in_usr_bin = {os.path.basename(p) for p in listing["programs"] if p.startswith("/usr/bin/")}
    from sandbox.docker.build import SHELL_UTILS

    assert in_usr_bin == set(SHELL_UTILS), in_usr_bin ^ set(SHELL_UTILS)
    assert listing["count"] < 400, listing["count"]


def test_a_rootless_cell_cannot_loosen_its_workers_hold(seen):
    assert seen["loosen"] == "-1 -1 OSError 1000\n", seen["loosen"]  # prctl denied, /proc read-only
    assert seen["worker_oom_score"] == "900"  # the sandbox ranks before the trainer for the OOM killer


def test_rootless_memory_no_process_owns_is_bounded_across_cells(seen):
    status, held, grown_mb = seen["shared_memory"]
    assert status == "ok", seen["shared_memory"]
    assert held.startswith("{'sysv': 0, 'memfd': 0,"), held  # denied rootless; /dev/shm is /tmp (disk_mb)
    assert grown_mb <= 2 * 128, f"the idle session holds {grown_mb} MB of shared memory under a 128 MB limit"


def test_no_rootless_cell_outlives_its_workers_sigkill(seen):
    status, left, _seconds = seen["worker_death"]
    assert status == "sandbox_error" and left == 0, seen["worker_death"]
    assert seen["after_close"] == 0


def test_rootless_noisy_neighbours_never_time_a_victim_out(seen):
    assert seen["neighbours"] == ["ok"] * 10, seen["neighbours"]
