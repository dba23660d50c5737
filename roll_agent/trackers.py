"""Where a run's scalars go besides `metrics.jsonl` (always written: resume, `curves.png` and
the viewer read it): TensorBoard, Weights & Biases and MLflow, named by `logging.backends`.

W&B runs offline by default (`logging.wandb_mode`): its files go to `output_dir/wandb/`,
with no account and no network; `wandb sync output_dir/wandb/offline-run-*` uploads them
later. MLflow logs to a local store in the run's folder: an SQLite file, `output_dir/mlflow.db`
(MLflow's own recommendation for local use: its `./mlruns` file store is in maintenance mode
and refuses to open since MLflow 3.7), artifacts in `output_dir/mlartifacts/`; `mlflow ui
--backend-store-uri sqlite:///output_dir/mlflow.db` shows it. `logging.mlflow_uri` names a
tracking server (or another store) instead. Each tracker takes the same rows: numbers as
scalars at the row's `step`, and tables (the rollout sample of roll_agent/trajectory_dumps.py)
where the tracker has them.
"""

from __future__ import annotations

import importlib.util
import logging
import re
import time
from pathlib import Path

from roll_agent.config import ConfigError, LoggingConfig
from roll_agent.registry import TRACKERS

# what each built-in tracker imports, and what `pip install` needs for it (the trackers are named in
# roll_agent/registry.py: TRACKERS; a user's own is `module:Name`, a class taking (out, cfg, run_config))
NEEDS = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb"),
         "mlflow": ("mlflow", "mlflow-skinny sqlalchemy alembic")}


class TensorBoardTracker:
    def __init__(self, out: Path, cfg: LoggingConfig, run_config: dict):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(out / "tensorboard"))

    def log(self, scalars: dict[str, float], step: int) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)

    def table(self, name: str, rows: list[dict], step: int) -> None:
        """No tables in TensorBoard: the rollout sample stays in `trajectories/`."""

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    def __init__(self, out: Path, cfg: LoggingConfig, run_config: dict):
        import wandb

        self.wandb = wandb
        self.run = wandb.init(project=cfg.project, name=cfg.run_name or out.name, dir=str(out),
                              mode=cfg.wandb_mode, config=run_config, reinit="create_new",
                              settings=wandb.Settings(silent=True))  # the progress bar is the console's
        self.step = 0

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.step = max(self.step, step)  # W&B steps never go back (a resumed run's rows start at its step)
        self.run.log(scalars, step=self.step)

    def table(self, name: str, rows: list[dict], step: int) -> None:
        if rows:
            columns = list(rows[0])
            data = [[_cell(row.get(c)) for c in columns] for row in rows]
            self.run.log({name: self.wandb.Table(columns=columns, data=data)}, step=max(self.step, step))

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    """Through `MlflowClient` (no process-wide active run: tests and several runs in one
    process keep their own)."""

    def __init__(self, out: Path, cfg: LoggingConfig, run_config: dict):
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        logging.getLogger("alembic").setLevel(logging.WARNING)  # the store's schema migrations, at first use
        self.client = MlflowClient(tracking_uri=cfg.mlflow_uri or f"sqlite:///{(out / 'mlflow.db').resolve()}")
        experiment = self.client.get_experiment_by_name(cfg.project)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(
            cfg.project, artifact_location=None if cfg.mlflow_uri else (out / "mlartifacts").resolve().as_uri())
        self.run_id = self.client.create_run(experiment_id, run_name=cfg.run_name or out.name).info.run_id
        params = [Param(key, str(value)[:6000]) for key, value in _flatten(run_config).items()]
        for i in range(0, len(params), 100):  # MLflow's per-call limit
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def log(self, scalars: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(_mlflow_key(key), float(value), now, step) for key, value in scalars.items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def table(self, name: str, rows: list[dict], step: int) -> None:
        if rows:
            self.client.log_dict(self.run_id, {"step": step, "rows": [{k: _cell(v) for k, v in r.items()} for r in rows]},
                                 f"{name}/step_{step}.json")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def check_trackers(cfg: LoggingConfig) -> None:
    """Each tracker `logging.backends` names is installed (checked at start-up, before any work)."""
    for name in cfg.backends:
        if name in NEEDS and importlib.util.find_spec(NEEDS[name][0]) is None:
            raise ConfigError(f"logging.backends names {name}, which is not installed: pip install {NEEDS[name][1]} "
                              f"(or the 'trackers' extra: pip install -e '.[trackers]'), or leave {name} out of "
                              "logging.backends")


def open_trackers(out: Path, cfg: LoggingConfig, run_config: dict) -> list:
    check_trackers(cfg)
    return [TRACKERS.get(name)(out, cfg, run_config) for name in cfg.backends if name != "jsonl"]


def _flatten(config: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _mlflow_key(key: str) -> str:
    return re.sub(r"[^\w\-. :/]", "_", key)


def _cell(value):
    return value if isinstance(value, (int, float, str, bool)) or value is None else str(value)
