"""The root file system a cell runs in, the same on every backend. Stdlib only.

One tree, assembled from this host's own Python: the interpreter (and the virtualenv around it),
its stdlib without tests/tkinter/idle, the distributions of the preloaded modules with their
dependencies, the programs in SHELL_UTILS (under /usr/bin, /bin pointing there), every shared
library `ldd` says these need, and a minimal /etc (passwd, group, hosts). Files keep their host
paths, so the interpreter, sys.path and scripts' #! lines work unchanged.

`python -m sandbox.docker.build` copies the tree into the Docker image; the local backend binds a
cached copy of it read-only as every session's root (`cached_tree`: hard links where the file
system allows, else copies; rebuilt when the interpreter, a package, a program or a library
changes). So a cell finds the same programs, libraries and packages on both backends: nothing a
policy learns to run locally is missing in Docker, and the host's compilers, network tools and
project tree are not there to be found.
"""

from __future__ import annotations

import errno
import hashlib
import importlib.metadata as md
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time

# Programs a cell may start on every backend (`subprocess.run(["sleep", "1"])`, `sh -c "ls | wc"`),
# besides the interpreter and the scripts of the preloaded packages (e.g. numpy's f2py).
SHELL_UTILS = (
    "sh",
    "sleep",
    "ls",
    "cat",
    "echo",
    "true",
    "false",
    "env",
    "head",
    "tail",
    "wc",
    "mkdir",
    "rm",
    "cp",
    "mv",
    "touch",
    "grep",
    "sed",
    "sort",
    "uniq",
    "tr",
    "cut",
    "date",
    "pwd",
    "id",
    "uname",
    "seq",
    "printf",
    "expr",
    "find",
    "xargs",
    "tee",
    "basename",
    "dirname",
)
SKIP_STDLIB = {"site-packages", "dist-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3"}
MOUNT_POINTS = {"/tmp": 0o1777, "/proc": 0o555, "/dev": 0o755, "/sys": 0o555}
ETC = {
    "passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/tmp:/bin/sh\n",
    "group": "root:x:0:\nnogroup:x:65534:\n",
    "hosts": "127.0.0.1\tlocalhost\n::1\tlocalhost\n",
}
FORMAT = 1  # bump when the tree's layout changes: cached trees of other formats are not used
ELF = b"\x7fELF"
COMPLETE = ".stare-sandbox-tree.json"  # written last: a tree without it is unfinished


def distributions(modules: list[str]) -> list[md.Distribution]:
    """The installed distributions providing `modules` (import names), with their dependencies."""
    names, seen, out = [], set(), []
    top_level = None
    for mod in modules:
        top = mod.split(".")[0]
        try:
            md.distribution(top)
            names.append(top)
        except md.PackageNotFoundError:
            if top_level is None:  # slow (scans every distribution): only for unusual names
                top_level = md.packages_distributions()
            names += top_level.get(top, [])  # stdlib modules: none
    while names:
        try:
            dist = md.distribution(names.pop())
        except md.PackageNotFoundError:
            continue
        key = (dist.metadata["Name"] or "").lower()
        if key in seen:
            continue
        seen.add(key)
        out.append(dist)
        names += [re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0] for req in dist.requires or [] if "extra ==" not in req]
    return sorted(out, key=lambda d: (d.metadata["Name"] or "").lower())


def _stdlib() -> str:
    base = sys.base_prefix
    return sysconfig.get_paths(vars={"installed_base": base, "base": base, "platbase": base})["stdlib"]


def shell_util(name: str) -> str:
    found = shutil.which(name, path="/usr/bin:/bin")
    if found is None:
        raise OSError(
            errno.ENOENT, f"{name} not found on this host: the sandbox root needs it (install coreutils/grep/sed)"
        )
    return os.path.realpath(found)


def seccomp_library() -> str | None:
    """Path of libseccomp as the dynamic loader finds it here (the worker loads it with ctypes,
    so ldd cannot see it); None if it is not installed."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL(ctypes.util.find_library("seccomp") or "libseccomp.so.2")
    except OSError:
        return None
    with open("/proc/self/maps", "rb") as f:
        for line in f:
            path = line.split(maxsplit=5)[-1].strip()
            if b"/libseccomp" in path:
                return os.path.realpath(os.fsdecode(path))
    return None


def _stat_key(path: str) -> list:
    try:
        st = os.stat(path)
    except OSError:
        return [path, None]
    return [path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]


def tree_key(modules: list[str]) -> str:
    """Identifies what the tree would hold, cheaply (no ldd): interpreter, stdlib, packages,
    programs. Shared libraries are checked separately (cached_tree)."""
    parts: list = [FORMAT, sys.version, sys.executable, sys.prefix, sys.base_prefix, _stdlib()]
    parts.append(_stat_key(os.path.realpath(sys.executable)))
    parts.append(_stat_key(_stdlib()))
    for dist in distributions(modules):
        # the dist-info directory changes with every (re)install of the distribution
        parts.append([dist.metadata["Name"], dist.version, _stat_key(str(getattr(dist, "_path", "")))])
    parts += [_stat_key(shell_util(name)) for name in SHELL_UTILS]
    parts.append(_stat_key(seccomp_library() or ""))
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]


class _Copier:
    """Puts host files into the tree at their host paths: hard links when allowed, else copies.
    Never changes a file it linked (a link is the host's own file)."""

    def __init__(self, root: str, link: bool):
        self.root, self.link = root, link

    def put(self, src: str, dst: str | None = None) -> None:
        """src (a host path) at dst (default: the same path) in the tree; symlinks stay symlinks,
        and their targets are brought along."""
        out = self.root + (dst or src)
        if os.path.lexists(out):
            return
        os.makedirs(os.path.dirname(out), exist_ok=True)
        if os.path.islink(src):
            target = os.readlink(src)
            os.symlink(target, out)
            resolved = target if target.startswith("/") else os.path.join(os.path.dirname(src), target)
            if dst is None or target.startswith("/"):
                self.put(os.path.normpath(resolved))
            else:
                self.put(os.path.normpath(resolved), os.path.normpath(os.path.join(os.path.dirname(dst), target)))
            return
        if self.link:
            try:
                os.link(src, out)
                return
            except OSError:
                pass  # another file system, or not ours to link (fs.protected_hardlinks): copy
        shutil.copy2(src, out)


def collect(root: str, modules: list[str], link: bool = False, extra: bool = True) -> list[str]:
    """Fill `root` with the sandbox's file set; returns the shared libraries taken (host paths).
    `link`: hard-link instead of copying where possible. `extra` (Docker): also libseccomp."""
    put = _Copier(root, link).put
    base = sys.base_prefix
    files = [os.path.realpath(sys.executable)]
    for dirpath, dirnames, filenames in os.walk(_stdlib()):
        dirnames[:] = [d for d in dirnames if d not in SKIP_STDLIB and not d.startswith("config-")]
        files += [os.path.join(dirpath, f) for f in filenames]
    libdir = os.path.join(base, "lib")
    files += [os.path.join(libdir, f) for f in os.listdir(libdir) if f.startswith("libpython")]
    for f in files:
        put(f)
    put(sys.executable)  # the interpreter as invoked (a virtualenv's bin/python: a symlink chain)
    if sys.prefix != sys.base_prefix:
        put(os.path.join(sys.prefix, "pyvenv.cfg"))
    for dist in distributions(modules):
        for rel in dist.files or []:
            src = os.path.realpath(dist.locate_file(rel))
            if os.path.isfile(src):  # bytecode included: the root is read-only, nothing recompiles
                put(src, os.path.normpath(str(dist.locate_file(rel))))
                files.append(src)
    for name in SHELL_UTILS:
        found = shell_util(name)
        files.append(found)
        put(found, f"/usr/bin/{name}")
    if not os.path.lexists(root + "/bin"):
        os.symlink("usr/bin", root + "/bin")  # merged /usr: /bin/sleep and /usr/bin/sleep both work
    seccomp = seccomp_library() if extra else None
    if seccomp is not None:
        files.append(seccomp)
        put(seccomp)
        soname = os.path.join(os.path.dirname(seccomp), "libseccomp.so.2")  # the name dlopen looks for
        if os.path.lexists(soname):
            put(soname)
    libs = _shared_libraries(files)
    for lib in libs:
        put(lib)
    os.makedirs(root + "/usr/local/bin", exist_ok=True)
    os.symlink(sys.executable, root + "/usr/local/bin/python3")
    os.symlink("python3", root + "/usr/local/bin/python")
    os.makedirs(root + "/etc", exist_ok=True)
    for name, text in ETC.items():
        with open(f"{root}/etc/{name}", "w") as f:
            f.write(text)
    for d, mode in MOUNT_POINTS.items():
        os.makedirs(root + d, exist_ok=True)
        os.chmod(root + d, mode)
    for dirpath, dirnames, _ in os.walk(root):  # e.g. the copy of a 0700 home directory on the way
        for d in dirnames:
            p = os.path.join(dirpath, d)
            if not os.path.islink(p) and p[len(root) :] not in MOUNT_POINTS:
                os.chmod(p, 0o755)
    os.chmod(root, 0o755)
    return libs


def _shared_libraries(files: list[str]) -> list[str]:
    """Every shared library the dynamic loader would map for these ELF files (per ldd), less those
    already in the tree (the interpreter's own and the packages')."""
    elves = []
    for f in dict.fromkeys(files):
        try:
            with open(f, "rb") as fh:
                if fh.read(4) == ELF:
                    elves.append(f)
        except OSError:
            continue
    libs: set[str] = set()
    for i in range(0, len(elves), 64):  # ldd takes many files at once: one process per batch
        try:
            out = subprocess.run(["ldd", *elves[i : i + 64]], capture_output=True, check=False).stdout
        except FileNotFoundError:
            raise OSError(errno.ENOENT, "ldd not found: the sandbox root needs it (install libc-bin)") from None
        libs.update(os.fsdecode(m) for m in re.findall(rb"(/\S+) \(0x", out))
    base = sys.base_prefix
    return sorted(lib for lib in libs if not lib.startswith(base + "/") and "site-packages" not in lib)


def default_cache_dir() -> str:
    """~/.cache/stare-sandbox (or under $XDG_CACHE_HOME) of the user running this."""
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(home, "stare-sandbox")


def cache_dir(configured: str = "", default: str = "") -> str:
    """A private directory for trees: `configured` (an error if unusable), else `default`, else
    one in the temp dir."""
    candidates = [configured] if configured else [default or default_cache_dir()]
    candidates.append(os.path.join(tempfile.gettempdir(), f"stare-sandbox-{os.geteuid()}"))
    for path in candidates:
        try:
            os.makedirs(path, 0o700, exist_ok=True)
        except OSError:
            if path == configured:
                raise
            continue
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o022:
            raise OSError(
                errno.EPERM,
                f"sandbox cache {path} is not a private directory of uid {os.geteuid()} (another user could "
                "change what the sandbox runs): remove it, or set sandbox.rootfs_cache",
            )
        return path
    raise OSError(errno.EACCES, "no writable directory for the sandbox's root file system (set sandbox.rootfs_cache)")


def _usable(tree: str) -> bool:
    """A finished tree of ours whose shared libraries are still the host's current ones."""
    try:
        st = os.lstat(tree)
        with open(os.path.join(tree, COMPLETE)) as f:
            libs = json.load(f)["libs"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o022:
        return False
    return all(_stat_key(recorded[0]) == recorded for recorded in libs)


def cached_tree(modules: list[str], configured: str = "", default: str = "") -> str:
    """Path of a ready tree for `modules`, built (once per host and version) in the cache."""
    where = cache_dir(configured, default)
    tree = os.path.join(where, f"root-{tree_key(modules)}")
    if _usable(tree):
        return tree
    if os.path.lexists(tree):  # a library changed under it: set it aside (live sessions may use it)
        try:
            os.rename(tree, os.path.join(where, f".stale-{os.path.basename(tree)}-{time.time_ns()}"))
        except OSError:
            pass  # another worker did it first
    build = tempfile.mkdtemp(prefix=".build-", dir=where)
    try:
        libs = collect(build, modules, link=True)
        with open(os.path.join(build, COMPLETE), "w") as f:
            json.dump({"modules": modules, "libs": [_stat_key(lib) for lib in libs]}, f)
        os.rename(build, tree)
    except OSError:
        shutil.rmtree(build, ignore_errors=True)
        if not _usable(tree):  # not another worker's build finishing first: a real failure
            raise
    return tree
