"""Kernel isolation primitives for the local backend, via ctypes (stdlib only; runs in the worker).

Namespaces (mount, pid, net, ipc, uts), the read-only root (the tree of sandbox/local/_rootfs.py), the
session's private mounts, timers, and an optional seccomp filter through libseccomp (cgroups:
_cgroups.py). Every function raises OSError when the kernel refuses; the worker turns that into
an infrastructure failure.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import signal

try:
    from . import _procfs  # as part of the sandbox package (host side, tests)
except ImportError:
    import _procfs  # in the worker, which imports its siblings by name

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PROC_FLAGS = MS_NOSUID | MS_NODEV | MS_NOEXEC  # of every proc we mount (kept locked on a remount)
MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 1, 4, 38, 22, 2
PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV, AT_RECURSIVE, AT_FDCWD = 0x1, 0x2, 0x4, 0x8000, -100
# Numbers of the calls glibc has no wrapper for, per architecture (tests/sandbox check that every
# _syscall() name is in every table). Other architectures get a clear error, never a guess.
SYSCALLS = {
    "x86_64": {"pivot_root": 155, "mount_setattr": 442, "timer_delete": 226},
    "aarch64": {"pivot_root": 41, "mount_setattr": 442, "timer_delete": 111},
}

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def _syscall(name: str, *args) -> int:
    """A raw system call by name, with this architecture's number."""
    arch = os.uname().machine
    table = SYSCALLS.get(arch)
    if table is None:
        raise OSError(
            errno.ENOSYS,
            f"the local sandbox knows the system call numbers of {sorted(SYSCALLS)} only, "
            f"not {arch}: add them to SYSCALLS in sandbox/local/_isolation.py, or use sandbox.backend=docker",
        )
    return _libc.syscall(ctypes.c_long(table[name]), *args)


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _b(s: str | None) -> bytes | None:
    return None if s is None else os.fsencode(s)


def mount(src: str | None, dst: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(_b(src), _b(dst), _b(fstype), flags, _b(data)), f"mount {dst}")


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), f"unshare {flags:#x}")


def setns(fd: int, nstype: int) -> None:
    _check(_libc.setns(fd, nstype), "setns")


def prctl(option: int, arg: int) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl {option}")


def enter_user_namespace(outer_uid: int, outer_gid: int) -> None:
    """Become uid/gid 0 of a new user namespace that maps only (outer_uid, outer_gid).

    Without host privileges this gives the capabilities to create the other namespaces and the
    mounts the sandbox needs, all owned by the new namespace (rootless mode); the process stays
    outer_uid on the host. Pass the caller's own ids (a nested namespace: 0, 0)."""
    unshare(CLONE_NEWUSER)
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {outer_uid} 1"), ("gid_map", f"0 {outer_gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def drop_capabilities() -> None:
    """Empty every capability set, the bounding set included: uid 0 of a user namespace then has no
    more power than any unprivileged user, and an execve cannot hand capabilities back."""
    cap = 0
    while _libc.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0) == 0:
        cap += 1  # EINVAL past the last capability this kernel knows
    _libc.prctl(PR_CAP_AMBIENT, ctypes.c_ulong(PR_CAP_AMBIENT_CLEAR_ALL), 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable (x2 words): all zero
    _check(_libc.capset(header, data), "capset")


def sethostname(name: str) -> None:
    _check(_libc.sethostname(name.encode(), len(name)), "sethostname")


def bind_ro(src: str, dst: str, mountinfo: int = -1) -> None:
    """Bind src at dst read-only, nosuid and nodev, every mount below it included (a mount below
    the bound directory would otherwise stay writable and shared with the host).
    mount_setattr(AT_RECURSIVE) does it in one call (Linux >= 5.12); older kernels: each submount
    listed in `mountinfo` (an fd of /proc/self/mountinfo opened before /proc was covered)."""
    mount(src, dst, None, MS_BIND | MS_REC)
    attr = _MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, 0, 0, 0)
    if _syscall("mount_setattr", AT_FDCWD, _b(dst), AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr)) == 0:
        return
    if ctypes.get_errno() != errno.ENOSYS or mountinfo < 0:
        _check(-1, f"mount_setattr {dst}")
    os.lseek(mountinfo, 0, os.SEEK_SET)
    data = b""
    while chunk := os.read(mountinfo, 1 << 16):
        data += chunk
    for point, opts in _procfs.mount_points(data):
        if point == dst or point.startswith(dst + "/"):
            keep = MS_NOEXEC if b"noexec" in opts else 0  # a locked flag must be kept (user namespaces)
            mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | keep)


def build_root(tree: str, rootless: bool = False) -> None:
    """Enter a private mount namespace whose root is `tree` (sandbox/local/_rootfs.py: the same file set
    as the Docker image), read-only, with a minimal /dev. Called once by the worker, after
    everything it reads from the host; each session then adds its own /tmp, /proc and namespaces.
    Rootless, the new root also gets a proc of the worker's pid namespace: inside a user namespace
    the kernel lets a session mount its own proc only while a fully visible one exists in its
    mount namespace (the session's own then covers it)."""
    unshare(CLONE_NEWNS)
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we do propagates back to the host
    mountinfo = os.open("/proc/self/mountinfo", os.O_RDONLY | os.O_CLOEXEC)  # read later, past the cover
    # the new root is assembled over /proc: a mount point that always exists, that is never a
    # bind source, and that (in this private namespace) leaves nothing to clean up on the host
    stage = "/proc"
    bind_ro(tree, stage, mountinfo)
    os.close(mountinfo)
    dev = stage + "/dev"
    mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=64k")
    for name in ("null", "zero", "full", "random", "urandom"):
        open(f"{dev}/{name}", "w").close()
        mount(f"/dev/{name}", f"{dev}/{name}", None, MS_BIND)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, f"{dev}/{name}")
    os.mkdir(f"{dev}/shm")
    mount(None, dev, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NOEXEC)
    if rootless:
        mount("proc", stage + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.chdir(stage)
    # pivot_root(".", ".") stacks the old root on top; detaching it makes it unreachable. No chroot
    # fallback: it would leave the host's mounts in the namespace (an initramfs root: use docker)
    _check(_syscall("pivot_root", b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")


def collapse_heap() -> int:
    """Back the worker's private anonymous memory with 2 MB pages where the kernel can
    (MADV_COLLAPSE, Linux >= 6.1). fork() then copies, and each session's exit frees, one entry
    per 2 MB instead of 512; a session's first write to such a page still copies only 4 KB.
    Best effort: returns how many bytes were collapsed."""
    _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    huge, done = 1 << 21, 0
    with open("/proc/self/maps", "rb") as f:
        regions = [line.split() for line in f]
    for fields in regions:
        if len(fields) < 2 or len(fields[1]) < 4 or fields[1][:2] != b"rw" or fields[1][3:4] != b"p":
            continue
        if len(fields) > 5 and fields[5] != b"[heap]":
            continue  # only private writable anonymous memory (and the brk heap)
        lo, _, hi = fields[0].partition(b"-")
        lo, hi = int(lo, 16), int(hi, 16)
        lo, hi = (lo + huge - 1) & ~(huge - 1), hi & ~(huge - 1)
        if (
            hi - lo >= huge
            and _libc.madvise(lo, hi - lo, MADV_HUGEPAGE) == 0
            and _libc.madvise(lo, hi - lo, MADV_COLLAPSE) == 0
        ):
            done += hi - lo
    return done


def enter_session_mounts(disk_mb: int, uid: int) -> None:
    """In a fresh mount namespace: private /tmp (also /dev/shm) sized disk_mb, and a /proc that
    shows only this session's pid namespace. Whatever the root holds under /tmp (an interpreter
    installed there) is bound back read-only into the private /tmp."""
    under_tmp = [(name, os.open(f"/tmp/{name}", os.O_PATH | os.O_CLOEXEC)) for name in os.listdir("/tmp")]
    opts = f"size={disk_mb}m,mode=0700,uid={uid},gid={uid}"
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, opts)
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for name, fd in under_tmp:
        os.mkdir(f"/tmp/{name}")
        bind_ro(f"/proc/self/fd/{fd}", f"/tmp/{name}")
        os.close(fd)
    mount("/tmp", "/dev/shm", None, MS_BIND)


def cancel_timers() -> None:
    """Disarm every timer of the calling process: the interval timers (setitimer, alarm) and the
    POSIX timers (timer_create), so no signal of one cell fires in a later one."""
    for which in (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF):
        signal.setitimer(which, 0)
    try:
        fd = os.open("/proc/self/timers", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return  # a kernel without CONFIG_CHECKPOINT_RESTORE: no listing
    try:
        data = os.read(fd, 1 << 20)
    finally:
        os.close(fd)
    for timer in _procfs.timer_ids(data):
        _syscall("timer_delete", ctypes.c_int(timer))


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


SCMP_CMP_NE, SCMP_CMP_EQ, SCMP_CMP_MASKED_EQ = 1, 4, 7


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("a", ctypes.c_uint64), ("b", ctypes.c_uint64)]


# Kernel attack surface the code never needs. EPERM, as if unprivileged.
_DENY = """ptrace process_vm_readv process_vm_writev keyctl add_key request_key bpf perf_event_open
userfaultfd unshare setns mount umount2 pivot_root chroot move_mount open_tree fsopen fsmount fspick
mount_setattr open_by_handle_at name_to_handle_at kexec_load kexec_file_load init_module finit_module
delete_module reboot swapon swapoff acct quotactl syslog iopl ioperm io_uring_setup io_uring_enter
io_uring_register io_setup io_destroy io_submit io_cancel io_getevents io_pgetevents modify_ldt
personality kcmp fanotify_init memfd_secret""".split()
# io_*: AIO contexts come from the host-wide fs.aio-max-nr (DeepSpeed's async I/O needs them);
# personality: READ_IMPLIES_EXEC and address-layout changes; the rest: kernel surface nobody needs


class Seccomp:
    """A deny-list filter built once in the worker and loaded by each session process."""

    ALLOW, ERRNO = 0x7FFF0000, 0x00050000

    def __init__(self, block_network: bool, deny_shared_memory: bool = False):
        name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
        lib = ctypes.CDLL(name, use_errno=True)  # OSError when absent: the caller skips seccomp
        lib.seccomp_init.restype = ctypes.c_void_p
        lib.seccomp_init.argtypes = [ctypes.c_uint32]
        lib.seccomp_rule_add_array.argtypes = [
            ctypes.c_void_p,
            ctypes.c_uint32,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.POINTER(_ArgCmp),
        ]
        self.lib, self.ctx = lib, lib.seccomp_init(self.ALLOW)
        if not self.ctx:
            raise OSError("seccomp_init failed")
        for call in _DENY:
            self._rule(call, errno.EPERM)
        self._rule(
            "clone", errno.EPERM, _ArgCmp(0, SCMP_CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER)
        )  # no user namespaces
        self._rule("clone3", errno.ENOSYS)  # flags are behind a pointer; libc falls back to clone
        # The worker's hold on its cells: the parent-death signal (a session outliving its worker
        # would run with no time limit and no owner) and non-dumpable (a dumpable process owns its
        # /proc files, oom_score_adj among them). Both were set before the filter was loaded.
        for option in (PR_SET_PDEATHSIG, PR_SET_DUMPABLE):
            self._rule("prctl", errno.EPERM, _ArgCmp(0, SCMP_CMP_EQ, option, 0))
        if deny_shared_memory:
            for call in ("shmget", "memfd_create"):
                self._rule(call, errno.EPERM)
        if block_network:  # only AF_UNIX (1) sockets: the namespace already has no network; belt and braces
            for call in ("socket", "socketpair"):  # any other family may autoload a kernel module
                self._rule(call, errno.EAFNOSUPPORT, _ArgCmp(0, SCMP_CMP_NE, 1, 0))
        # compile once to BPF: seccomp_load() would recompile it in every session (~1 ms)
        r, w = os.pipe()
        try:
            ret = lib.seccomp_export_bpf(ctypes.c_void_p(self.ctx), w)
        finally:
            os.close(w)
        with os.fdopen(r, "rb") as f:
            bpf = f.read()
        lib.seccomp_release(ctypes.c_void_p(self.ctx))
        if ret < 0:
            raise OSError(-ret, f"seccomp_export_bpf: {os.strerror(-ret)}")
        self.bpf = ctypes.create_string_buffer(bpf, len(bpf))
        self.prog = _SockFprog(len(bpf) // 8, ctypes.addressof(self.bpf))

    def _rule(self, call: str, err: int, *cmp: _ArgCmp) -> None:
        nr = self.lib.seccomp_syscall_resolve_name(call.encode())
        if nr < 0:
            return  # unknown on this kernel/arch: nothing to block
        arr = (_ArgCmp * len(cmp))(*cmp) if cmp else None
        ret = self.lib.seccomp_rule_add_array(self.ctx, self.ERRNO | err, nr, len(cmp), arr)
        if ret < 0:  # libseccomp returns -errno
            raise OSError(-ret, f"seccomp rule {call}: {os.strerror(-ret)}")

    def load(self) -> None:
        """Install in the calling process (needs no_new_privs); inherited by all its children."""
        _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(self.prog), 0, 0), "seccomp")
