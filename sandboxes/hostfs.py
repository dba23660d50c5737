"""Host-side file helpers shared by the backends."""
from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
from pathlib import Path


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def extract_to(tar_bytes: bytes, name: str, dest: str) -> str:
    """Unpack a tar of one file/dir to `dest` (tarfile's data filter refuses links out and devices)."""
    dest_parent = os.path.dirname(os.path.abspath(dest))
    os.makedirs(dest_parent, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest_parent) as tmp:
        with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tf:
            tf.extractall(tmp, filter="data")
        os.replace(os.path.join(tmp, name), dest)
    return dest


def rmtree(path: Path) -> None:
    def fix_perms(func, p, _exc):  # the sandbox may have chmod'ed a dir to 000
        try:
            os.chmod(os.path.dirname(p), 0o700)
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    if path.exists():
        shutil.rmtree(path, onerror=fix_perms)
