"""Build the Docker sandbox image offline from this host's Python.

    python -m sandbox.docker.build [--tag stare-sandbox:latest] [--packages numpy sympy]

The image's files are the sandbox's root file system (sandbox/local/_rootfs.py: the interpreter, its
stdlib, the given packages with their dependencies, the shell utilities and every shared library
they need), the very set the local backend uses as its root, plus the worker's code. `docker
build` then runs on sandbox/docker/Dockerfile through the Docker SDK. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile

from ..local._rootfs import SHELL_UTILS, collect, seccomp_library

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER_DIR = os.path.join(os.path.dirname(HERE), "local")  # the local backend's worker, run as the init
WORKER_FILES = (
    "_worker.py",
    "_proto.py",
    "_cells.py",
    "_isolation.py",
    "_uids.py",
    "_procfs.py",
    "_cgroups.py",
    "_park.py",
    "_reaper.py",
)
__all__ = ["SHELL_UTILS", "WORKER_FILES", "build", "code_hash"]


def code_hash() -> str:
    """Identifies the worker code baked into an image; the backend refuses a stale image."""
    h = hashlib.sha256()
    for name in WORKER_FILES:
        with open(os.path.join(WORKER_DIR, name), "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


def fill(root: str, packages: list[str]) -> None:
    """The image's root: the sandbox's tree, the worker at /opt/sandbox, /ctl for its socket."""
    if seccomp_library() is None:  # the worker loads it in the container
        raise SystemExit("libseccomp not found on this host: the image needs it (apt-get install libseccomp2)")
    try:
        collect(root, packages, link=True)
    except OSError as e:
        raise SystemExit(str(e)) from None
    os.makedirs(root + "/opt/sandbox")
    for name in WORKER_FILES:
        shutil.copy2(os.path.join(WORKER_DIR, name), f"{root}/opt/sandbox/{name}")
    for d in ("/opt", "/opt/sandbox"):
        os.chmod(root + d, 0o755)
    os.makedirs(root + "/ctl", mode=0o700)
    os.chmod(root + "/ctl", 0o700)


def build(tag: str, packages: list[str]) -> str:
    import docker

    with tempfile.TemporaryDirectory(prefix="stare-sandbox-image-") as ctx:
        fill(os.path.join(ctx, "rootfs"), packages)
        with open(os.path.join(HERE, "Dockerfile")) as f:
            dockerfile = f.read().replace("@PYTHON@", sys.executable)  # the same interpreter path as local
        with open(os.path.join(ctx, "Dockerfile"), "w") as f:
            f.write(dockerfile)
        client = docker.from_env(timeout=600)
        image, _logs = client.images.build(
            path=ctx,
            tag=tag,
            rm=True,
            forcerm=True,
            labels={
                "stare-sandbox.python": sys.version.split()[0],
                "stare-sandbox.code": code_hash(),
                "stare-sandbox.packages": " ".join(sorted(packages)),
            },
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
