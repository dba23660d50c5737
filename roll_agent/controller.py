"""AsyncController: the training loop with suspend-update-resume.

    loop: batch = rollout.get_batch(version)
          trainer.step(batch) -> version + 1        (off the event loop: rollout goes on;
                                                     a sample of it dumped: roll_agent/trajectory_dumps.py)
          proxy.suspend(); proxy.push_weights(version); proxy.resume()   (its WeightSync moves them)
          rollout.on_version(version)               (admission widens, too-stale groups cancelled)

Generation never waits for training beyond what the async ratio demands.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from roll_agent.agents.sessions import FORK_REASONS
from roll_agent.checkpoint import Checkpointer
from roll_agent.config import CheckpointConfig, EvalConfig, RolloutConfig, WatchdogConfig
from roll_agent.metrics import MetricsLogger
from roll_agent.protocols import Rollout, SyncReport, Trainer
from roll_agent.rollout.accounting import OUTCOMES
from roll_agent.rollout.env_manager import EnvManager
from roll_agent.rollout.evaluate import play_greedy, summarize
from roll_agent.trajectory_dumps import TrajectoryDumps
from roll_agent.types import Group
from roll_agent.watchdog import Stuck

log = logging.getLogger(__name__)
FAILURE_POLL_S = 5.0  # while a batch is awaited: how often new failure reasons are looked for
STALE_WARN_SHARE = 0.1  # of the episodes started: warn once when more are dropped as stale


def stale_drop_warning(row: dict) -> str | None:
    """A warning when many episodes are dropped as stale (None otherwise, or too early to tell).

    Drops happen when generation runs ahead of training with more groups in flight than the
    async window holds; the dropped ones are the slowest to finish, so what is trained leans
    toward quick (often easy) tasks: in the vs-TRL benchmark 12% were dropped, the hardest
    tasks trained 73% as often as drawn, and the final reward ended 0.6 points below TRL's
    (0.3 with no group-level redundancy, nothing dropped)."""
    started, dropped = row.get("episodes_total_started", 0), row.get("episodes_total_stale_dropped", 0)
    if started < 100 or dropped < STALE_WARN_SHARE * started:
        return None
    return (f"{dropped / started:.0%} of the {started} episodes started so far were dropped as stale (older "
            "than rollout.async_ratio versions when their batch came): generation runs ahead of training, and "
            "the dropped episodes are the slowest to finish, so training sees fewer long or hard tasks. "
            "Run fewer redundant groups (rollout.num_env_groups closer to rollout.groups_per_batch) or raise "
            "rollout.async_ratio.")


def agent_metrics(trajs: list) -> dict[str, float]:
    """Agent episodes (roll_agent/agents/): model calls and segments per episode, and the share of
    calls that extended a segment vs forked a new one; nothing for env episodes."""
    agents = [t.metrics for t in trajs if "agent_calls" in t.metrics]
    if not agents:
        return {}
    total = lambda key: sum(m[key] for m in agents)  # noqa: E731
    calls = max(total("agent_calls"), 1.0)
    out = {"agent_calls_per_episode": total("agent_calls") / len(agents),
           "agent_segments_per_episode": total("agent_segments") / len(agents),
           "agent_extend_share": total("agent_extended") / calls, "agent_fork_share": total("agent_forked") / calls,
           "agent_retokenize_mismatches": total("agent_retokenize_mismatches")}
    for reason in FORK_REASONS:  # why calls forked: these shares add up to agent_fork_share
        out[f"agent_fork_share_{reason}"] = total(f"agent_forked_{reason}") / calls
    return out


async def update_weights(rollout: Rollout, version: int) -> SyncReport:
    """Suspend -> push -> resume: the engines serve `version`; then the rollout learns of it."""
    await rollout.proxy.suspend()
    try:
        report = await rollout.proxy.push_weights(version)
    finally:
        await rollout.proxy.resume()
    await rollout.on_version(version)
    return report


@dataclass
class Components:
    rollout: Rollout  # with the proxy, which owns the engines and their WeightSync
    trainer: Trainer
    eval_managers: list[EnvManager]
    tokenizer: PreTrainedTokenizerBase  # saved beside each checkpoint's model
    dumps: TrajectoryDumps | None = None  # rollout dumps (logging.trajectories)


def failure_limit(watchdog: WatchdogConfig, rollout: RolloutConfig) -> int:
    """`watchdog.stop_after_failed_episodes` resolved: 0 -> three failures of every env of every lane,
    -1 -> 0 (never)."""
    if watchdog.stop_after_failed_episodes:
        return max(watchdog.stop_after_failed_episodes, 0)
    return 3 * rollout.num_env_groups * (rollout.group_size + rollout.group_size_redundancy)


class AsyncController:
    def __init__(self, parts: Components, logger: MetricsLogger, checkpointer: Checkpointer, max_steps: int,
                 checkpoint_cfg: CheckpointConfig, eval_cfg: EvalConfig, stop_after_failed: int = 0):
        """`stop_after_failed`: episodes failed while a batch is awaited, no group completing, that end
        the run (`failure_limit`; 0: never)."""
        self.p = parts
        self.stop_after_failed = stop_after_failed
        self.logger = logger
        self.checkpointer = checkpointer
        self.max_steps = max_steps
        self.ckpt_cfg = checkpoint_cfg
        self.eval_cfg = eval_cfg
        self.eval_seeds = [eval_cfg.seed_offset + i for i in range(eval_cfg.num_episodes)]
        self._last_counts: dict[str, int] = {}
        self._reasons_said: set[str] = set()  # failure reason classes already in the log
        self._last_tokens = 0
        self._last_time = time.perf_counter()
        self._warned_stale = False

    async def sync_weights(self, version: int) -> SyncReport:
        return await update_weights(self.p.rollout, version)

    async def run(self) -> int:
        p, rollout = self.p, self.p.rollout
        step = p.trainer.version
        self._last_counts = dict(rollout.stats().episodes)  # a resumed run's ledger starts where it was saved
        if step == 0:
            await self._evaluate(step)
        rollout.start()
        try:
            while step < self.max_steps:
                t0 = time.perf_counter()
                batch = await self._next_batch(p.trainer.version)
                t1 = time.perf_counter()
                dumped = p.dumps.pick(p.trainer.version + 1, batch) if p.dumps else []
                metrics = await asyncio.to_thread(p.trainer.step, batch, dumped)
                trainer_logprobs = metrics.pop("trainer_logprobs", {})
                refused = metrics.pop("refused_episodes", [])
                for why in refused:
                    log.warning("the trainer refused an episode: %s", why)
                sync = await self.sync_weights(p.trainer.version)
                step = p.trainer.version
                if dumped:
                    self.logger.table("rollouts", p.dumps.train(step, batch, dumped, trainer_logprobs), step)
                row = {"step": step, "version": step, **self._batch_metrics(batch, step - 1), **metrics,
                       "time_wait_data_s": t1 - t0, "time_sync_s": sync["seconds"], "sync_bytes": sync["bytes"],
                       "time_step_s": time.perf_counter() - t0, "episodes_refused": len(refused)}
                if "verified_engines" in sync:
                    row["sync_verified_engines"] = sync["verified_engines"]
                self.logger.log(row, advance=True)
                if not self._warned_stale and (warning := stale_drop_warning(row)):
                    log.warning(warning)
                    self._warned_stale = True
                if self.ckpt_cfg.every and step % self.ckpt_cfg.every == 0 and step < self.max_steps:
                    self.save(step)
                if self.eval_cfg.every and step % self.eval_cfg.every == 0 and step < self.max_steps:
                    await self._evaluate(step)
        finally:
            await rollout.stop()
        self.logger.log({"step": step, **rollout.stats().accounting()})  # after shutdown: the cancelled rest counted
        await self._evaluate(step)
        self.save(step)
        return step

    async def _next_batch(self, version: int) -> list[Group]:
        """The buffer's next batch; a wait past watchdog.batch_timeout_s cancels the running episodes
        (they start afresh) and is retried, `max_batch_stalls` times in a row at most. Meanwhile new
        failure reasons are logged, and a wait in which only failures come ends the run."""
        waiting = asyncio.create_task(self._wait_for_batch(version))
        watching = asyncio.create_task(self._watch_failures(version))
        try:
            done, _ = await asyncio.wait({waiting, watching}, return_when=asyncio.FIRST_COMPLETED)
            if watching in done:
                watching.result()  # raises: the run cannot make progress
            return waiting.result()
        finally:
            for task in (waiting, watching):
                task.cancel()
            await asyncio.gather(waiting, watching, return_exceptions=True)

    async def _wait_for_batch(self, version: int) -> list[Group]:
        rollout, cfg = self.p.rollout, self.p.rollout.watchdog.cfg
        for _ in range(cfg.max_batch_stalls):
            what = f"batch for version {version + 1} ({rollout.num_ready()} groups ready)"
            try:
                async with rollout.watchdog.watch("batch", what, cfg.batch_timeout_s):
                    return await rollout.get_batch(version)
            except Stuck:
                log.warning("watchdog: still waiting on %s", "; ".join(rollout.watchdog.oldest()) or "nothing")
                await rollout.cancel_running()
        await rollout.refresh()
        stats = rollout.stats()
        failed = max(stats.reasons, key=stats.reasons.get, default=None)
        why = (f"{stats.reasons[failed]} episodes ended {failed.replace('/', ' with ', 1)}, the first: "
               f"{stats.reason_examples[failed].splitlines()[0]}") if failed else "the envs or engines are stuck"
        raise RuntimeError(f"no batch for version {version + 1} after {cfg.max_batch_stalls} waits of "
                           f"{cfg.batch_timeout_s:.0f}s (watchdog.batch_timeout_s): {why}; see the warnings above")

    def save(self, step: int) -> None:
        p = self.p
        self.checkpointer.save(step, p.trainer, p.tokenizer, p.rollout.state_dict())

    async def _evaluate(self, step: int) -> None:
        if not self.eval_cfg.num_episodes:
            return
        t0 = time.perf_counter()
        trajs = await play_greedy(self.p.eval_managers, self.eval_seeds)
        metrics = summarize(trajs, prefix="eval_", per_tag=len({m.tag for m in self.p.eval_managers}) > 1)
        self.logger.log({"step": step, **metrics, "time_eval_s": time.perf_counter() - t0})
        if self.p.dumps:
            self.logger.table("eval_rollouts", self.p.dumps.evaluation(step, trajs), step)

    def _batch_metrics(self, batch: list[Group], train_version: int) -> dict[str, float]:
        trajs = [t for g in batch for t in g.trajectories]
        stale = [train_version - t.min_version for t in trajs]
        out = summarize(trajs, per_tag=len({t.env_tag for t in trajs}) > 1)
        out.update(staleness_mean=sum(stale) / len(stale), staleness_max=float(max(stale)),
                   invalid_action_rate=sum(t.metrics.get("invalid_actions", 0) for t in trajs)
                   / max(sum(t.num_turns for t in trajs), 1),
                   # how long an episode waited for its env's reset (~0 when prepared ahead)
                   reset_wait_s_mean=sum(t.timing.get("reset_s", 0.0) for t in trajs) / len(trajs))
        out.update(agent_metrics(trajs))
        stats = self.p.rollout.stats()
        for key in ("started", *OUTCOMES):  # this step's share of each outcome
            out[f"episodes_{key}"] = stats.episodes.get(key, 0) - self._last_counts.get(key, 0)
        self._last_counts = dict(stats.episodes)
        self._say_new_reasons(stats)
        out.update({f"episodes_reason/{key}": n for key, n in stats.reasons.items()})  # cumulative
        out.update(stats.accounting(), **stats.watchdog, **{f"proxy_{k}": v for k, v in stats.proxy_faults.items()},
                   env_worker_restarts=stats.env_worker_restarts)
        if any("agent_calls" in t.metrics for t in trajs) or stats.agent_http:  # errors answered to agents so far
            out.update({key: stats.agent_http.get(key, 0) for key in ("agent_http_4xx", "agent_http_5xx")})
        # which samples this step trained on: a resumed run can be checked never to train one twice
        out["trained_samples"] = [f"{t.group_id}:{t.env_id}" for t in trajs]
        now = time.perf_counter()
        out["gen_tokens_per_s"] = (stats.gen_tokens - self._last_tokens) / max(now - self._last_time, 1e-9)
        self._last_tokens, self._last_time = stats.gen_tokens, now
        return out

    async def _watch_failures(self, version: int) -> None:
        """While a batch is awaited: new failure reasons reach the log within seconds (a run whose
        every episode fails has no next step to log them at), and once `stop_after_failed` episodes
        failed with no group completed, the run stops naming the most common reason."""
        rollout = self.p.rollout
        await rollout.refresh()
        before = rollout.stats()
        while True:
            await asyncio.sleep(FAILURE_POLL_S)
            await rollout.refresh()
            stats = rollout.stats()
            self._say_new_reasons(stats)
            new = {k: n - before.reasons.get(k, 0) for k, n in stats.reasons.items() if n > before.reasons.get(k, 0)}
            failed = sum(new.values())
            if self.stop_after_failed and failed >= self.stop_after_failed and stats.groups_put == before.groups_put:
                top = max(new, key=new.get)
                raise RuntimeError(
                    f"{failed} episodes failed while the run waited for the batch of version {version + 1}, and no "
                    f"group completed: {new[top]} ended {top.replace('/', ' with ', 1)}, the first:\n"
                    f"{stats.reason_examples[top]}\nFix the env or agent (`python -m roll_agent.check_env` plays "
                    "an env alone); watchdog.stop_after_failed_episodes sets how many failures end a run")

    def _say_new_reasons(self, stats) -> None:
        """Log each failure reason class once, with its first episode's reason whole; after that it is
        counted (metrics.jsonl: `episodes_reason/<outcome>/<class>`)."""
        for key, example in sorted(stats.reason_examples.items()):
            if key not in self._reasons_said:
                self._reasons_said.add(key)
                outcome, what = key.split("/", 1)
                log.warning("%d episode(s) so far ended %s with %s (counted as episodes_reason/%s in metrics.jsonl); "
                            "the first:\n%s", stats.reasons.get(key, 0), outcome, what, key, example)
