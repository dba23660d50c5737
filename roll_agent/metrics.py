"""Metrics: one JSON object per row in `metrics.jsonl`, the same scalars to the trackers
`logging.backends` names (TensorBoard, W&B, MLflow: roll_agent/trackers.py), a live progress
bar, and `curves.png` at the end."""

from __future__ import annotations

import json
import math
from pathlib import Path

from roll_agent.config import LoggingConfig
from roll_agent.trackers import open_trackers

BAR_KEYS = {"reward_mean": "R", "success_rate": "succ", "eval_success_rate": "eval", "staleness_mean": "stale",
            "gen_tokens_per_s": "gen_tok/s"}


class MetricsLogger:
    def __init__(self, output_dir: Path, cfg: LoggingConfig, total_steps: int, first_step: int = 0,
                 run_config: dict | None = None):
        self.path = output_dir / "metrics.jsonl"
        output_dir.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            # resuming from step `first_step`: rows logged after that checkpoint are redone
            kept = [r for r in read_rows(self.path) if r.get("step", 0) <= first_step] if first_step else []
            self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        self._file = self.path.open("a")
        self.trackers = open_trackers(output_dir, cfg, run_config or {})
        self._bar = None
        if cfg.progress:
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, initial=first_step, desc="train", unit="step", dynamic_ncols=True)
        self._postfix: dict[str, str] = {}

    def log(self, row: dict, advance: bool = False) -> None:
        clean = {k: _jsonable(v) for k, v in row.items()}
        self._file.write(json.dumps(clean) + "\n")
        self._file.flush()
        step = int(row.get("step", 0))
        scalars = {k: float(v) for k, v in clean.items() if isinstance(v, (int, float)) and k != "step"}
        for tracker in self.trackers:
            tracker.log(scalars, step)
        if self._bar is not None:
            for key, short in BAR_KEYS.items():
                if isinstance(clean.get(key), (int, float)):
                    self._postfix[short] = f"{clean[key]:.3g}"
            self._bar.set_postfix(self._postfix, refresh=False)
            self._bar.update(1 if advance else 0)

    def table(self, name: str, rows: list[dict], step: int) -> None:
        """A table of rows (one per episode) to the trackers that keep tables."""
        for tracker in self.trackers:
            tracker.table(name, rows, step)

    def close(self) -> None:
        self._file.close()
        for tracker in self.trackers:
            tracker.close()
        if self._bar is not None:
            self._bar.close()


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):
        return value.item()
    return value


def read_rows(path: Path) -> list[dict]:
    """All rows; a torn last line (the process was killed mid-write) is left out."""
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    rows = [json.loads(line) for line in lines[:-1]]
    if lines:
        try:
            rows.append(json.loads(lines[-1]))
        except json.JSONDecodeError:
            pass
    return rows


def plot_curves(metrics_path: Path, out_png: Path) -> None:
    """Training reward/success, eval success, staleness and throughput against steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_rows(metrics_path)
    train = [r for r in rows if "reward_mean" in r]
    evals = [r for r in rows if "eval_success_rate" in r]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    panels = [
        (axes[0, 0], "success", [("success_rate", train, "train (sampled)"), ("eval_success_rate", evals, "eval (greedy)")]),
        (axes[0, 1], "reward", [("reward_mean", train, "train reward")]),
        (axes[1, 0], "staleness (versions)", [("staleness_mean", train, "mean"), ("staleness_max", train, "max")]),
        (axes[1, 1], "tokens/s", [("gen_tokens_per_s", train, "generation"), ("train_tokens_per_s", train, "training")]),
    ]
    for ax, title, series in panels:
        for key, data, label in series:
            xs = [r["step"] for r in data if r.get(key) is not None]
            ys = [r[key] for r in data if r.get(key) is not None]
            if xs:
                ax.plot(xs, ys, marker="o" if data is evals else None, label=label)
        ax.set_title(title)
        ax.set_xlabel("step")
        if ax.lines:  # a run that stopped before any row has nothing to label
            ax.legend(loc="best", fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_png, dpi=90)
    plt.close(fig)
