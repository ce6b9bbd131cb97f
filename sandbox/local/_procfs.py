"""Reading /proc and cgroup files as bytes. Stdlib only; runs in the worker.

Much of what these files hold is the code's to choose: a process name (`prctl(PR_SET_NAME)`,
any bytes but NUL, `)` and newlines included in /proc/<pid>/stat), and through it whole lines
of /proc/<pid>/status. So nothing here decodes text or trusts a layout: each parser takes bytes,
never raises on any input (tests/sandbox/test_sandbox_procfs.py feeds them arbitrary bytes), and
answers None / an empty result when it cannot tell. Callers treat "cannot tell" as the safe case.
"""

from __future__ import annotations

import os

DEAD = b"ZX"  # states of a task that will never run again (zombie, dead)
STOPPED = b"Tt"  # stopped by a signal (group stop) or traced


def read_at(dir_fd: int, path: str, limit: int = 1 << 16) -> bytes | None:
    """The first `limit` bytes of a file under `dir_fd`, or None if it cannot be read (e.g. gone)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        chunks, size = [], 0
        while size < limit:
            chunk = os.read(fd, limit - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def _int(field: bytes) -> int | None:
    """A decimal integer (ASCII digits, optional minus sign), else None; never raises."""
    field = field.strip()
    digits = field[1:] if field[:1] == b"-" else field
    if not digits or not digits.isdigit() or len(digits) > 20:
        return None
    return int(field)


def status_field(status: bytes, key: bytes) -> bytes | None:
    """The value of `key` ("Uid", "Tgid", ...) in /proc/<pid>/status, or None. The kernel writes
    its own keys at the start of a line after the name line; a name holding a newline and a fake
    "Uid:" cannot come first, because the kernel escapes newlines in the Name line. Still, only the
    first occurrence of a key counts, and the Name line is skipped outright."""
    prefix = key + b":"
    for line in status.split(b"\n"):
        if line.startswith(b"Name:"):
            continue
        if line.startswith(prefix):
            return line[len(prefix) :].strip()
    return None


def status_uid(status: bytes) -> int | None:
    """The real uid of a process from /proc/<pid>/status (first of the four Uid fields)."""
    value = status_field(status, b"Uid")
    return None if value is None or not value.split() else _int(value.split()[0])


def status_tgid(status: bytes) -> int | None:
    """The thread group (process) a task belongs to, from /proc/<pid>/status or .../task/<tid>/status."""
    value = status_field(status, b"Tgid")
    return None if value is None else _int(value)


def stat_state(stat: bytes) -> bytes | None:
    """The one-letter state (R, S, D, T, t, Z, X, ...) from /proc/<pid>/stat. The name in
    parentheses may hold any bytes, ")" and spaces included: the state follows the last ")"."""
    end = stat.rfind(b")")
    if end < 0:
        return None
    rest = stat[end + 1 :].split()
    if not rest or len(rest[0]) != 1 or not rest[0].isalpha():
        return None
    return rest[0]


def pids(listing: list[str]) -> list[int]:
    """The numeric entries of a /proc or /proc/<pid>/task listing."""
    return [int(name) for name in listing if name.isdigit() and name.isascii()]


def int_list(data: bytes) -> list[int]:
    """Whitespace-separated decimal integers (cgroup.procs, tasks, cgroup.threads); others skipped."""
    out = []
    for word in data.split():
        value = _int(word)
        if value is not None:
            out.append(value)
    return out


def keyed_counter(data: bytes, key: bytes) -> int | None:
    """The value of `key` in a flat "key value" file (memory.events, memory.oom_control), or None."""
    for line in data.split(b"\n"):
        name, _, value = line.partition(b" ")
        if name == key:
            return _int(value)
    return None


def freezer_state(data: bytes) -> bytes:
    """cgroup v1 freezer.state: THAWED, FREEZING or FROZEN."""
    return data.strip()


def sysvipc_ids(table: bytes) -> list[int]:
    """Identifiers (second column) of a /proc/sysvipc/{shm,msg,sem} table; the header is skipped."""
    out = []
    for line in table.split(b"\n")[1:]:
        fields = line.split()
        if len(fields) > 1:
            value = _int(fields[1])
            if value is not None:
                out.append(value)
    return out


def timer_ids(timers: bytes) -> list[int]:
    """The POSIX timer ids of /proc/<pid>/timers ("ID: 3" lines)."""
    out = []
    for line in timers.split(b"\n"):
        if line.startswith(b"ID:"):
            value = _int(line[3:])
            if value is not None:
                out.append(value)
    return out


def mount_point(field: bytes) -> str:
    """A path from /proc/self/mountinfo, where spaces, tabs, newlines and backslashes are octal escapes."""
    out, i = bytearray(), 0
    while i < len(field):
        code = field[i + 1 : i + 4]
        if field[i : i + 1] == b"\\" and len(code) == 3 and all(48 <= c <= 55 for c in code):
            out.append(int(code, 8) & 0xFF)
            i += 4
        else:
            out += field[i : i + 1]
            i += 1
    return os.fsdecode(bytes(out))


def cgroup_mounts(mountinfo: bytes) -> dict[str, str]:
    """{controller: mount point} of the cgroup v1 hierarchies, and "" for cgroup2 (first of each)."""
    mounts: dict[str, str] = {}
    for line in mountinfo.split(b"\n"):
        pre, sep, post = line.partition(b" - ")
        fields, info = pre.split(b" "), post.split(b" ")  # single spaces: other blanks are path bytes
        if not sep or len(fields) < 5 or len(info) < 3:
            continue
        if info[0] == b"cgroup":
            for c in info[2].split(b","):
                mounts.setdefault(c.decode("ascii", "replace"), mount_point(fields[4]))
        elif info[0] == b"cgroup2":
            mounts.setdefault("", mount_point(fields[4]))
    return mounts


def cgroup_paths(cgroup: bytes) -> dict[str, str]:
    """{controller: group path} from /proc/<pid>/cgroup ("" for cgroup2's "0::/path" line)."""
    own: dict[str, str] = {}
    for line in cgroup.split(b"\n"):
        parts = line.split(b":", 2)
        if len(parts) == 3:
            for c in parts[1].split(b","):
                own[c.decode("ascii", "replace")] = os.fsdecode(parts[2])
    return own


def mount_points(mountinfo: bytes) -> list[tuple[str, list[bytes]]]:
    """(mount point, its options) of every line of /proc/<pid>/mountinfo."""
    out = []
    for line in mountinfo.split(b"\n"):
        fields = line.split(b" ")  # single spaces: other blanks are path bytes
        if len(fields) > 5:
            out.append((mount_point(fields[4]), fields[5].split(b",")))
    return out


def listdir_at(dir_fd: int, path: str) -> list[str]:
    """Entries of a directory under `dir_fd`; empty if it cannot be read (e.g. the process is gone)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return []
    try:
        return os.listdir(fd)
    except OSError:
        return []
    finally:
        os.close(fd)


def task_states(proc_fd: int, pid: int) -> dict[int, bytes]:
    """The threads of process `pid` as {tid: state}, read through a /proc directory fd. A zombie
    leader whose other threads still run shows as one Z task plus those threads: count them, never
    the leader's state alone. A state that cannot be read counts as runnable (the safe side)."""
    out = {}
    for tid in pids(listdir_at(proc_fd, f"{pid}/task")):
        stat = read_at(proc_fd, f"{pid}/task/{tid}/stat", 4096)
        if stat is not None:
            out[tid] = stat_state(stat) or b"?"
    return out


def live(states: dict[int, bytes]) -> list[int]:
    """Tasks that may still run (anything but zombie/dead)."""
    return [tid for tid, state in states.items() if state not in DEAD]
