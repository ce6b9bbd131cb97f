"""Fuzzing every parser of what a session can write: /proc and cgroup files (whose process names,
and with them parts of status and stat, are the code's to choose) and the frames on its control
channel. None may raise on any input; where the kernel's layout is kept, the answer is right
whatever the name holds."""

from __future__ import annotations

import json
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandbox.local import _procfs
from sandbox.local._client import _is_reply
from sandbox.local._proto import HDR, Frames

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# What PR_SET_NAME accepts: up to 15 bytes, anything but NUL (the kernel cuts at the first NUL).
NAMES = st.binary(min_size=0, max_size=15).map(lambda b: b.replace(b"\0", b""))
BYTES = st.binary(max_size=4096)
# Arbitrary bytes biased towards the separators the parsers split on.
TEXTY = st.lists(
    st.sampled_from([b"Name:", b"Uid:", b"Tgid:", b"\t", b"\n", b" ", b")", b"(", b" - ", b"ID:", b"\\040", b"\xff"])
    | st.binary(max_size=8),
    max_size=200,
).map(b"".join)


def status_file(name: bytes, uid: int, tgid: int) -> bytes:
    """/proc/<pid>/status as the kernel writes it: the name escaped (newline, backslash)."""
    escaped = name.replace(b"\\", b"\\\\").replace(b"\n", b"\\n")
    return (
        b"Name:\t"
        + escaped
        + b"\nUmask:\t0022\nState:\tS (sleeping)\n"
        + f"Tgid:\t{tgid}\nNgid:\t0\nPid:\t{tgid}\nPPid:\t1\nTracerPid:\t0\n".encode()
        + f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t0\t0\t0\t0\n".encode()
    )


@FUZZ
@given(name=NAMES, uid=st.integers(0, 2**32 - 2), tgid=st.integers(1, 2**22))
def test_status_fields_are_right_whatever_the_name(name, uid, tgid):
    status = status_file(name, uid, tgid)
    assert _procfs.status_uid(status) == uid
    assert _procfs.status_tgid(status) == tgid


@FUZZ
@given(name=NAMES, state=st.sampled_from(list(b"RSDTtZXI")))
def test_stat_state_is_right_whatever_the_name(name, state):
    stat = b"4242 (" + name + b") " + bytes([state]) + b" 1 4242 4242 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0"
    assert _procfs.stat_state(stat) == bytes([state])


@FUZZ
@given(data=BYTES | TEXTY)
def test_no_parser_raises_on_any_bytes(data):
    assert _procfs.status_uid(data) is None or isinstance(_procfs.status_uid(data), int)
    assert _procfs.status_tgid(data) is None or isinstance(_procfs.status_tgid(data), int)
    assert _procfs.status_field(data, b"Uid") is None or isinstance(_procfs.status_field(data, b"Uid"), bytes)
    state = _procfs.stat_state(data)
    assert state is None or (len(state) == 1 and state.isalpha())
    assert all(isinstance(x, int) for x in _procfs.int_list(data))
    assert all(isinstance(x, int) for x in _procfs.sysvipc_ids(data))
    assert all(isinstance(x, int) for x in _procfs.timer_ids(data))
    assert _procfs.keyed_counter(data, b"oom_kill") is None or isinstance(_procfs.keyed_counter(data, b"oom_kill"), int)
    assert isinstance(_procfs.freezer_state(data), bytes)
    assert isinstance(_procfs.mount_point(data), str)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in _procfs.cgroup_mounts(data).items())
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in _procfs.cgroup_paths(data).items())
    assert all(isinstance(p, str) for p, _ in _procfs.mount_points(data))


@settings(max_examples=50, deadline=None)
@given(listing=st.lists(st.text(max_size=6) | st.integers(0, 10**6).map(str), max_size=10))
def test_directory_listings_keep_only_pids(listing):
    got = _procfs.pids(listing)
    assert got == [int(n) for n in listing if n.isascii() and n.isdigit()]


@FUZZ
@given(path=st.binary(min_size=1, max_size=40).map(lambda b: b"/" + b.replace(b"\0", b"")))
def test_mount_points_round_trip_the_kernels_escapes(path):
    escaped = b"".join(b"\\%03o" % c if c in b" \t\n\\" else bytes([c]) for c in path)
    line = b"36 35 0:31 / " + escaped + b" rw,nosuid - cgroup cgroup rw,memory,pids\n"
    assert _procfs.mount_point(escaped) == os.fsdecode(path)
    mounts = _procfs.cgroup_mounts(line)
    assert mounts["memory"] == mounts["pids"] == os.fsdecode(path), mounts


@FUZZ
@given(chunks=st.lists(BYTES | TEXTY, max_size=8))
def test_the_hosts_frame_parser_takes_any_bytes(chunks):
    frames = Frames(limit=4096)
    try:
        for chunk in chunks:
            for header, payload in frames.feed(chunk):
                assert isinstance(header, dict) and isinstance(payload, bytes)
    except ValueError:
        pass  # the one verdict for bytes that are not frames: tampering


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 300) | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=100, deadline=None)
@given(obj=st.dictionaries(st.sampled_from(["op", "cell", "exit_code", "exc"]) | st.text(max_size=4), JSON, max_size=5))
def test_reply_validation_takes_any_header(obj):
    frame = json.dumps(obj).encode()
    parsed = Frames(limit=1 << 20).feed(HDR.pack(len(frame), 0) + frame)[0][0]
    ok = _is_reply(parsed, 3)
    assert ok == (
        set(obj) == {"op", "cell", "exit_code"}
        and obj["op"] == "done"
        and type(obj["cell"]) is int
        and obj["cell"] == 3
        and type(obj["exit_code"]) is int
        and 0 <= obj["exit_code"] <= 255
    )


def test_the_real_files_of_this_process_parse():
    proc = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
    try:
        me = os.getpid()
        status = _procfs.read_at(proc, f"{me}/status")
        assert _procfs.status_uid(status) == os.getuid() and _procfs.status_tgid(status) == me
        states = _procfs.task_states(proc, me)
        assert me in states and _procfs.live(states)
        assert _procfs.read_at(proc, "no-such-entry") is None and _procfs.task_states(proc, 2**30) == {}
    finally:
        os.close(proc)
    with open("/proc/self/mountinfo", "rb") as f:
        assert any(p == "/" for p, _ in _procfs.mount_points(f.read()))
