"""A started sandbox holding an instance's repo at its workdir, for docker or bwrap.

docker: the instance's image already holds the repo. bwrap has no images, so the
repo is copied in from a host source tree: a clone of `repo` when it is a local git
repository (what the test fixture writes), else `workdir` exported from the docker
`image`. Trees are cached under <cache>/swe-src, keyed by what determines their content
(the commit id, or the image id), and only read from there.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Callable

from sandboxes import Sandbox, make_sandbox
from sandboxes.config import cache_dir

from .instance import InstanceError, SWEInstance

BACKENDS = ("docker", "bwrap")
# test logs are parsed whole: keep far more than an agent's 64 kB view (-rA summaries are long)
MAX_LOG_BYTES = 8_000_000


def prepare_sandbox(instance: SWEInstance, backend: str = "docker",
                    options: dict[str, Any] | None = None) -> Sandbox:
    """A started sandbox with the repo at instance.workdir; the caller closes it."""
    opts = {"max_output_bytes": MAX_LOG_BYTES, **(options or {})}
    if backend == "docker":
        if not instance.image:
            raise ValueError(f"instance {instance.instance_id!r} has no 'image' for the docker sandbox")
        return make_sandbox("docker", image=instance.image, workdir=instance.workdir, **opts).start()
    if backend == "bwrap":
        src = source_tree(instance)
        sb = make_sandbox("bwrap", **{"root": "base", "workdir": instance.workdir, **opts}).start()
        try:
            sb.upload(str(src), instance.workdir)
        except BaseException:
            sb.close()
            raise
        return sb
    raise ValueError(f"unknown grading sandbox {backend!r}; valid: {', '.join(BACKENDS)}")


def source_tree(instance: SWEInstance) -> Path:
    """A host directory with the repo at base_commit (cached; never written after creation)."""
    repo = Path(instance.repo).expanduser() if instance.repo else None
    if repo is not None and (repo / ".git").exists():
        # a commit id names its whole tree: the same commit from any clone is the same entry
        commit = _resolve_commit(repo, instance.base_commit or "HEAD")
        return _cached(f"git-{commit}", lambda tmp: _clone(repo, commit, tmp))
    if instance.image:
        from sandboxes.build_image import docker_client

        image_id = docker_client().images.get(instance.image).id.split(":")[-1][:20]
        return _cached(f"image-{image_id}-{instance.workdir.strip('/').replace('/', '_')}",
                       lambda tmp: _export(instance.image, instance.workdir, tmp))
    raise ValueError(f"instance {instance.instance_id!r}: the bwrap sandbox needs the repo, as 'repo' = a local "
                     "git repository or a docker 'image' to copy it from")


def _cached(name: str, make: Callable[[Path], None]) -> Path:
    root = cache_dir() / "swe-src"
    final = root / name
    if final.is_dir():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{name}-"))
    try:
        make(tmp / "tree")
        os.rename(tmp / "tree", final)
    except OSError:
        if not final.is_dir():  # not a concurrent maker that got there first
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _resolve_commit(repo: Path, rev: str) -> str:
    r = subprocess.run(["git", "rev-parse", "-q", "--verify", f"{rev}^{{commit}}"], cwd=repo,
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise InstanceError(f"malformed instance: cannot check out base_commit {rev!r}: not a commit of {repo}")
    return r.stdout.strip()


def _clone(repo: Path, commit: str, dest: Path) -> None:
    def git(*args, cwd=None):
        r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
        if r.returncode != 0:
            raise OSError(f"git {' '.join(args)} failed: {r.stderr.strip()}")

    git("clone", "-q", "--no-checkout", str(repo), str(dest))
    git("-c", "advice.detachedHead=false", "checkout", "-q", commit, cwd=dest)


def _export(image: str, workdir: str, dest: Path) -> None:
    from sandboxes.build_image import docker_client

    api = docker_client().api
    cid = api.create_container(image, command=["true"])["Id"]
    try:
        stream, _ = api.get_archive(cid, workdir)
        with tempfile.TemporaryFile() as f:
            for chunk in stream:
                f.write(chunk)
            f.seek(0)
            with tarfile.open(fileobj=f) as tf:
                tf.extractall(dest.parent / "x", filter="tar")  # our own image: links inside the repo are kept
        os.rename(dest.parent / "x" / os.path.basename(workdir.rstrip("/")), dest)
    finally:
        api.remove_container(cid, force=True)
