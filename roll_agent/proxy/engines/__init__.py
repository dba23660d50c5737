"""Inference engines behind the LLMProxy."""

from __future__ import annotations

import dataclasses

from roll_agent.config import EngineConfig, ModelConfig
from roll_agent.registry import ENGINES


def engine_config(cfg: EngineConfig, i: int) -> EngineConfig:
    """Engine i's own config: `device=cuda:N` is a pool of GPUs N .. N+num_engines-1, one each."""
    if not cfg.device.startswith("cuda:"):
        return cfg
    return dataclasses.replace(cfg, device=f"cuda:{int(cfg.device.split(':', 1)[1]) + i}")


def make_engines(cfg: EngineConfig, model_cfg: ModelConfig, model_path: str, seed: int = 0) -> list:
    """`cfg.num_engines` engines of `cfg.type` (roll_agent/registry.py: ENGINES) serving the checkpoint
    at `model_path`, engine i seeded `seed + i`."""
    make = ENGINES.get(cfg.type)
    return [make(model_path, engine_config(cfg, i), model_cfg, seed=seed + i) for i in range(cfg.num_engines)]
