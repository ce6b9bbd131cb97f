"""The local sandbox without root: user namespaces instead of root, rlimits instead of cgroups.

rootless_probe.py runs the sandbox (host side and worker) in a user namespace in which it is uid
1000, so the worker takes the rootless path whatever user runs the tests. Not covered here: the
fork-bomb limit. Rootless, it is RLIMIT_NPROC per session, which the kernel does not apply to a
process whose real uid is host root, as it is in CI (the namespace maps uid 1000 onto it).
"""
from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.xdist_group("sandbox-rootless")

ROOT = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).resolve().parent / "rootless_probe.py"
AS_USER = ["unshare", "--user", "--map-user=1000", "--map-group=1000"]


@pytest.fixture(scope="module")
def seen() -> dict:
    if shutil.which("unshare") is None or subprocess.run([*AS_USER, "true"], capture_output=True).returncode != 0:
        pytest.skip("no unprivileged user namespaces here (unshare --user failed)")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([*AS_USER, sys.executable, str(PROBE)], cwd="/", env=env, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_worker_took_the_rootless_path(seen):
    assert seen["euid"] == 1000
    assert seen["info"]["rootless"] is True and seen["info"]["cgroups"] is False, seen["info"]
    assert seen["info"]["seccomp"] is True


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
    assert seen["tmp_other"] == "[]\n"  # neither the host's /tmp nor the other session's file


def test_network_root_memory_and_privileges_are_closed(seen):
    assert seen["network"][0] == "error" and "Errno 97" in seen["network"][1], seen["network"]
    assert "Read-only file system" in seen["write_usr"]
    assert seen["memory"] == "oom"
    assert seen["setuid"].startswith("OSError")
    assert seen["unshare"] == "-1 1\n"  # no new user namespace from inside (EPERM)
    assert seen["sympy"] == "{2: 3, 3: 2, 5: 1}\n"  # preloaded libraries still work
