"""The shared checkpoints and the common evaluation of the head-to-head.

`prepare_models` builds the project's tiny model once (tokenizer trained on both tasks'
text) and warm-starts one copy per task with roll_agent's supervised warm-up on that
task's expert demonstrations (latency off: it is not RL); both frameworks then load the
task's directory. `evaluate_model` scores any checkpoint the same way: greedy episodes on
held-out seeds through roll_agent's evaluator (the env's own reward).
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
from roll_agent.rollout.evaluate import play_greedy
from roll_agent.rollout.stack import build_rollout
from roll_agent.tiny_model import build_tiny_model, env_corpus
from roll_agent.train.trainer import TorchTrainer
from roll_agent.warmup import run_warmup

# Warm-start steps (32 demonstrations each, lr 1e-3) per task, measured with seed 0 (greedy
# reward): the tool task jumps from 0.02-0.05 (up to 260 steps) to 0.67 at 300 and 0.97 at 400;
# reversal is at 0.82 at 200 and 0.92 at 300. RL from mid-jump (0.67) fell apart on both sides;
# from here greedy decoding solves the task, samples at temperature 1 fail 20-30%: a signal.
SFT_STEPS = {tasks.SINGLE_TURN: 300, tasks.MULTI_TURN: 400}
SFT_LR = 1e-3  # the warm-up's default 3e-3 left reversal near chance after 400-600 steps
PROBE_SEED = 4242


def _spec(task: str) -> EnvSpec:
    return EnvSpec(id=tasks.ENV_IDS[task], kwargs=dict(tasks.NO_LATENCY) if task == tasks.MULTI_TURN else {})


def prepare_models(root: Path, seed: int, rollouts: dict[str, RolloutConfig],
                   sft_steps: dict[str, int] = SFT_STEPS) -> dict[str, tuple[str, int, list]]:
    """Per task: the warm-started checkpoint, a probe seed and roll_agent's prompt ids for it.
    `rollouts`: each task's turns and token budget, as RL plays it (a demonstration is cut
    at the budget: the tool task's JSON calls need more than the default 8 tokens)."""
    specs = {task: _spec(task) for task in (tasks.SINGLE_TURN, tasks.MULTI_TURN)}
    base = build_tiny_model(root / "base_model", TinyModelConfig(), lambda: env_corpus(list(specs.values()), seed=seed),
                            seed=seed)
    tokenizer = AutoTokenizer.from_pretrained(base)
    formatter = ChatFormatter(tokenizer)
    models = {}
    for task, spec in specs.items():
        trainer = TorchTrainer(str(base), TrainerConfig(), AlgorithmConfig(kl_coef=0.0), ModelConfig(), seed=seed)
        asyncio.run(run_warmup(trainer, [spec], formatter, WarmupConfig(sft_steps=sft_steps[task], episodes_per_step=32,
                                                                        lr=SFT_LR), rollouts[task], seed))
        out = root / f"warm_model-{task}"
        trainer.model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        env = tasks.make(task, **spec.kwargs)
        obs, info = env.reset(seed=PROBE_SEED)
        models[task] = (str(out), PROBE_SEED, formatter.first_prompt(info["instructions"], obs, info.get("tools")))
    return models


def evaluate_model(task: str, model: str, seeds: list[int], rollout: RolloutConfig,
                   concurrency: int = 16) -> dict[int, float]:
    """Reward of a greedy episode of `model` per seed (tool latency on)."""
    return asyncio.run(_evaluate(task, model, seeds, rollout, concurrency))


async def _evaluate(task: str, model: str, seeds: list[int], rollout: RolloutConfig,
                    concurrency: int) -> dict[int, float]:
    formatter = ChatFormatter(AutoTokenizer.from_pretrained(model))
    engines = make_engines(EngineConfig(type="hf"), ModelConfig(), model)
    stack = build_rollout(formatter, rollout, [EnvSpec(id=tasks.ENV_IDS[task])], engines, ProxyConfig())
    managers = [stack.env_manager(f"eval-{i}", EnvSpec(id=tasks.ENV_IDS[task])) for i in range(concurrency)]
    try:
        return {t.seed: t.reward for t in await play_greedy(managers, seeds)}
    finally:
        for manager in managers:
            await manager.close()
        await stack.close()
