"""Local-backend specifics: what isolation is in place, seccomp, the queue, worker replacement."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time

import pytest

pytestmark = pytest.mark.xdist_group("sandbox-local")


@pytest.fixture(scope="module")
def sb(make_box):
    box = make_box("local")
    yield box
    box.close()


def test_isolation_is_really_set_up(sb):
    assert sb.sandbox.info["cgroups"] and sb.sandbox.info["seccomp"], sb.sandbox.info
    r = sb.run(
        "import os\nprint(os.getuid(), os.getpid(), open('/proc/self/mountinfo').read().count('\\n'))\n"
        "print([l for l in open('/proc/self/status') if l.startswith('CapEff')][0].split()[1])"
    )
    uid, pid, mounts, caps = r.stdout.split()
    assert r.status == "ok" and int(uid) >= 200_000 and pid == "1" and int(caps, 16) == 0, r
    assert int(mounts) < 30, "the root is an allow-list, not the host's mount table"


def test_seccomp_blocks_user_namespaces_and_ptrace(sb):
    code = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.unshare(0x10000000), ctypes.get_errno() == 1)\n"  # CLONE_NEWUSER -> EPERM
        "print(libc.ptrace(16, 1, 0, 0), ctypes.get_errno() == 1)\n"
    )  # PTRACE_ATTACH -> EPERM
    assert sb.run(code).stdout == "-1 True\n-1 True\n"


def test_bounded_queue_fails_clearly_and_drops_nothing(make_box):
    async def burst(sandbox):
        return await asyncio.gather(*(sandbox.run(f"import time; time.sleep(0.2); print({i})") for i in range(12)))

    box = make_box("local", queue_size=3)
    try:
        results = asyncio.run_coroutine_threadsafe(burst(box.sandbox), box.loop).result()
    finally:
        box.close()
    ok = [i for i, r in enumerate(results) if r.status == "ok"]
    full = [r for r in results if r.status == "sandbox_error"]
    assert len(ok) == 5 and len(full) == 7, [r.status for r in results]  # 2 running + 3 queued
    assert all("queue full" in r.error for r in full)
    assert all(results[i].stdout == f"{i}\n" for i in ok)


def _children(pid: int) -> list[int]:
    """Live processes whose parent is `pid` (zombies, which are dead, excluded)."""
    out = []
    for p in os.listdir("/proc"):
        try:
            with open(f"/proc/{p}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid and fields[0] != b"Z":
            out.append(int(p))
    return out


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        out += kids
        todo += kids
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def test_dead_worker_is_replaced(sb):
    with sb.session() as s:
        assert s.run("v = 1").ok  # the session is now frozen until its next cell
        family = _descendants(sb.sandbox.popen.pid)  # sessions, spares and the cgroup guard
        assert len(family) >= 2, family
        os.kill(sb.sandbox.popen.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while any(map(_alive, family)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(map(_alive, family)), "sessions of a killed worker live on (frozen, holding their SIGKILL)"
        r = s.run("print('v' in dir())")
        assert r.status == "ok" and r.stdout == "False\n" and "worker was lost" in r.error, r  # a new interpreter
    assert sb.run("print(2)").stdout == "2\n"


def test_worker_lost_before_it_resumed_the_session_reruns_the_cell_fresh(sb):
    """The race CI once hit: the worker dies after the host checked the session between cells but
    before the worker resumed it. The cell never started, so it runs on a fresh worker (with the
    note), never returns a sandbox_error for a loss that happened before it."""
    with sb.session() as s:
        assert s.run("v = 1").ok
        worker = sb.sandbox.popen.pid  # root mode (these tests'): the worker itself, no waiter
        os.kill(worker, signal.SIGSTOP)  # it cannot answer "resume" now
        threading.Timer(0.5, os.kill, (worker, signal.SIGKILL)).start()
        r = s.run("print('v' in dir())")
        assert r.status == "ok" and r.stdout == "False\n" and "worker was lost" in r.error, r
        assert s.run("print('next')").stdout == "next\n"


def test_worker_death_unread_by_the_loop_is_still_a_lost_worker(make_box):
    """The race behind a flaky replacement: the worker and its frozen session are dead, but the
    event loop has not yet read the worker's end when the next cell comes. That cell must run in
    a fresh interpreter (with the note), never be blamed on the previous cell."""

    async def scenario(sandbox):
        async with sandbox.session() as s:
            assert (await s.run("v = 1")).ok
            os.kill(sandbox.popen.pid, signal.SIGKILL)
            time.sleep(1.0)  # blocks the loop: the worker's EOF waits unread while the session dies
            return await s.run("print('v' in dir())")

    box = make_box("local")
    try:
        r = asyncio.run_coroutine_threadsafe(scenario(box.sandbox), box.loop).result()
    finally:
        box.close()
    assert r.status == "ok" and r.stdout == "False\n" and "worker was lost" in r.error, r


def test_worker_lost_mid_cell_is_sandbox_error_never_a_code_status(sb, make_box):
    with sb.session() as s:
        assert s.run("pass").ok  # a live worker (an earlier test may have left a dead one to replace)
        threading.Timer(0.5, os.kill, (sb.sandbox.popen.pid, signal.SIGKILL)).start()
        r = s.run("import time; time.sleep(3)")
        assert r.status == "sandbox_error" and "worker" in r.error, r
        assert s.run("print('recovered')").stdout == "recovered\n"
    with pytest.raises(Exception, match="not ready"):
        make_box("local", spawn_timeout_s=0.001)  # a worker that cannot start is an infra error too


def test_network_true_is_announced_as_trusted_code_only(make_box, caplog):
    from sandbox import Limits

    with caplog.at_level(logging.WARNING, logger="sandbox"):
        box = make_box("local", limits=Limits(wall_time_s=5.0, memory_mb=256, network=True))
        try:
            info = box.sandbox.info
        finally:
            box.close()
    assert info["network"] is True and any("trusted code only" in w for w in info["not_enforced"]), info
    assert any("trusted code only" in rec.getMessage() for rec in caplog.records), caplog.text


def test_live_sessions_of_two_sandboxes_never_share_a_uid(sb, make_box):
    other = make_box("local")
    sessions = []
    try:
        for box in (sb, other):
            for _ in range(4):
                s = box.session()
                sessions.append(s.__enter__())
        uids = [int(s.run("import os; print(os.getuid())").stdout) for s in sessions]
        assert len(set(uids)) == len(uids) and min(uids) >= 200_000, uids
        # per-uid kernel accounting: one session taking every inotify instance leaves the others theirs
        hog = sessions[0].run(
            "import ctypes\nlibc = ctypes.CDLL(None)\n"
            "fds = [libc.inotify_init() for _ in range(10000)]\nprint(sum(f >= 0 for f in fds))"
        )
        mine = sessions[-1].run("import ctypes\nprint(ctypes.CDLL(None).inotify_init() >= 0)")
        assert hog.status == "ok" and mine.stdout == "True\n", (hog, mine)
    finally:
        for s in sessions:
            s.__exit__(None, None, None)
        other.close()


def _freezer_groups(worker: int) -> dict[str, tuple[str, int]] | None:
    """{group: (freezer state, tasks)} of a worker's session groups in the cgroup v1 freezer, or
    None where there is no such freezer (cgroup v2 delivers SIGKILL to frozen tasks itself)."""
    from sandbox.local._procfs import cgroup_mounts, cgroup_paths

    with open("/proc/self/mountinfo", "rb") as f:
        mounts = cgroup_mounts(f.read())
    with open("/proc/self/cgroup", "rb") as f:
        own = cgroup_paths(f.read())
    if "freezer" not in mounts or "freezer" not in own:
        return None
    base = os.path.join(mounts["freezer"] + own["freezer"], f"stare-sandbox-{worker}")
    out = {}
    for name in os.listdir(base):
        if name.startswith("s"):
            with open(os.path.join(base, name, "freezer.state")) as f:
                state = f.read().strip()
            with open(os.path.join(base, name, "tasks")) as f:
                out[name] = (state, len(f.read().split()))
    return out


def test_leftovers_die_by_one_hand_over_and_the_session_goes_on(make_box, marker, procs):
    """Cgroup v1 holds a frozen task's SIGKILL until it thaws: a park that finds leftovers moves the
    session's interpreter (frozen) into the session's twin group and thaws the one it left, so the
    leftovers die in one migration whatever their number. The session keeps its state, nothing of
    the cell runs after its park, the twin groups swap at each such park, and the guard kills a
    session living in its twin when the worker dies."""
    box = make_box("local")
    leave = (
        "import os, subprocess, sys\n"
        "for _ in range(12):\n"
        f"    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', '{marker}'])\n"
    )
    try:
        worker = box.sandbox.popen.pid
        if _freezer_groups(worker) is None:
            pytest.skip("no cgroup v1 freezer here")
        with box.session() as s:
            assert s.run("v = 41").ok
            parked = []
            for _ in range(3):
                r = s.run(leave + "v += 1")
                assert r.status == "ok" and "12 process(es)" in r.error, r
                assert not procs.with_marker(marker), "a leftover outlived its cell's park"
                groups = _freezer_groups(worker)
                twins = [g for g in groups if g.endswith("t")]
                assert len(twins) == 1, groups  # only this session ever left processes
                sid = twins[0][:-1]
                home = [g for g in (sid, sid + "t") if groups[g][1]]  # the interpreter alone, frozen
                assert len(home) == 1 and groups[home[0]] == ("FROZEN", 1), groups
                parked.append(home[0])
            assert parked[0] == sid + "t" and parked[1] == sid and parked[2] == sid + "t", parked
            assert s.run("print(v)").stdout == "44\n"  # no leftovers: it stays in its twin
            assert _freezer_groups(worker)[sid + "t"] == ("FROZEN", 1)
            family = _descendants(worker)
            os.kill(worker, signal.SIGKILL)
            deadline = time.monotonic() + 5
            while any(map(_alive, family)) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not any(map(_alive, family)), "a session parked in its twin group outlived its worker"
    finally:
        box.close()
    assert not procs.wait_gone(marker, timeout=2.0)
