"""The learning rate of each RL step (`trainer.lr_schedule`): a linear warmup over
`trainer.lr_warmup_steps`, then constant, linear or cosine decay to
`trainer.min_lr_ratio * trainer.lr` at `trainer.lr_decay_steps` (the run's `max_steps`
unless set). A pure function of the step, so a resumed run continues the schedule exactly."""

from __future__ import annotations

import math

from roll_agent.config import TrainerConfig


def lr_at(cfg: TrainerConfig, step: int) -> float:
    """The learning rate of RL step `step` (0 for the first)."""
    if step < cfg.lr_warmup_steps:
        return cfg.lr * (step + 1) / cfg.lr_warmup_steps
    if cfg.lr_schedule == "constant":
        return cfg.lr
    span = max(cfg.lr_decay_steps - cfg.lr_warmup_steps, 1)
    progress = min((step - cfg.lr_warmup_steps) / span, 1.0)
    if cfg.lr_schedule == "linear":
        kept = 1.0 - progress
    else:  # cosine
        kept = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.lr * (cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * kept)
