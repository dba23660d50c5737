"""Runtimes decide where the components live (docs/architecture.md, section 4): `local` (this process,
asyncio) or `ray` (Ray actors). The components never import a runtime; a runtime builds
them and hands the controller objects with the same interface."""

from __future__ import annotations

from pathlib import Path

from roll_agent.config import Config


def open_runtime(cfg: Config, model_path: str, output_dir: Path):
    """An async context manager: `async with open_runtime(...) as runtime:`; everything the
    runtime started (a Ray cluster, actors) is gone when the block ends."""
    if cfg.runtime.type == "ray":
        from roll_agent.runtime.ray_runtime import RayRuntime

        return RayRuntime(cfg, model_path, output_dir)
    from roll_agent.runtime.local import LocalRuntime

    return LocalRuntime(cfg, model_path, output_dir)
