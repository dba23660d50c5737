"""Sandboxes for untrusted agent commands.

    from sandboxes import make_sandbox
    with make_sandbox("bwrap", memory_mb=512) as sb:
        r = sb.exec("python3 -c 'print(1+1)'", timeout=10)
        assert r.exit_code == 0 and r.output == "2\\n"

Backends: "docker" (containers from locally built images, warm pool), "bwrap"
(bubblewrap namespaces, no daemon) and "local" (no isolation; unsafe=True required).
Each takes its own config dataclass's fields as keyword arguments (see config.py).
"""
from __future__ import annotations

from .base import ExecResult, OutputBuffer, Sandbox, SandboxError
from .config import BwrapConfig, DockerConfig, LocalConfig, make_config

__all__ = ["make_sandbox", "Sandbox", "ExecResult", "SandboxError", "OutputBuffer",
           "DockerConfig", "BwrapConfig", "LocalConfig", "BACKENDS"]

BACKENDS = ("docker", "bwrap", "local")


def make_sandbox(backend: str, **config) -> Sandbox:
    """A not-yet-started sandbox; `with make_sandbox(...) as sb:` starts and always closes it."""
    cfg = make_config(backend, config)
    if backend == "docker":
        from .docker_backend import DockerSandbox

        return DockerSandbox(cfg)
    if backend == "bwrap":
        from .bwrap_backend import BwrapSandbox

        return BwrapSandbox(cfg)
    from .local_backend import LocalSandbox

    return LocalSandbox(cfg)
