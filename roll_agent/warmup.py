"""Supervised warm-start on demonstrations played by the envs' own experts.

Real agent pipelines start RL from an SFT model; here the demonstrations come from
each env's `expert_action()` (with an optional share of random admissible actions).
They are played by the rollout's own episode loop (`EnvManager`), the expert answering
in place of the model: the same chat framing, token layout, env-error handling and
success rule as the episodes RL trains on. Envs that are not thread-safe (ALFWorld,
TextWorld) play in env worker processes, as in the run: their C engines stay out of the
trainer's process.
"""

from __future__ import annotations

import logging
import random

from tqdm import tqdm

from roll_agent.config import EnvSpec, RolloutConfig, WarmupConfig
from roll_agent.env_extras import expert_action
from roll_agent.rollout.chat import ChatFormatter
from roll_agent.rollout.env_manager import EnvManager, EnvServices
from roll_agent.rollout.env_workers import EnvWorkers
from roll_agent.rollout.groups import TRAIN_SEED_SPACE
from roll_agent.types import GenerateRequest, GenerateResult, Status

log = logging.getLogger(__name__)


class ExpertPolicy:
    """Answers an EnvManager's requests with its env's expert action (a random admissible one
    with probability `epsilon`), as token ids ending the turn the way the chat template does."""

    version = 0

    def __init__(self, manager: EnvManager, formatter: ChatFormatter, epsilon: float, rng: random.Random):
        self.manager, self.formatter, self.epsilon, self.rng = manager, formatter, epsilon, rng
        self.truncated = 0  # expert actions cut at the turn's token budget since run_warmup last read it
        self.longest = 0  # tokens of the longest expert action, end of turn included

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        admissible = self.manager.info.get("admissible_actions")
        if admissible and self.rng.random() < self.epsilon:
            action = self.rng.choice(admissible)
        else:
            action = await expert_action(self.manager.env)
        ids = self.formatter.encode(action) + [self.formatter.end_of_turn_id]
        budget = request.sampling.max_new_tokens
        finish = "stop" if len(ids) <= budget else "length"
        self.truncated += finish == "length"
        self.longest = max(self.longest, len(ids))
        ids = ids[:budget]
        return GenerateResult(ids, [0.0] * len(ids), [0] * len(ids), finish, request.request_id, 0)


def expert_manager(spec: EnvSpec, formatter: ChatFormatter, rollout: RolloutConfig, epsilon: float,
                   rng: random.Random, workers: EnvWorkers | None = None) -> EnvManager:
    manager = EnvServices(formatter, None, rollout, workers=workers).env_manager(f"warmup-{spec.name}", spec)
    manager.proxy = ExpertPolicy(manager, formatter, epsilon, rng)
    return manager


async def run_warmup(trainer, specs: list[EnvSpec], formatter: ChatFormatter, cfg: WarmupConfig,
                     rollout: RolloutConfig, seed: int, log_row=None, progress: bool = False,
                     workers: EnvWorkers | None = None) -> None:
    """`cfg.sft_steps` SFT steps, each on `cfg.episodes_per_step` demonstrations played one after
    another (demonstration i on env spec i mod len(specs)), all draws from one seeded RNG: the
    same demonstrations for a seed, release after release (the default run's learning curve
    in the README starts from them). `workers`: the run's env workers (started and warm), else
    the warm-start's own, closed at its end."""
    rng = random.Random(seed)
    own_workers = workers is None
    if own_workers:
        workers = EnvWorkers()
    managers = [expert_manager(spec, formatter, rollout, cfg.expert_epsilon, rng, workers) for spec in specs]
    bar = tqdm(total=cfg.sft_steps, desc="warm-start", unit="step", disable=not progress, dynamic_ncols=True)
    warned_truncation = False
    try:
        for step in range(cfg.sft_steps):
            played = [await managers[i % len(managers)].run_episode(rng.randrange(TRAIN_SEED_SPACE))
                      for i in range(cfg.episodes_per_step)]
            demos = [t for t in played if t.status in (Status.FINISHED, Status.TRUNCATED)]
            failed = [t for t in played if t.status not in (Status.FINISHED, Status.TRUNCATED)]
            if not demos:
                raise RuntimeError(f"every demonstration of warm-start step {step} failed (first: {played[0].status}: "
                                   f"{played[0].error}); fix the env or set warmup.sft_steps=0")
            if failed:
                log.warning("warm-start step %d: %d of %d demonstrations failed (first: %s: %s)", step,
                            len(failed), len(played), failed[0].status, failed[0].error)
            truncated = sum(m.proxy.truncated for m in managers)  # this step's
            for manager in managers:
                manager.proxy.truncated = 0
            if truncated and not warned_truncation:
                warned_truncation = True
                log.warning("warm-start: %d expert actions in step %d were cut at rollout.max_new_tokens=%d tokens "
                            "(the longest has %d): the model learns unfinished demonstrations; raise "
                            "rollout.max_new_tokens", truncated, step, rollout.max_new_tokens,
                            max(m.proxy.longest for m in managers))
            metrics = trainer.sft_step(demos, cfg.lr)
            success = sum(d.success for d in demos) / len(demos)
            if log_row is not None:
                log_row({"sft_step": step, **metrics, "demo_success_rate": success, "demos_failed": len(failed),
                         "demo_actions_truncated": truncated})
            bar.set_postfix(demo_succ=f"{success:.2f}", refresh=False)
            bar.update(1)
        trainer.reset_reference()  # RL's KL term anchors to the warm-started model
    finally:
        bar.close()
        for manager in managers:
            await manager.close()
        if own_workers:
            workers.close()
