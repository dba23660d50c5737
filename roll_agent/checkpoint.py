"""Checkpoints: `output_dir/checkpoints/step_N/` with the model (transformers
`from_pretrained` loads `model/`), tokenizer, optimizer, RNG states and version (the
trainer's files), and the rollout's state (buffer, scheduler, episode counters) beside
them. Written to a temporary folder and renamed, so a kill mid-save never leaves a half
checkpoint as the latest."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

ROLLOUT_STATE = "rollout_state.pt"


class Checkpointer:
    def __init__(self, output_dir: Path, keep_last: int = 2):
        self.root = output_dir / "checkpoints"
        self.keep_last = max(1, keep_last)

    def save(self, step: int, trainer, tokenizer, rollout_state: dict) -> Path:
        """The trainer's files, the tokenizer beside the model, and `rollout_state` (the buffer's
        and the scheduler's state_dicts) in `rollout_state.pt`."""
        final = self.root / f"step_{step:06d}"
        tmp = self.root / f".tmp_step_{step:06d}"
        shutil.rmtree(tmp, ignore_errors=True)
        trainer.save(tmp)
        tokenizer.save_pretrained(tmp / "model")
        torch.save(rollout_state, tmp / ROLLOUT_STATE)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in self.all()[: -self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def load(self, path: Path, trainer) -> dict:
        """Restore the trainer from checkpoint `path`; returns the rollout state saved with it."""
        trainer.load(path)
        return torch.load(path / ROLLOUT_STATE, weights_only=False)

    def all(self) -> list[Path]:
        if not self.root.exists():
            return []
        return sorted(p for p in self.root.glob("step_*") if (p / ROLLOUT_STATE).exists())

    def latest(self) -> Path | None:
        found = self.all()
        return found[-1] if found else None
