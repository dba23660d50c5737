"""Sandboxes for untrusted agent commands.

    from sandboxes import make_sandbox
    with make_sandbox("bwrap", memory_mb=512) as sb:
        r = sb.exec("python3 -c 'print(1+1)'", timeout=10)
        assert r.exit_code == 0 and r.output == "2\\n"

Backends: "docker" (containers from locally built images, warm pool), "bwrap"
(bubblewrap namespaces, no daemon) and "local" (no isolation; unsafe=True required).
Each takes its own config dataclass's fields as keyword arguments (see config.py). Another
backend plugs in by name: `make_sandbox("mypackage.sandbox:MySandbox", ...)`.
"""
from __future__ import annotations

from roll_agent.registry import SANDBOXES

from .base import ExecResult, OutputBuffer, Sandbox, SandboxError
from .config import BwrapConfig, DockerConfig, LocalConfig, make_config

__all__ = ["make_sandbox", "Sandbox", "ExecResult", "SandboxError", "OutputBuffer",
           "DockerConfig", "BwrapConfig", "LocalConfig"]


def make_sandbox(backend: str, **config) -> Sandbox:
    """A not-yet-started sandbox; `with make_sandbox(...) as sb:` starts and always closes it.
    `backend`: a name above or a user's `module:Class` (a Sandbox whose `config_class` dataclass
    holds its options; roll_agent/registry.py: SANDBOXES)."""
    return SANDBOXES.get(backend)(make_config(backend, config))
