"""A cell finds the same programs on every backend: what it can execute locally is exactly what it
can execute in Docker (the same root file system, sandbox/local/_rootfs.py), and none of the host's
compilers, network tools or container CLI is among them."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from sandbox import Limits
from sandbox.docker.build import SHELL_UTILS

pytestmark = pytest.mark.xdist_group("sandbox-parity")
_spec = importlib.util.spec_from_file_location("sandbox_attacks", Path(__file__).with_name("attacks.py"))
attacks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(attacks)

HOST_ONLY = ("gcc", "cc", "curl", "wget", "git", "docker", "apt", "ssh", "perl", "java", "node", "make", "su", "sudo")


def executables(box) -> dict:
    r = box.run(attacks.LIST_EXECUTABLES)
    assert r.status == "ok", r
    return json.loads(r.stdout)


def allowed(path: str) -> bool:
    """A program a cell may find: the shell utilities, the interpreter (and links to it), files of
    the Python installation (stdlib modules with a #! line, the scripts of the preloaded packages),
    or a shared library that is also executable (libc)."""
    python = (sys.prefix + "/", sys.base_prefix + "/", os.path.realpath(sys.base_prefix) + "/")
    return (
        path in {f"/usr/bin/{u}" for u in SHELL_UTILS}
        or path in ("/usr/local/bin/python", "/usr/local/bin/python3")
        or path.startswith(python)
        or ".so" in os.path.basename(path)
    )


@pytest.fixture(scope="module")
def local_list(make_box) -> dict:
    box = make_box("local", limits=_limits())
    try:
        return executables(box)
    finally:
        box.close()


def _limits() -> Limits:
    return Limits(wall_time_s=30.0, memory_mb=256, max_output_bytes=1 << 16, disk_mb=16, max_processes=32)


def test_a_local_cell_can_run_only_the_allow_listed_programs(local_list):
    programs = local_list["programs"]
    assert {f"/usr/bin/{u}" for u in SHELL_UTILS} <= set(programs), programs
    assert [p for p in programs if not allowed(p)] == []
    names = {os.path.basename(p) for p in programs}
    assert not names & set(HOST_ONLY), names & set(HOST_ONLY)
    assert local_list["count"] < 400, local_list["count"]  # the host has thousands


@pytest.mark.docker
def test_docker_and_local_cells_can_run_exactly_the_same_files(local_list, make_box):
    box = make_box("docker", limits=_limits())
    try:
        docker_list = executables(box)
    finally:
        box.close()
    assert docker_list["programs"] == local_list["programs"]
    assert (docker_list["count"], docker_list["sha"]) == (local_list["count"], local_list["sha"])
