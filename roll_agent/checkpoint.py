"""Checkpoints: `output_dir/checkpoints/step_N/` with the model (transformers
`from_pretrained` loads `model/`), tokenizer, optimizer, RNG states, version and
counters. Written to a temporary folder and renamed, so a kill mid-save never leaves
a half checkpoint as the latest."""

from __future__ import annotations

import shutil
from pathlib import Path


class Checkpointer:
    def __init__(self, output_dir: Path, keep_last: int = 2):
        self.root = output_dir / "checkpoints"
        self.keep_last = max(1, keep_last)

    def save(self, step: int, trainer, tokenizer, extra: dict) -> Path:
        final = self.root / f"step_{step:06d}"
        tmp = self.root / f".tmp_step_{step:06d}"
        shutil.rmtree(tmp, ignore_errors=True)
        trainer.save(tmp, extra)
        tokenizer.save_pretrained(tmp / "model")
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in self.all()[: -self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def all(self) -> list[Path]:
        if not self.root.exists():
            return []
        return sorted(p for p in self.root.glob("step_*") if (p / "trainer_state.pt").exists())

    def latest(self) -> Path | None:
        found = self.all()
        return found[-1] if found else None
