"""The local runtime: every component in this process, on one asyncio loop (the trainer
optionally in a child process: `runtime.trainer_process`)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from roll_agent.config import Config
from roll_agent.proxy.engines import make_engines
from roll_agent.rollout.chat import ChatFormatter
from roll_agent.rollout.env_workers import EnvWorkers
from roll_agent.rollout.stack import RolloutStack, build_rollout
from roll_agent.sync import make_weight_sync, weight_sync_type
from roll_agent.train.trainer import trainer_for_run


class LocalRuntime:
    def __init__(self, cfg: Config, model_path: str, output_dir: Path):
        weight_sync_type(cfg)  # checked before any work
        self.cfg = cfg
        self.model_path = model_path
        # the child hands over its CPU parameters in shared memory: the torch trainer on CPU only
        self.trainer_process = cfg.runtime.trainer_process and cfg.trainer.type == "torch" \
            and cfg.trainer.device == "cpu"
        self.threads = process_threads(cfg.runtime.torch_threads, self.trainer_process)
        if self.threads:
            torch.set_num_threads(self.threads)
        self._process_trainer = None
        self.env_workers = EnvWorkers()  # the warm-start's and the rollout's

    async def __aenter__(self) -> "LocalRuntime":
        self.env_workers.start(self.cfg.envs)  # they warm up (env_workers.py) while the model loads
        return self

    async def __aexit__(self, *exc) -> None:
        if self._process_trainer is not None:
            self._process_trainer.close()
        self.env_workers.close()  # the rollout stack has closed them unless it was never made

    def make_trainer(self):
        if self.trainer_process:
            from roll_agent.runtime.trainer_process import ProcessTrainer

            self._process_trainer = ProcessTrainer(self.cfg, self.model_path, self.threads)
            return self._process_trainer
        return trainer_for_run(self.cfg, self.model_path)

    def make_rollout(self, formatter: ChatFormatter, trainer) -> RolloutStack:
        """The rollout, its engines fed the weights of `trainer` (copied in this process)."""
        cfg = self.cfg
        engines = make_engines(cfg.engine, cfg.model, self.model_path, seed=cfg.seed)
        return build_rollout(formatter, cfg.rollout, cfg.envs, engines, cfg.proxy, cfg.seed, trainer.version,
                             cfg.watchdog, make_weight_sync(cfg, trainer), cfg.endpoint, self.env_workers)


def process_threads(torch_threads: int, trainer_process: bool) -> int:
    """torch's intra-op threads for this process and the trainer's child (0: leave torch's default).

    `runtime.torch_threads`, when set. At 0 with the trainer in a child process: torch's default
    (one thread per core in each process) where OpenMP's idle threads sleep (OMP_WAIT_POLICY=PASSIVE,
    set by roll_agent/__init__.py when it is imported before torch); where they spin, the CPUs this
    process may use are split between the two (half each, at least one), since two pools spinning
    against each other cost more than they add. On 2 cores (docs/performance.md, CPU split):
    the default run's steps 1.6x faster than the split, vs TRL's tasks the same."""
    if torch_threads or not trainer_process:
        return torch_threads
    if os.environ.get("OMP_WAIT_POLICY", "").strip().upper() == "PASSIVE":
        return 0
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cpus // 2)
