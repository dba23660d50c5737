"""EnvManager: plays multi-turn episodes of one env instance through the LLMProxy.

Prompt through the tokenizer's chat template, ask the proxy, step the env with the
decoded response, append the observation's tokens, repeat to `max_turns`. Blocking
`reset`/`step` calls run in a thread pool, async envs (`areset`/`astep`) are awaited, and
envs that are not thread-safe live in worker processes (roll_agent/rollout/env_workers.py,
async envs to this class), so a slow env never stalls the others (environment-level async).
An env that raises or times out ends only its episode, with status `env_error`; the env is
then rebuilt.

An agent env (roll_agent/Agent-v0: roll_agent/env_extras.py, `AgentEnv`) plays its episode differently: the
reset gives a task, the user's agent runs against its own session of the OpenAI-compatible
endpoint (roll_agent/agents/), every model call it makes is recorded token-exactly into the
trajectory (and its further segments), and `step(result)` scores what the agent returned.

`prepare(seed)` resets the env for the next episode in the background as soon as the last one
ended (the GroupScheduler calls it with its lane's next seed): the reset (an ALFWorld game load,
a sandbox start) runs while the lane waits for the rest of its group, and the next
`run_episode(seed)` starts from its result.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from roll_agent.agents.runner import AgentError, AgentSpec, run_agent
from roll_agent.agents.server import AgentEndpoint
from roll_agent.config import EndpointConfig, EnvSpec, RolloutConfig
from roll_agent.rollout.chat import ChatFormatter
from roll_agent.rollout.env_workers import EnvWorkers
from roll_agent.env_extras import aepisode_report, agent_of, async_env
from roll_agent.env_registry import make_env
from roll_agent.types import GenerateRequest, SamplingParams, Status, Trajectory, Turn, state_key
from roll_agent.watchdog import Watchdog

log = logging.getLogger(__name__)


class EnvStepError(RuntimeError):
    """The env failed (raised or timed out) during reset/step."""


def _failure(exc: BaseException) -> str:
    """`Name: message` and the last frames of its traceback (where it raised): an episode's error."""
    frames = traceback.format_tb(exc.__traceback__)[-3:]
    return f"{type(exc).__name__}: {exc}" + ("\n" + "".join(frames).rstrip() if frames else "")


@dataclass
class EnvServices:
    """What the EnvManagers of one process share, and the one way to build an EnvManager
    (`env_manager`): the local rollout, a Ray env worker, the driver's evaluation envs, the
    warm-start and the SWE agent each hold one."""

    formatter: ChatFormatter
    proxy: Any  # the Proxy contract (roll_agent/protocols.py) the episodes generate through
    cfg: RolloutConfig
    executor: Executor | None = None  # blocking env calls (None: asyncio's default pool)
    watchdog: Watchdog = field(default_factory=Watchdog)  # bounds each stage: step_timeout_s, episode_timeout_s
    workers: EnvWorkers | None = None  # where envs that ask for worker processes live (None: none do)
    endpoint: AgentEndpoint | None = None  # what agent envs' agents call (roll_agent/agents/server.py)

    @classmethod
    def build(cls, formatter: ChatFormatter, cfg: RolloutConfig, proxy, specs: list[EnvSpec],
              watchdog: Watchdog | None = None, endpoint_cfg: EndpointConfig | None = None,
              workers: EnvWorkers | None = None) -> "EnvServices":
        """A rollout's: its thread pool, the worker processes of `specs` (or `workers`, already
        started), the agent endpoint on `proxy`. `close()` ends them."""
        if workers is None:
            workers = EnvWorkers()
            workers.start(specs)
        return cls(formatter, proxy, cfg, ThreadPoolExecutor(cfg.env_threads, thread_name_prefix="env"),
                   watchdog or Watchdog(), workers, AgentEndpoint(proxy, formatter, cfg, endpoint_cfg))

    def env_manager(self, env_id: str, spec: EnvSpec) -> "EnvManager":
        return EnvManager(env_id, spec, self)

    async def close(self) -> None:
        if self.endpoint is not None:
            await self.endpoint.close()
        await self.watchdog.close()
        if self.executor is not None:
            self.executor.shutdown(wait=False, cancel_futures=True)
        if self.workers is not None:
            self.workers.close()


class EnvManager:
    def __init__(self, env_id: str, spec: EnvSpec, services: EnvServices):
        self.env_id = env_id
        self.spec = spec
        self.tag = spec.name
        self.formatter = services.formatter
        self.proxy = services.proxy
        self.cfg = services.cfg
        self.executor = services.executor
        self.workers = services.workers
        self.endpoint = services.endpoint
        self.watchdog = services.watchdog
        self.env = None
        self.info: dict = {}  # the env's last reset/step info (the warm-start's expert reads it)
        self.current: Trajectory | None = None  # the episode in progress (read by the scheduler)
        self._thread_call: asyncio.Future | None = None  # a blocking env call that may outlive its episode
        self._prepared: tuple[int, asyncio.Task] | None = None  # (seed, its reset running ahead)

    def _stage(self, stage: str, timeout: float):
        return self.watchdog.watch("env", f"env {self.env_id} stage {stage}", timeout)

    async def _call(self, fn, *args, timeout: float, **kwargs):
        loop = asyncio.get_running_loop()
        self._thread_call = loop.run_in_executor(self.executor, lambda: fn(*args, **kwargs))
        self._thread_call.add_done_callback(_retrieved)  # a call its episode gave up on fails unheard
        try:
            async with self._stage(getattr(fn, "__name__", "env call"), timeout):
                return await asyncio.shield(self._thread_call)
        except asyncio.TimeoutError as exc:
            raise EnvStepError(str(exc)) from exc
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise EnvStepError(_failure(exc)) from exc

    async def _await(self, stage: str, call, *args, timeout: float, **kwargs):
        """An async env call, bounded like a thread call; its failure is the env's."""
        try:
            async with self._stage(stage, timeout):
                return await call(*args, **kwargs)
        except asyncio.TimeoutError as exc:
            raise EnvStepError(str(exc)) from exc
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise EnvStepError(_failure(exc)) from exc

    async def _make_env(self):
        timeout = max(self.cfg.step_timeout_s, 300.0)  # a first load may take a while (ALFWorld: seconds)
        pool = self.workers.pool(self.spec) if self.workers is not None else None
        if pool is not None:
            return await self._await("make", pool.make, self.spec, timeout=timeout)
        try:
            return await self._call(make_env, self.spec, timeout=timeout)
        except asyncio.CancelledError:  # the env its thread goes on making is closed once made
            self._thread_call.add_done_callback(self._close_orphan)
            raise

    def _close_orphan(self, made: asyncio.Future) -> None:
        if made.cancelled() or made.exception() is not None:
            return
        try:
            asyncio.get_running_loop().run_in_executor(self.executor, _close_quietly, made.result())
        except RuntimeError:  # the executor is shut down: close it here
            _close_quietly(made.result())

    async def _step(self, action: str):
        env = async_env(self.env)
        if env is None:
            return await self._call(self.env.step, action, timeout=self.cfg.step_timeout_s)
        return await self._await("astep", env.astep, action, timeout=self.cfg.step_timeout_s)

    async def _episode_report(self) -> dict:
        """The env's optional `episode_report()`: extras of the episode just ended for the rollout
        dumps that may differ from run to run (a SWE grading log with its timings), kept out of
        `info` so that a seeded episode's infos stay reproducible (roll_agent/check_env.py).
        A report that fails is logged and left out: the episode stands."""
        try:
            return await aepisode_report(self.env)
        except Exception:
            log.warning("episode_report() of env %s failed", self.env_id, exc_info=True)
            return {}

    async def run_episode(self, seed: int, group_id: int = -1, greedy: bool = False) -> Trajectory:
        traj = Trajectory(group_id=group_id, env_id=self.env_id, env_tag=self.tag, seed=seed,
                          start_version=self.proxy.version)
        self.current = traj
        start = time.perf_counter()
        try:
            async with self.watchdog.watch("episode", f"episode of env {self.env_id} (seed {seed})",
                                           self.cfg.episode_timeout_s):
                await self._play(traj, seed, greedy)
            # the env's last info and its episode report, once per episode (a SWE episode's patch,
            # grade and grading log)
            traj.keep_info({**self.info, **await self._episode_report()})
        except (EnvStepError, asyncio.TimeoutError) as exc:
            traj.status = Status.ENV_ERROR
            traj.error = str(exc) or f"episode timed out after {self.cfg.episode_timeout_s:.0f}s"
            await self._discard_env()
        except asyncio.CancelledError:
            traj.status = Status.CANCELLED
            raise
        except Exception as exc:  # an engine failure or a bug: this episode ends, the run goes on
            log.exception("episode on %s (seed %s) failed", self.env_id, seed)
            traj.status = Status.CANCELLED
            traj.error = _failure(exc)
        finally:
            traj.timing["episode_s"] = time.perf_counter() - start
            self.current = None
        traj.reward = float(sum(traj.step_rewards))
        for segment in traj.segments:  # an agent episode's further samples share its outcome
            segment.reward, segment.status, segment.success = traj.reward, traj.status, traj.success
        return traj

    async def _reset(self, seed: int) -> tuple:
        if self._thread_call is not None and not self._thread_call.done():
            await self._discard_env()  # a cancelled episode left this env mid-call in its thread
        if self.env is None:
            self.env = await self._make_env()
        env = async_env(self.env)
        if env is not None:  # an async env resets on the loop: no thread hop per episode
            return await self._await("areset", env.areset, seed=seed, timeout=self.cfg.step_timeout_s)
        return await self._call(self.env.reset, seed=seed, timeout=self.cfg.step_timeout_s)

    def prepare(self, seed: int) -> None:
        """Reset for `seed` now, in the background; the next `run_episode(seed)` starts from it.
        A failed prepared reset fails that episode (`env_error`), as the reset itself would."""
        if self._prepared is not None:
            self._prepared[1].cancel()
        task = asyncio.create_task(self._reset(seed), name=f"prepare-{self.env_id}")
        task.add_done_callback(_retrieved)  # an episode that never comes leaves it unheard
        self._prepared = (seed, task)

    async def _take_reset(self, seed: int) -> tuple:
        prepared, self._prepared = self._prepared, None
        if prepared is not None:
            if prepared[0] == seed:
                return await prepared[1]
            await _cancelled(prepared[1])  # prepared for another seed (a resumed run draws afresh)
        return await self._reset(seed)

    async def _play(self, traj: Trajectory, seed: int, greedy: bool) -> None:
        cfg = self.cfg
        t0 = time.perf_counter()
        obs, info = await self._take_reset(seed)
        traj.timing["reset_s"] = time.perf_counter() - t0  # the wait: ~0 when prepared in time
        self.info = info
        agent = agent_of(self.env)
        if agent is not None:
            return await self._play_agent(traj, agent, info.get("task"), greedy)
        prompt = self.formatter.first_prompt(str(info.get("instructions", "")), str(obs), info.get("tools"))
        traj.append(prompt, generated=False)
        traj.prompt_len = len(prompt)
        shown = state_key(obs, info)  # the state the next turn is played from
        gen_s = env_s = 0.0
        traj.status = Status.TRUNCATED  # unless the env terminates first
        for _ in range(cfg.max_turns):
            budget = min(cfg.max_new_tokens, cfg.max_context_tokens - len(traj.token_ids))
            if budget <= 0:
                break
            sampling = SamplingParams(max_new_tokens=budget, temperature=cfg.temperature, top_p=cfg.top_p,
                                      greedy=greedy, stop_token_ids=self.formatter.stop_token_ids)
            t0 = time.perf_counter()
            result = await self.proxy.generate(GenerateRequest(list(traj.token_ids), sampling, self.env_id))
            t1 = time.perf_counter()
            turn = Turn(0, len(traj.token_ids), len(traj.token_ids) + len(result.token_ids), shown)
            traj.append(result.token_ids, generated=True, logprobs=result.logprobs, versions=result.versions)
            traj.num_turns += 1
            obs, reward, terminated, truncated, info = await self._step(self.formatter.response_text(result.token_ids))
            self.info = info
            gen_s, env_s = gen_s + t1 - t0, env_s + time.perf_counter() - t1
            traj.step_rewards.append(float(reward))
            turn.reward = float(reward)
            traj.turns.append(turn)
            shown = state_key(obs, info)
            traj.metrics["invalid_actions"] = traj.metrics.get("invalid_actions", 0) + bool(info.get("invalid_action"))
            if terminated or truncated:
                traj.status = Status.FINISHED if terminated else Status.TRUNCATED
                traj.success = bool(info.get("success", reward > 0))
                break
            traj.append(self.formatter.next_turn(str(obs), result.finish_reason == "stop"), generated=False)
        traj.timing.update(gen_s=gen_s, env_s=env_s)

    async def _play_agent(self, traj: Trajectory, agent: AgentSpec, task, greedy: bool) -> None:
        """One run of the user's agent on `task` through its own endpoint session, then scored."""
        if self.endpoint is None:
            raise EnvStepError(f"env {self.spec.id} runs agents, which need the agent endpoint; this EnvManager "
                               "was made without one (build it through the rollout: its env_manager())")
        await self.endpoint.start()
        session = self.endpoint.open_session(self.env_id, traj, greedy)
        t0 = time.perf_counter()
        try:
            try:
                result = await run_agent(agent, task, self.endpoint.session_url(session), session.key,
                                         self.endpoint.workers)
            except AgentError as exc:
                if not session.truncated:  # a failure, not the agent giving up at a turn or context limit
                    raise EnvStepError(str(exc)) from exc
                result = None
        finally:
            self.endpoint.close_session(session)
            traj.metrics.update(session.metrics())
        traj.timing["gen_s"] = time.perf_counter() - t0
        if session.calls == 0:
            raise EnvStepError("the agent made no model call through the endpoint (does it use the base URL and "
                               "API key it is given?)")
        if result is None:
            traj.status = Status.TRUNCATED
            traj.step_rewards.append(0.0)
            return
        t1 = time.perf_counter()
        _, reward, terminated, truncated, info = await self._step(result)
        self.info = info
        traj.timing["env_s"] = time.perf_counter() - t1
        traj.step_rewards.append(float(reward))
        if traj.turns:  # the agent's result is scored once: the reward of its last model call
            traj.turns[-1].reward = float(reward)
        traj.status = Status.TRUNCATED if session.truncated or truncated or not terminated else Status.FINISHED
        traj.success = bool(info.get("success", reward > 0))

    async def _discard_env(self) -> asyncio.Future | None:
        """Close a failed env in the background (it may be hung) and build a fresh one next episode."""
        env, self.env = self.env, None
        if env is None:
            return None
        return asyncio.get_running_loop().run_in_executor(self.executor, _close_quietly, env)

    async def close(self, timeout: float = 30.0) -> None:
        """Close the env and wait for it (bounded: a hung env is left to its thread)."""
        if self._prepared is not None:
            await _cancelled(self._prepared[1])
            self._prepared = None
        running = self._thread_call
        if running is not None and not running.done():
            # a reset or step of a cancelled episode (or prepared reset) still runs in its thread:
            # the env closes after it, not under it (a sandbox it is starting would be left behind)
            await asyncio.wait([running], timeout=timeout)
        closing = await self._discard_env()
        if closing is not None:
            try:
                async with asyncio.timeout(timeout):
                    await asyncio.shield(closing)
            except TimeoutError:
                log.warning("env %s did not close within %.0fs", self.env_id, timeout)


def _retrieved(future: asyncio.Future) -> None:
    """Mark a thread call's exception as seen: when its episode was cancelled meanwhile, the env
    was closed under it and nobody awaits the (expected) failure."""
    if not future.cancelled():
        future.exception()


async def _cancelled(task: asyncio.Task) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def _close_quietly(env) -> None:
    try:
        env.close()
    except Exception:  # a broken env may fail to close; it is already out of use
        pass
