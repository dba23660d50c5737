"""Sandbox images without a registry: a debootstrap rootfs, `docker import`ed.

    python -m sandboxes.build_image                 # base rootfs + roll-agent-base:latest (cached)
    python -m sandboxes.build_image --task REPO     # a per-task image with REPO at /testbed

No registry is reachable from the machines this runs on, so the base is bootstrapped
from the Debian mirror the machine's apt already uses. The same rootfs directory is
the root of `bwrap` sandboxes (root="base"), so both backends run the same userland.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from .config import BASE_IMAGE, SANDBOX_UID, cache_dir

SUITE = "bookworm"
PACKAGES = ("python3", "git", "python3-pytest", "patch")
TASK_REPO = "roll-agent-task"
_DEFAULT_MIRROR = "http://deb.debian.org/debian"


def rootfs_path(suite: str = SUITE) -> Path:
    return cache_dir() / "rootfs" / f"{suite}-base"


def debian_mirror(suite: str = SUITE) -> str:
    """The Debian archive this machine's apt uses for `suite` (ROLL_AGENT_DEBIAN_MIRROR overrides)."""
    if os.environ.get("ROLL_AGENT_DEBIAN_MIRROR"):
        return os.environ["ROLL_AGENT_DEBIAN_MIRROR"]
    files = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for f in files:
        try:
            text = f.read_text()
        except OSError:
            continue
        for uri, suites in _sources_entries(text):
            if suite in suites and "security" not in uri:
                return uri.rstrip("/")
    return _DEFAULT_MIRROR


def _sources_entries(text: str):
    """(uri, suites) from both the one-line and the deb822 sources formats."""
    for line in text.splitlines():
        m = re.match(r"\s*deb\s+(\[[^\]]*\]\s+)?(\S+)\s+(\S+)", line)
        if m:
            yield m.group(2), [m.group(3)]
    for stanza in re.split(r"\n\s*\n", text):
        fields = dict(re.findall(r"^(\w[\w-]*):\s*(.*)$", stanza, re.M))
        if "deb" in fields.get("Types", "").split() and "URIs" in fields:
            for uri in fields["URIs"].split():
                yield uri, fields.get("Suites", "").split()


def build_rootfs(force: bool = False, suite: str = SUITE) -> Path:
    """debootstrap minbase + PACKAGES into the cache (skipped when already there)."""
    path = rootfs_path(suite)
    if path.is_dir() and not force:
        return path
    if os.geteuid() != 0:
        raise PermissionError("debootstrap needs root; run: sudo python -m sandboxes.build_image")
    if shutil.which("debootstrap") is None:
        raise FileNotFoundError("debootstrap not found; install it: apt-get install -y debootstrap")
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", suite, str(tmp),
           debian_mirror(suite)]
    print("+", " ".join(cmd), flush=True)
    log = tmp.with_suffix(".log")
    with open(log, "w") as out:
        rc = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT)
    if rc != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(f"debootstrap failed (exit {rc}); see {log}")
    _customize(tmp)
    if force:
        shutil.rmtree(path, ignore_errors=True)
    os.rename(tmp, path)  # atomic: a rootfs dir that exists is a complete one
    log.unlink(missing_ok=True)
    return path


def _customize(root: Path) -> None:
    """The sandbox user (uid 1000, "agent") and its dirs; drop apt caches (size)."""
    with open(root / "etc/passwd", "a") as f:
        f.write(f"agent:x:{SANDBOX_UID}:{SANDBOX_UID}:sandbox agent:/home/agent:/bin/bash\n")
    with open(root / "etc/group", "a") as f:
        f.write(f"agent:x:{SANDBOX_UID}:\n")
    for d in ("home/agent", "workspace", "testbed"):
        (root / d).mkdir(parents=True, exist_ok=True)
        os.chown(root / d, SANDBOX_UID, SANDBOX_UID)
    for d in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for p in (root / d).glob("*"):
            if p.is_file():
                p.unlink()
    (root / "etc/roll_agent-rootfs").write_text(f"packages: {' '.join(PACKAGES)}\n")


def docker_client(timeout: int = 900):
    import docker

    return docker.from_env(timeout=timeout)


def image_exists(client, tag: str) -> bool:
    import docker

    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def ensure_base_image(tag: str = BASE_IMAGE, force: bool = False, client=None) -> str:
    """`docker import` the rootfs as `tag` unless the image is already there."""
    client = client or docker_client()
    if image_exists(client, tag) and not force:
        return tag
    root = build_rootfs()
    changes = [f"USER {SANDBOX_UID}:{SANDBOX_UID}", "WORKDIR /workspace", "ENV HOME=/home/agent",
               "ENV LANG=C.UTF-8", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               'CMD ["sleep", "infinity"]', "LABEL roll_agent.base=1"]
    repo, _, version = tag.rpartition(":") if ":" in tag else (tag, "", "latest")
    packer = subprocess.Popen(["tar", "-C", str(root), "--numeric-owner", "-cf", "-", "."], stdout=subprocess.PIPE)
    try:
        client.api.import_image(src=packer.stdout, repository=repo, tag=version, changes=changes,
                                stream_src=True)
    finally:
        packer.stdout.close()
        if packer.wait() != 0:
            raise RuntimeError(f"tar of {root} failed")
    return tag


def build_task_image(repo_dir: str, setup: tuple[str, ...] = (), base: str = BASE_IMAGE,
                     workdir: str = "/testbed", client=None) -> str:
    """An image FROM `base` with `repo_dir` at `workdir`, tagged by a hash of its content.

    `setup` commands (e.g. `pip install -e .`) run as the sandbox user at build time.
    Building the same content again is a no-op.
    """
    client = client or docker_client()
    # STOPSIGNAL SIGKILL: task containers are disposable, so `docker stop` (other harnesses
    # use it) should not wait out the default 10 s grace period on every instance
    dockerfile = "\n".join([f"FROM {base}", f"COPY --chown={SANDBOX_UID}:{SANDBOX_UID} repo/ {workdir}/",
                            f"WORKDIR {workdir}", "STOPSIGNAL SIGKILL", *(f"RUN {cmd}" for cmd in setup)]) + "\n"
    with tempfile.TemporaryFile(dir=_build_dir()) as ctx:
        digest = _write_context(ctx, repo_dir, dockerfile, base_id=client.images.get(base).id)
        tag = f"{TASK_REPO}:{digest[:16]}"
        if image_exists(client, tag):
            return tag
        ctx.seek(0)
        client.images.build(fileobj=ctx, custom_context=True, tag=tag, rm=True, forcerm=True)
    return tag


def _build_dir() -> Path:
    d = cache_dir() / "build"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _write_context(out, repo_dir: str, dockerfile: str, base_id: str) -> str:
    """A reproducible build context (sorted, mtimes and owners zeroed), hashed as written."""
    h = hashlib.sha256(f"{base_id}\n{dockerfile}".encode())

    class _Hashing(io.RawIOBase):
        def writable(self):
            return True

        def write(self, b):
            h.update(b)
            return out.write(b)

    def normalize(ti: tarfile.TarInfo) -> tarfile.TarInfo:
        ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = 0, 0, 0, "", ""
        return ti

    with tarfile.open(fileobj=_Hashing(), mode="w|") as tf:
        data = dockerfile.encode()
        ti = tarfile.TarInfo("Dockerfile")
        ti.size = len(data)
        tf.addfile(ti, io.BytesIO(data))
        root = Path(repo_dir)
        tf.add(root, arcname="repo", recursive=False, filter=normalize)
        for p in sorted(root.rglob("*")):
            tf.add(p, arcname="repo/" + p.relative_to(root).as_posix(), recursive=False, filter=normalize)
    return h.hexdigest()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sandboxes.build_image", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--force", action="store_true", help="rebuild the rootfs and re-import the base image")
    ap.add_argument("--rootfs-only", action="store_true", help="only the rootfs (for bwrap; no docker needed)")
    ap.add_argument("--tag", default=BASE_IMAGE)
    ap.add_argument("--task", metavar="REPO_DIR", help="build a per-task image with REPO_DIR at /testbed")
    ap.add_argument("--setup", action="append", default=[], help="RUN command for --task (repeatable)")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    build_rootfs(force=args.force)
    print(f"rootfs: {rootfs_path()} ({time.monotonic() - t0:.1f}s)", flush=True)
    if args.rootfs_only:
        return 0
    print(f"base image: {ensure_base_image(args.tag, force=args.force)} ({time.monotonic() - t0:.1f}s)")
    if args.task:
        print(f"task image: {build_task_image(args.task, tuple(args.setup), base=args.tag)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
