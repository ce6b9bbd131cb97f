"""Build the Docker sandbox image offline from this host's Python.

    python -m sandbox.docker.build [--tag stare-sandbox:latest] [--packages numpy sympy]

Collects a minimal root filesystem (interpreter, stdlib without tests/tkinter/idle, the given
packages with their dependencies, /bin/sh, and every shared library `ldd` says they need), then
runs `docker build` on sandbox/docker/Dockerfile through the Docker SDK. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER_FILES = ("_worker.py", "_proto.py", "_cells.py", "_isolation.py", "_uids.py")


def code_hash() -> str:
    """Identifies the worker code baked into an image; the backend refuses a stale image."""
    h = hashlib.sha256()
    for name in WORKER_FILES:
        with open(os.path.join(os.path.dirname(HERE), name), "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


# Programs a cell may start on every backend (`subprocess.run(["sleep", "1"])`, `sh -c "ls | wc"`)
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
SKIP_STDLIB = {"site-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3"}
ELF = b"\x7fELF"


def _copy(src: str, dst_root: str, dst: str | None = None) -> None:
    """Copy src to dst (default: the same path) inside dst_root, keeping symlinks as symlinks."""
    out = dst_root + (dst or src)
    if os.path.lexists(out):
        return
    os.makedirs(os.path.dirname(out), exist_ok=True)
    if os.path.islink(src):
        target = os.readlink(src)
        os.symlink(target, out)
        _copy(
            os.path.join(os.path.dirname(src), target) if not target.startswith("/") else target,
            dst_root,
            None if dst is None else os.path.join(os.path.dirname(dst), target),
        )
    else:
        shutil.copy2(src, out)


def _requirements(dist: md.Distribution) -> list[str]:
    names = []
    for req in dist.requires or []:
        if "extra ==" in req:
            continue
        names.append(re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0])
    return names


def _base_site_dir() -> str:
    """The first site-packages directory of the base interpreter (run outside any venv)."""
    out = subprocess.run(
        [os.path.realpath(sys.executable), "-I", "-c", "import site; print(site.getsitepackages()[0])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.strip()


def _loaded_library(name: str) -> str:
    """Path of a shared library as the dynamic loader finds it on this host."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL(ctypes.util.find_library(name) or f"lib{name}.so.2")
    except OSError:
        raise SystemExit(f"lib{name} not found on this host: the image needs it (apt-get install lib{name}2)") from None
    with open("/proc/self/maps") as f:
        return next(os.path.realpath(line.split()[-1]) for line in f if f"/lib{name}" in line)


def collect(root: str, packages: list[str]) -> None:
    base = sys.base_prefix
    stdlib = sysconfig.get_paths(vars={"installed_base": base, "base": base})["stdlib"]
    files = [os.path.realpath(sys.executable)]
    for dirpath, dirnames, filenames in os.walk(stdlib):
        dirnames[:] = [d for d in dirnames if d not in SKIP_STDLIB and not d.startswith("config-")]
        files += [os.path.join(dirpath, f) for f in filenames]
    files += [os.path.join(base, "lib", f) for f in os.listdir(os.path.join(base, "lib")) if f.startswith("libpython")]
    for f in files:
        _copy(f, root)
    site = _base_site_dir()  # packages go where the bare interpreter looks (venvs are not copied)
    seen, todo = set(), list(packages)
    while todo:
        name = todo.pop()
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        if dist.metadata["Name"].lower() in seen:
            continue
        seen.add(dist.metadata["Name"].lower())
        for rel in dist.files or []:
            src = os.path.realpath(dist.locate_file(rel))
            if os.path.isfile(src):  # bytecode included: the root is read-only, nothing recompiles
                _copy(src, root, os.path.normpath(os.path.join(site, str(rel))))
                files.append(src)
        todo += _requirements(dist)
    for name in SHELL_UTILS:  # the same basic programs as a cell sees on the local backend
        found = shutil.which(name, path="/usr/bin:/bin")
        if found is None:
            raise SystemExit(f"{name} not found on this host: the image needs it (install coreutils/grep/sed)")
        files.append(os.path.realpath(found))
        _copy(os.path.realpath(found), root, f"/usr/bin/{name}")
    os.symlink("usr/bin", root + "/bin")  # merged /usr: /bin/sleep and /usr/bin/sleep both work
    seccomp = _loaded_library("seccomp")  # the worker loads it with ctypes: ldd cannot see it
    files.append(seccomp)
    _copy(seccomp, root)
    soname = os.path.join(os.path.dirname(seccomp), "libseccomp.so.2")  # the name dlopen looks for
    if os.path.lexists(soname):
        _copy(soname, root)
    libs = set()
    for f in files:
        with open(f, "rb") as fh:
            if fh.read(4) != ELF:
                continue
        out = subprocess.run(["ldd", f], capture_output=True, text=True).stdout
        libs.update(re.findall(r"(/\S+) \(0x", out))
    for lib in libs:
        if not lib.startswith(base) and "site-packages" not in lib:
            _copy(lib, root)
    here = os.path.dirname(HERE)
    for name in WORKER_FILES:
        _copy(os.path.join(here, name), root, f"/opt/sandbox/{name}")
    os.makedirs(root + "/usr/local/bin", exist_ok=True)
    os.symlink(os.path.realpath(sys.executable), root + "/usr/local/bin/python3")
    os.symlink("python3", root + "/usr/local/bin/python")
    os.makedirs(root + "/etc", exist_ok=True)
    with open(root + "/etc/passwd", "w") as f:
        f.write("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/tmp:/bin/sh\n")
    with open(root + "/etc/group", "w") as f:
        f.write("root:x:0:\nnogroup:x:65534:\n")
    for d, mode in (("/tmp", 0o1777), ("/ctl", 0o700), ("/proc", 0o555), ("/dev", 0o755), ("/sys", 0o555)):
        os.makedirs(root + d, exist_ok=True)
        os.chmod(root + d, mode)
    for dirpath, dirnames, _ in os.walk(root):  # e.g. the copy of a 0700 home directory on the way
        for d in dirnames:
            p = os.path.join(dirpath, d)
            if not os.path.islink(p) and p[len(root) :] not in ("/ctl", "/tmp"):
                os.chmod(p, os.stat(p).st_mode | 0o755)


def build(tag: str, packages: list[str]) -> str:
    import docker

    with tempfile.TemporaryDirectory(prefix="stare-sandbox-image-") as ctx:
        collect(os.path.join(ctx, "rootfs"), packages)
        shutil.copy(os.path.join(HERE, "Dockerfile"), ctx)
        client = docker.from_env(timeout=600)
        image, _logs = client.images.build(
            path=ctx,
            tag=tag,
            rm=True,
            forcerm=True,
            labels={"stare-sandbox.python": sys.version.split()[0], "stare-sandbox.code": code_hash()},
        )
        client.images.prune(filters={"dangling": True, "label": "stare-sandbox.python"})  # earlier builds
    return image.id


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tag", default="stare-sandbox:latest")
    ap.add_argument("--packages", nargs="*", default=["numpy", "sympy"])
    args = ap.parse_args()
    print(f"built {args.tag}: {build(args.tag, args.packages)}")


if __name__ == "__main__":
    main()
