"""A host-wide pool of session uids: one flock'ed file per uid. Stdlib only.

Whoever holds the lock on `<dir>/<uid>` owns that uid; the kernel drops the lock when the holder
closes the file or dies, so a crashed worker never leaks uids. Every sandbox on the host (every
worker process, every Docker sandbox) draws from the same directory, so no two live sessions
share a uid, and with it the per-uid kernel accounting (inotify instances, pending signals, pipe
buffers, RLIMIT_NPROC).
"""

from __future__ import annotations

import fcntl
import os
import random
import stat
import tempfile

UID_BASE, UID_COUNT = 200_000, 65_536  # no host account has these


def pool_dir() -> str:
    """/run when we may write there (root), else a directory of our own under the temp dir."""
    if os.access("/run", os.W_OK):
        return "/run/stare-sandbox-uids"
    return os.path.join(tempfile.gettempdir(), f"stare-sandbox-uids-{os.geteuid()}")


class UidPool:
    def __init__(self, path: str | None = None):
        path = path or pool_dir()
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        self.dir = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        st = os.fstat(self.dir)
        if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o022:  # someone else's: refuse
            os.close(self.dir)
            raise OSError(f"uid pool {path} is not a private directory of uid {os.geteuid()}")

    def take(self) -> tuple[int, int]:
        """A uid no live session holds, and the lock fd that holds it (close it to give it back)."""
        start = random.randrange(UID_COUNT)  # few collisions between processes drawing at once
        for i in range(UID_COUNT):
            uid = UID_BASE + (start + i) % UID_COUNT
            fd = os.open(str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600, dir_fd=self.dir)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return uid, fd
            except BlockingIOError:
                os.close(fd)
        raise OSError(f"all {UID_COUNT} session uids are in use")

    def close(self) -> None:
        os.close(self.dir)
