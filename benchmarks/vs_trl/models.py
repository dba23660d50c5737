"""The shared checkpoint and the common evaluation of the head-to-head.

`prepare_model` builds the project's tiny model (tokenizer trained on both tasks' text)
and warm-starts it with roll_agent's supervised warm-up on the envs' expert
demonstrations (latency off: it is not RL); both frameworks then load that directory.
`evaluate_model` scores any final checkpoint the same way: greedy episodes on held-out
seeds through roll_agent's evaluator (the env's own reward).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from transformers import AutoTokenizer

from benchmarks.vs_trl import tasks
from roll_agent.config import (AlgorithmConfig, EngineConfig, EnvSpec, ModelConfig, ProxyConfig, RolloutConfig,
                               TinyModelConfig, TrainerConfig, WarmupConfig)
from roll_agent.proxy.engines import make_engines
from roll_agent.rollout.chat import ChatFormatter
from roll_agent.rollout.evaluate import evaluate
from roll_agent.rollout.stack import build_rollout
from roll_agent.tiny_model import build_tiny_model, env_corpus
from roll_agent.train.trainer import TorchTrainer
from roll_agent.train.warmup import run_warmup

SFT_STEPS = 150  # teaches the formats (tool call, answer); the tiny model does not solve the tasks from it
PROBE_SEED = 4242


def _specs() -> list[EnvSpec]:
    return [EnvSpec(id=tasks.ENV_IDS[tasks.SINGLE_TURN]), EnvSpec(id=tasks.ENV_IDS[tasks.MULTI_TURN],
                                                                   kwargs=dict(tasks.NO_LATENCY))]


def prepare_model(root: Path, seed: int, sft_steps: int = SFT_STEPS) -> tuple[str, dict]:
    """Returns the warm-started checkpoint and, per task, a probe seed with roll_agent's prompt ids for it."""
    specs = _specs()
    base = build_tiny_model(root / "base_model", TinyModelConfig(), lambda: env_corpus(specs, seed=seed), seed=seed)
    tokenizer = AutoTokenizer.from_pretrained(base)
    formatter = ChatFormatter(tokenizer)
    trainer = TorchTrainer(str(base), TrainerConfig(), AlgorithmConfig(kl_coef=0.0), ModelConfig(), seed=seed)
    run_warmup(trainer, specs, formatter, WarmupConfig(sft_steps=sft_steps, episodes_per_step=32),
               RolloutConfig(max_turns=3), seed)
    out = root / "warm_model"
    trainer.model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    probes = {}
    for task, spec in zip((tasks.SINGLE_TURN, tasks.MULTI_TURN), specs):
        env = tasks.make(task, **spec.kwargs)
        obs, info = env.reset(seed=PROBE_SEED)
        probes[task] = (PROBE_SEED, formatter.first_prompt(info["instructions"], obs, info.get("tools")))
    return str(out), probes


def evaluate_model(task: str, model: str, seeds: list[int], rollout: RolloutConfig, concurrency: int = 16) -> float:
    """Mean reward of greedy episodes of `model` on `seeds` (tool latency on)."""
    return asyncio.run(_evaluate(task, model, seeds, rollout, concurrency))


async def _evaluate(task: str, model: str, seeds: list[int], rollout: RolloutConfig, concurrency: int) -> float:
    formatter = ChatFormatter(AutoTokenizer.from_pretrained(model))
    engines = make_engines(EngineConfig(type="hf"), ModelConfig(), model)
    stack = build_rollout(formatter, rollout, [EnvSpec(id=tasks.ENV_IDS[task])], engines, ProxyConfig())
    managers = [stack.env_manager(f"eval-{i}", EnvSpec(id=tasks.ENV_IDS[task])) for i in range(concurrency)]
    try:
        return (await evaluate(managers, seeds))["eval_reward_mean"]
    finally:
        for manager in managers:
            await manager.close()
        await stack.close()
