"""Resets off the critical path: an env whose episode ended resets for its lane's next task at
once (rollout.prepare_next_reset), and the next episode starts from that reset."""

import asyncio
import threading
import time

import gymnasium
import pytest

from roll_agent.config import EnvSpec, RolloutConfig
from roll_agent.types import Status
from tests.conftest import run
from tests.rollout.harness import build, train_loop

RESETS: list[tuple[int, int]] = []  # (env instance, seed), in call order
EVENTS: list[str] = []  # "reset done <seed>", "closed": a CountingEnv's life in order
_LOCK = threading.Lock()


class CountingEnv(gymnasium.Env):
    """Two-step episodes; records each reset; a reset of a seed divisible by `fail_every` raises;
    a reset takes `reset_s` seconds (in its thread)."""

    metadata = {"render_modes": [], "free_text_actions": True}
    _instances = 0

    def __init__(self, fail_every: int = 0, reset_s: float = 0.0):
        self.observation_space = gymnasium.spaces.Text(max_length=100)
        self.action_space = gymnasium.spaces.Text(max_length=100)
        with _LOCK:
            self.instance = CountingEnv._instances
            CountingEnv._instances += 1
        self.fail_every, self.reset_s = fail_every, reset_s
        self.t = 0

    def reset(self, *, seed=None, options=None):
        with _LOCK:
            RESETS.append((self.instance, seed))
        if self.fail_every and seed % self.fail_every == 0:
            raise RuntimeError(f"reset of seed {seed} failed")
        time.sleep(self.reset_s)
        EVENTS.append(f"reset done {seed}")
        self.t = 0
        return f"task {seed}", {"instructions": "say anything"}

    def step(self, action):
        self.t += 1
        return f"step {self.t}", float(self.t == 2), self.t == 2, False, {}

    def close(self):
        EVENTS.append("closed")


gymnasium.register("tests/CountingReset-v0", entry_point=CountingEnv)
SPEC = EnvSpec(id="tests/CountingReset-v0", workers=0)


def play(formatter, rollout: RolloutConfig, steps: int, spec: EnvSpec = SPEC):
    RESETS.clear()
    stack = build(formatter, rollout, specs=[spec])

    async def go():
        try:
            return await train_loop(stack, steps=steps)
        finally:
            await stack.close()

    return stack, run(go())


CFG = dict(async_ratio=1, num_env_groups=2, groups_per_batch=2, group_size=2, group_size_redundancy=1, max_turns=3)


@pytest.mark.parametrize("prepare", [True, False])
def test_each_episode_starts_from_a_reset_of_its_own_seed(formatter, prepare):
    stack, consumed = play(formatter, RolloutConfig(**CFG, prepare_next_reset=prepare), steps=3)
    trained = [t for _, batch in consumed for g in batch for t in g.trajectories]
    assert len(trained) == 12 and all(t.status == Status.FINISHED for t in trained)
    for t in trained:  # the first prompt shows the task the group was drawn for
        assert f"task {t.seed}" in formatter.tokenizer.decode(t.token_ids[:t.prompt_len])
    for instance in {i for i, _ in RESETS}:  # an episode takes its prepared reset, never a second one
        seeds = [seed for i, seed in RESETS if i == instance]
        assert all(a != b for a, b in zip(seeds, seeds[1:])), seeds
    assert stack.stats().accounting()["accounting_ok"]


def test_the_next_episode_starts_from_the_reset_prepared_for_it(formatter):
    RESETS.clear()
    stack = build(formatter, RolloutConfig(**CFG), specs=[SPEC])

    async def go():
        manager = stack.env_manager("m", SPEC)
        try:
            first = await manager.run_episode(seed=5)
            manager.prepare(7)
            while len(RESETS) < 2:  # the reset runs in the background, with no episode waiting on it
                await asyncio.sleep(0.01)
            before = list(RESETS)
            second = await manager.run_episode(seed=7)
            after_second = list(RESETS)
            manager.prepare(9)  # prepared for a task that does not come: the episode resets for its own
            third = await manager.run_episode(seed=11)
            return first, second, third, before, after_second
        finally:
            await stack.close()

    first, second, third, before, after_second = run(go())
    instance = before[0][0]
    assert before == [(instance, 5), (instance, 7)]
    assert after_second == before  # the episode of seed 7 did not reset again
    assert RESETS[-1] == (instance, 11)
    for traj, seed in ((first, 5), (second, 7), (third, 11)):
        assert traj.status == Status.FINISHED
        assert f"task {seed}" in formatter.tokenizer.decode(traj.token_ids[:traj.prompt_len])


def test_a_prepared_reset_that_fails_ends_its_episode_as_env_error(formatter):
    spec = EnvSpec(id="tests/CountingReset-v0", kwargs={"fail_every": 2}, workers=0)
    stack, consumed = play(formatter, RolloutConfig(**CFG, prepare_next_reset=True), steps=3, spec=spec)
    assert all(g.seed % 2 for _, batch in consumed for g in batch)  # only odd seeds could complete
    counts = stack.buffer.ledger.counts
    assert counts["env_error"] > 0
    assert stack.stats().accounting()["accounting_ok"]


def test_closing_waits_for_a_prepared_reset_still_running_in_its_thread(formatter):
    """The run ends while an env prepares its next task (an ALFWorld load, a sandbox start): the
    env is closed after that reset returns, never under it (what it started is not left behind)."""
    spec = EnvSpec(id="tests/CountingReset-v0", kwargs={"reset_s": 0.5}, workers=0)
    stack = build(formatter, RolloutConfig(**CFG), specs=[spec])

    async def go():
        manager = stack.env_manager("m", spec)
        try:
            assert (await manager.run_episode(seed=5)).status == Status.FINISHED
            EVENTS.clear()
            manager.prepare(7)
            while not RESETS or RESETS[-1][1] != 7:  # the reset of seed 7 is under way in its thread
                await asyncio.sleep(0.01)
            await manager.close()
        finally:
            await stack.close()

    run(go())
    assert EVENTS == ["reset done 7", "closed"]
