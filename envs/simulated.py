"""A simulated text env with a configurable step-latency distribution, failures and
hangs: for benchmarks and fault tests (never a training default).

Any action is accepted. The episode lasts `episode_len` steps (or a per-seed random
length in [min_len, episode_len]); reward is 1 when the action text contains
`rewarded_word`, else a seeded coin flip with `success_prob`, so group advantages are
non-trivial. A share `straggler_prob` of episodes straggle: every step of theirs takes
`tail_scale` times its drawn latency (drawn per episode and instance, so any env can
straggle). `astep` sleeps without blocking the event loop; `step` blocks its thread, for
testing that blocking envs run off the loop.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import threading

import gymnasium
from gymnasium import spaces

CHARSET = "".join(chr(c) for c in range(32, 127)) + "\n\t"
_instances = itertools.count()


class SimulatedEnvError(RuntimeError):
    pass


class SimulatedEnv(gymnasium.Env):
    metadata = {"render_modes": [], "free_text_actions": True}

    def __init__(self, latency: str = "none", mean_s: float = 0.0, std_s: float = 0.0, tail_scale: float = 10.0,
                 episode_len: int = 3, min_len: int | None = None, fail_prob: float = 0.0, hang_prob: float = 0.0,
                 hang_s: float = 3600.0, success_prob: float = 0.5, rewarded_word: str = "",
                 invalid_action_penalty: float = 0.0, async_step: bool = True, straggler_prob: float = 0.0):
        if latency not in ("none", "fixed", "normal", "longtail"):
            raise ValueError(f"latency={latency!r}: use none, fixed, normal or longtail")
        self.latency, self.mean_s, self.std_s, self.tail_scale = latency, mean_s, std_s, tail_scale
        self.episode_len = episode_len
        self.min_len = episode_len if min_len is None else min_len
        self.fail_prob, self.hang_prob, self.hang_s = fail_prob, hang_prob, hang_s
        self.success_prob, self.rewarded_word = success_prob, rewarded_word
        self.straggler_prob = straggler_prob
        self._straggling = False
        self.observation_space = spaces.Text(max_length=10_000, charset=CHARSET)
        self.action_space = spaces.Text(max_length=100_000, charset=CHARSET)
        self._rng = random.Random(0)
        self._t = 0
        self._latency_s = 0.0
        self._episodes = 0
        self._len = episode_len
        self._seed = 0
        if not async_step:
            self.astep = self.areset = None  # env managers then run reset() and step() in a thread
        # latency, failures and hangs vary per instance (envs of a group play the same seed but
        # are not in lockstep, and a fault is transient: the env's own infrastructure, not the task);
        # they are a function of (seed, step, instance), so runs are reproducible
        self._instance = next(_instances)
        self._closed = threading.Event()  # wakes a blocking step on close(), so no thread outlives the env

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._seed = 0 if seed is None else int(seed)
        self._rng = random.Random(self._seed)
        self._len = self._rng.randint(self.min_len, self.episode_len)
        self._t = 0
        self._latency_s = 0.0  # what this episode's steps waited, for its episode report
        self._episodes += 1
        self._straggling = (self.straggler_prob > 0 and random.Random(
            f"straggle-{self._seed}-{self._instance}-{self._episodes}").random() < self.straggler_prob)
        info = {"instructions": "Answer with any text. This env is simulated.", "success": False, "invalid_action": False}
        return f"task {self._seed} step 0", info

    def sample_latency(self, rng: random.Random) -> float:
        if self.latency == "none":
            return 0.0
        if self.latency == "fixed":
            return self.mean_s
        if self.latency == "normal":
            return max(0.0, rng.gauss(self.mean_s, self.std_s))
        # long tail: mostly around the mean, 5% of steps tail_scale times slower
        base = max(0.0, rng.gauss(self.mean_s, self.std_s))
        return base * self.tail_scale if rng.random() < 0.05 else base

    def _plan(self) -> tuple[float, str]:
        """Latency and fate of this step, drawn from the episode's own RNG stream."""
        latency = self.sample_latency(random.Random(f"{self._seed}-{self._t}-{self._instance}"))
        if self._straggling:
            latency *= self.tail_scale
        roll = random.Random(f"fault-{self._seed}-{self._t}-{self._instance}").random()
        fate = "fail" if roll < self.fail_prob else "hang" if roll < self.fail_prob + self.hang_prob else "ok"
        latency = self.hang_s if fate == "hang" else latency
        self._latency_s += latency
        return latency, fate

    def episode_report(self) -> dict:
        """What the episode's steps waited and whether it straggled (they differ between instances,
        so they stay out of info)."""
        return {"latency_s": round(self._latency_s, 6), "straggling": self._straggling}

    def _advance(self, action: str, fate: str):
        if fate == "fail":
            raise SimulatedEnvError(f"simulated failure at step {self._t} of task {self._seed}")
        self._t += 1
        done = self._t >= self._len
        reward = 0.0
        success = False
        if done:
            hit = bool(self.rewarded_word) and self.rewarded_word in str(action)
            success = hit or (not self.rewarded_word and self._rng.random() < self.success_prob)
            reward = 1.0 if success else 0.0
        info = {"success": success, "invalid_action": False}
        return f"task {self._seed} step {self._t}", reward, done, False, info

    def step(self, action: str):
        latency, fate = self._plan()
        if latency > 0 and self._closed.wait(latency):
            raise SimulatedEnvError("env closed during step")
        return self._advance(action, fate)

    async def areset(self, *, seed: int | None = None, options: dict | None = None):
        return self.reset(seed=seed, options=options)

    async def astep(self, action: str):
        latency, fate = self._plan()
        if latency > 0:
            await asyncio.sleep(latency)
        return self._advance(action, fate)

    def close(self):
        self._closed.set()
