"""`python -m roll_agent.run [--config FILE] [section.key=value ...]`

Reads top to bottom as the composition of the system (docs/architecture.md, section 1).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

import torch
import transformers
from transformers import AutoTokenizer

from roll_agent.checkpoint import Checkpointer
from roll_agent.config import Config, ConfigError
from roll_agent.config_loader import load_config, to_dict, to_yaml
from roll_agent.controller import AsyncController, Components, failure_limit
from roll_agent.metrics import MetricsLogger, plot_curves
from roll_agent.rollout.chat import ChatFormatter
from roll_agent.env_registry import check_env_specs
from roll_agent.runtime import open_runtime
from roll_agent.tiny_model import prepare_model
from roll_agent.trackers import check_trackers
from roll_agent.trajectory_dumps import TrajectoryDumps
from roll_agent.warmup import run_warmup


def check_startup(cfg: Config) -> None:
    """What a user's config names must exist before any work: the envs (each made once), the
    trackers and the model."""
    check_env_specs(cfg.envs)
    check_trackers(cfg.logging)
    path = cfg.model.path
    if path and not Path(path, "config.json").is_file() and not _in_hub_cache(path):
        where = "a directory without config.json" if Path(path).is_dir() else "not a directory"
        raise ConfigError(f"model.path={path!r} is {where} and not a model in the local Hugging Face cache: "
                          "point it at a transformers checkpoint (save_pretrained's output), or leave it "
                          "empty for the tiny model built from the envs")


def _in_hub_cache(name: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except ValueError:  # not a valid repo id either
        return False


def setup_logging(level: str) -> None:
    """The run's log lines on stderr: roll_agent's from `logging.level`, other libraries' warnings.
    (A caller that configured logging itself keeps its handlers; only roll_agent's level is set.)"""
    logging.basicConfig(format="[%(asctime)s] %(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    logging.getLogger("roll_agent").setLevel(level.upper())


async def train(cfg: Config) -> int:
    setup_logging(cfg.logging.level)
    transformers.utils.logging.disable_progress_bar()
    check_startup(cfg)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(to_yaml(cfg))
    torch.manual_seed(cfg.seed)
    model_path = prepare_model(cfg, out)
    async with open_runtime(cfg, model_path, out) as runtime:  # local: this process; ray: actors on a cluster
        return await run_components(cfg, runtime, model_path, out)


async def run_components(cfg: Config, runtime, model_path: str, out: Path) -> int:
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    formatter = ChatFormatter(tokenizer)

    trainer = runtime.make_trainer()
    checkpointer = Checkpointer(out, cfg.checkpoint.keep_last)
    resume_from = checkpointer.latest() if cfg.resume else None
    if cfg.resume and resume_from is None:
        logging.getLogger(__name__).warning("resume=true, but %s holds no checkpoint: this run starts from scratch",
                                            out / "checkpoints")
    rollout_state = checkpointer.load(resume_from, trainer) if resume_from else None
    first_step = trainer.version
    logger = MetricsLogger(out, cfg.logging, cfg.max_steps, first_step, run_config=to_dict(cfg))
    if resume_from:
        logger.log({"step": first_step, "resumed_from_step": first_step})
    if rollout_state is None and cfg.warmup.sft_steps:
        await run_warmup(trainer, cfg.envs, formatter, cfg.warmup, cfg.rollout, cfg.seed, log_row=logger.log,
                         progress=cfg.logging.progress, workers=runtime.env_workers)

    rollout = runtime.make_rollout(formatter, trainer)  # its proxy pushes the trainer's weights into the engines
    if rollout_state is not None:
        rollout.load_state_dict(rollout_state)
    eval_managers = [rollout.env_manager(f"eval-{s.name}-{i}", s)
                     for s in cfg.envs for i in range(min(cfg.eval.num_episodes, 16))]
    dumps = TrajectoryDumps(out, cfg.logging.trajectories, formatter, first_step)
    parts = Components(rollout, trainer, eval_managers, tokenizer, dumps)
    controller = AsyncController(parts, logger, checkpointer, cfg.max_steps, cfg.checkpoint, cfg.eval,
                                 failure_limit(cfg.watchdog, cfg.rollout))
    try:
        await controller.sync_weights(trainer.version)  # engines serve the (warm-started / resumed) weights
        return await controller.run()
    finally:
        for m in eval_managers:
            await m.close()
        await rollout.close()
        dumps.close()
        logger.close()
        if cfg.logging.plot and (out / "metrics.jsonl").exists():
            plot_curves(out / "metrics.jsonl", out / "curves.png")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line: `config` (a YAML file or None) and `overrides` (section.key=value)."""
    parser = argparse.ArgumentParser(prog="python -m roll_agent.run", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="YAML file under configs/ (default: the embedded tiny CPU run)")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    return parser.parse_intermixed_args(argv)  # --config before, between or after the overrides


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        final = asyncio.run(train(cfg))
    except ConfigError as exc:  # also raised by a runtime that cannot place the config
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    print(f"done: version {final}, outputs in {cfg.output_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
