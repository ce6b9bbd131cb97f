"""Docker-backend specifics against a real engine: engine-side limits, safe reuse, replacement."""

from __future__ import annotations

import os
import sys
import time

import pytest

from sandbox import DockerConfig, SandboxConfig, SandboxError, SyncSandbox

pytestmark = [pytest.mark.docker, pytest.mark.xdist_group("sandbox-docker")]


def lease_of(session) -> object:
    return session.session.spawn.__self__.container  # the container this session holds


@pytest.fixture(scope="module")
def sb(make_box):
    box = make_box("docker", backends={"docker": DockerConfig(warm=1)}, workers=1)
    yield box
    box.close()


def test_engine_enforces_the_limits(sb):
    with sb.session() as s:
        assert s.run("print(1)").ok
        host = lease_of(s).obj.attrs["HostConfig"]
    lim = sb.sandbox.limits
    assert host["NetworkMode"] == "none" and host["ReadonlyRootfs"] is True
    assert host["Memory"] == (lim.memory_mb + 128) << 20 and host["MemorySwap"] == host["Memory"]
    assert host["PidsLimit"] == lim.max_processes + 8 and host["NanoCpus"] == 10**9
    assert host["CapDrop"] == ["ALL"] and sorted(host["CapAdd"]) == ["KILL", "SETGID", "SETUID"]
    assert "no-new-privileges" in host["SecurityOpt"] and f"size={lim.disk_mb}m" in host["Tmpfs"]["/tmp"]


def test_reused_container_is_clean(sb, marker, procs):
    with sb.session() as a:
        r = a.run(
            "import subprocess, sys\nsecret = 1\nopen('/tmp/secret', 'w').write('a')\n"
            f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', '{marker}'], start_new_session=True)"
        )
        assert r.ok, r
        first = lease_of(a).obj.id
    with sb.session() as b:
        r = b.run("import os\nprint('secret' in dir(), os.listdir('/tmp'), os.listdir('/dev/shm'))")
        assert lease_of(b).obj.id == first, "the warm container should have been reused"
        # nothing of the last session; only the interpreter's own directory where it lives under
        # /tmp (bound read-only into the container, as the local backend binds it)
        hidden = sorted(os.path.relpath(sys.prefix, "/tmp").split("/")[:1]) if sys.prefix.startswith("/tmp/") else []
        assert r.stdout == f"False {hidden} []\n", r
    assert not procs.wait_gone(marker), "the previous session's daemon survived into the reused container"


def test_ipc_objects_do_not_survive_into_the_next_session(sb):
    make = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.shmget(0x5157, 4096, 0o1600) >= 0, libc.msgget(0x5158, 0o1600) >= 0, "
        "libc.semget(0x5159, 1, 0o1600) >= 0)\n"
        "mq = libc.mq_open(b'/stare-q', os.O_CREAT | os.O_RDWR, 0o600, None)\nprint(mq >= 0)"
    )
    look = (
        "import os\nprint([len(open(f'/proc/sysvipc/{k}').readlines()) - 1 for k in ('shm', 'msg', 'sem')], "
        "os.listdir('/dev/mqueue'))"
    )
    with sb.session() as a:
        r = a.run(make)
        assert r.stdout == "True True True\nTrue\n", r
        first = lease_of(a).obj.id
    with sb.session() as b:
        r = b.run(look)
        assert lease_of(b).obj.id == first, "the warm container should have been reused"
        assert r.stdout == "[0, 0, 0] []\n", r


def test_each_container_runs_its_code_as_its_own_host_uid(make_box):
    box = make_box("docker", backends={"docker": DockerConfig(warm=2)}, workers=2)
    try:
        with box.session() as a, box.session() as b:
            uids = [int(s.run("import os; print(os.getuid())").stdout) for s in (a, b)]
        assert uids[0] != uids[1] and min(uids) >= 200_000, uids
    finally:
        box.close()


def test_dead_container_is_replaced(sb):
    with sb.session() as s:
        assert s.run("v = 1").ok
        lease_of(s).obj.kill()
        time.sleep(0.5)
        r = s.run("print('v' in dir())")
        assert r.status == "ok" and r.stdout == "False\n", r
    assert sb.run("print(2)").stdout == "2\n"


def test_missing_image_is_a_clear_infrastructure_error(sb):
    with pytest.raises(SandboxError, match="sandbox.docker.build"):
        SyncSandbox(
            SandboxConfig(backend="docker", backends={"docker": DockerConfig(image="stare-sandbox:does-not-exist")})
        )
