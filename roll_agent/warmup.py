"""Supervised warm-start on demonstrations played by the envs' own experts.

Real agent pipelines start RL from an SFT model; here the demonstrations come from
each env's `expert_action()` (with an optional share of random admissible actions),
written as token sequences by the same chat framing the rollout uses.
"""

from __future__ import annotations

import random

from roll_agent.config import EnvSpec, RolloutConfig, WarmupConfig
from roll_agent.rollout.chat import ChatFormatter
from roll_agent.rollout.envs import make_env
from roll_agent.rollout.groups import TRAIN_SEED_SPACE
from roll_agent.types import Trajectory


def demonstration(env, formatter: ChatFormatter, seed: int, max_turns: int, epsilon: float,
                  rng: random.Random) -> Trajectory:
    expert = getattr(env.unwrapped, "expert_action", None)
    if expert is None:
        raise ValueError(f"{env.spec.id if env.spec else env} has no expert_action(); set warmup.sft_steps=0")
    obs, info = env.reset(seed=seed)
    traj = Trajectory(seed=seed)
    traj.append(formatter.first_prompt(str(info.get("instructions", "")), str(obs), info.get("tools")), generated=False)
    for _ in range(max_turns):
        admissible = info.get("admissible_actions")
        action = rng.choice(admissible) if admissible and rng.random() < epsilon else expert()
        ids = formatter.encode(action) + [formatter.end_of_turn_id]
        traj.append(ids, generated=True, logprobs=[0.0] * len(ids), versions=[0] * len(ids))
        obs, reward, terminated, truncated, info = env.step(action)
        traj.step_rewards.append(float(reward))
        if terminated or truncated:
            traj.success = bool(info.get("success", reward > 0))
            break
        traj.append(formatter.next_turn(str(obs), True), generated=False)
    return traj


def run_warmup(trainer, specs: list[EnvSpec], formatter: ChatFormatter, cfg: WarmupConfig,
               rollout: RolloutConfig, seed: int, log=None) -> None:
    rng = random.Random(seed)
    envs = [make_env(spec) for spec in specs]
    try:
        for step in range(cfg.sft_steps):
            demos = [demonstration(envs[i % len(envs)], formatter, rng.randrange(TRAIN_SEED_SPACE),
                                   rollout.max_turns, cfg.expert_epsilon, rng)
                     for i in range(cfg.episodes_per_step)]
            metrics = trainer.sft_step(demos, cfg.lr)
            if log is not None:
                log({"sft_step": step, **metrics, "demo_success_rate": sum(d.success for d in demos) / len(demos)})
        trainer.reset_reference()  # RL's KL term anchors to the warm-started model
    finally:
        for env in envs:
            env.close()
