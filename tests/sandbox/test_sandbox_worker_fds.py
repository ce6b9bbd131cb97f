"""The local worker's descriptors under many sessions: the guard gives every freed uid back however
the worker's words arrive, and a worker holding more descriptors than a session may open still
starts sessions.

The worker sends the guard `take:UID ` with a copy of the uid's lock fd (SCM_RIGHTS) for each session
it starts and `free:UID ` when the session is gone. On a stream socket a burst of frees arrives in
whatever chunks the kernel hands out; a line cut at a chunk boundary was once dropped, so the guard
kept that uid's lock for good: under load the worker's uid pool leaked, and once a session process
inherited 1024 descriptors every new session failed with "Too many open files" (a make-train run's
later evaluations lost 7-26 of 512 samples that way). Deterministic: no sessions, no timing bound
that load could break; the guard's loop runs in a thread of the test.
"""

from __future__ import annotations

import fcntl
import os
import socket
import threading
import time

import pytest

from sandbox.local._cgroups import _guard_loop
from sandbox.local._uids import UidPool


def _locked_by_someone(pool_dir: str, uid: int) -> bool:
    fd = os.open(os.path.join(pool_dir, str(uid)), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def test_a_burst_of_frees_gives_every_uid_back(tmp_path):
    pool_dir = str(tmp_path / "uids")
    pool = UidPool(pool_dir)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    guard = threading.Thread(target=_guard_loop, args=(theirs, []), daemon=True)
    guard.start()
    uids = []
    for _ in range(300):  # the worker takes 300 uids and hands the guard a copy of each lock
        uid, fd = pool.take()
        socket.send_fds(ours, [f"take:{uid} ".encode()], [fd])
        os.close(fd)  # the worker's own copy goes when the session ends; the guard's must follow
        uids.append(uid)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not all(_locked_by_someone(pool_dir, u) for u in uids):
        time.sleep(0.05)
    assert all(_locked_by_someone(pool_dir, u) for u in uids)  # the guard holds every lock
    # The frees of 300 sessions that ended while the guard was busy: one stream of bytes, which the
    # guard reads in chunks whose boundaries fall inside lines.
    ours.sendall("".join(f"free:{uid} " for uid in uids).encode())
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(_locked_by_someone(pool_dir, u) for u in uids):
        time.sleep(0.05)
    still = [u for u in uids if _locked_by_someone(pool_dir, u)]
    ours.close()  # the worker is gone: the guard ends
    guard.join(timeout=10)
    pool.close()
    assert not still, f"{len(still)} of 300 freed uids are still held by the guard: {still[:5]}"


def test_a_take_split_across_reads_still_pairs_its_lock(tmp_path):
    """A `take:` line cut by a chunk boundary: its lock fd arrives with the first part, the uid with
    the second; the guard must still hold that lock (and give it back on `free:`)."""
    pool_dir = str(tmp_path / "uids")
    pool = UidPool(pool_dir)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    guard = threading.Thread(target=_guard_loop, args=(theirs, []), daemon=True)
    guard.start()
    uid, fd = pool.take()
    text = f"take:{uid} ".encode()
    socket.send_fds(ours, [text[:7]], [fd])
    os.close(fd)
    time.sleep(0.2)  # the guard reads the first part alone
    ours.sendall(text[7:])
    time.sleep(0.2)
    assert _locked_by_someone(pool_dir, uid)  # held by the guard: a session may still have a process
    ours.sendall(f"free:{uid} ".encode())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _locked_by_someone(pool_dir, uid):
        time.sleep(0.05)
    assert not _locked_by_someone(pool_dir, uid)
    ours.close()
    guard.join(timeout=10)
    pool.close()


@pytest.mark.xdist_group("sandbox-local")
def test_one_worker_serves_more_live_sessions_than_a_session_may_open_files(make_box):
    """A worker holds a few descriptors per live session (cgroups, control socket, uid lock); past
    ~150 sessions that is more than a session process may open (RLIMIT_NOFILE 1024). A session
    process used to lower that limit before closing the worker's descriptors, so opening /dev/null
    failed and every session started then died (an evaluation of 512 problems at concurrency 256
    lost up to 26 samples that way). 300 sessions live at once on one worker (~1500 of its descriptors;
    on the old code sessions past ~200 failed): each runs its cell."""
    box = make_box("local", workers=1)
    try:

        async def many() -> list[str]:
            sessions = [box.sandbox.session() for _ in range(300)]
            opened = [await s.__aenter__() for s in sessions]
            try:
                results = [await s.run("x = 1\nprint(x)") for s in opened]
                return [r.status + ":" + (r.error or "") for r in results]
            finally:
                for s in sessions:
                    await s.__aexit__(None, None, None)

        statuses = box._call(many())
    finally:
        box.close()
    failed = [s for s in statuses if not s.startswith("ok")]
    assert not failed, f"{len(failed)} of 300 sessions failed, e.g. {failed[:2]}"
