"""Docker-backend specifics against a real engine: engine-side limits, safe reuse, replacement."""
from __future__ import annotations

import time

import pytest

from sandbox import DockerConfig, SandboxConfig, SandboxError, SyncSandbox

pytestmark = [pytest.mark.docker, pytest.mark.xdist_group("sandbox-docker")]


def lease_of(session) -> object:
    return session.session.spawn.__self__.container  # the container this session holds


@pytest.fixture(scope="module")
def sb(make_box):
    box = make_box("docker", docker=DockerConfig(warm=1), workers=1)
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
    assert host["CapDrop"] == ["ALL"] and sorted(host["CapAdd"]) == ["SETGID", "SETUID"]
    assert "no-new-privileges" in host["SecurityOpt"] and f"size={lim.disk_mb}m" in host["Tmpfs"]["/tmp"]


def test_reused_container_is_clean(sb, marker, procs):
    with sb.session() as a:
        r = a.run("import subprocess, sys\nsecret = 1\nopen('/tmp/secret', 'w').write('a')\n"
                  f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', '{marker}'], start_new_session=True)")
        assert r.ok, r
        first = lease_of(a).obj.id
    with sb.session() as b:
        r = b.run("import os\nprint('secret' in dir(), os.listdir('/tmp'), os.listdir('/dev/shm'))")
        assert lease_of(b).obj.id == first, "the warm container should have been reused"
        assert r.stdout == "False [] []\n", r
    assert not procs.wait_gone(marker), "the previous session's daemon survived into the reused container"


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
        SyncSandbox(SandboxConfig(backend="docker", docker=DockerConfig(image="stare-sandbox:does-not-exist")))
