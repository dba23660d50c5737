"""SampleBuffer.get_batch: the fresh groups in the order they completed, stale ones dropped and
counted, and a wait that is cancelled (the controller's watchdog) takes nothing with it."""

import asyncio

from roll_agent.config import RolloutConfig
from roll_agent.rollout.buffer import SampleBuffer
from roll_agent.types import Group, Status, Trajectory
from tests.conftest import run


def _group(group_id: int, version: int) -> Group:
    traj = Trajectory(group_id=group_id, status=Status.FINISHED)
    traj.append([1, 2], generated=False)
    traj.append([3], generated=True, logprobs=[-0.5], versions=[version])
    return Group(group_id, seed=group_id, env_tag="t", trajectories=[traj, traj])


def _buffer() -> SampleBuffer:
    return SampleBuffer(RolloutConfig(async_ratio=1, num_env_groups=2, groups_per_batch=2, group_size=2,
                                      group_size_redundancy=0))


def test_a_cancelled_wait_for_a_batch_leaves_its_groups_for_the_next():
    buffer = _buffer()

    async def go():
        for _ in range(3):
            await buffer.admit()
        await buffer.put(_group(0, 0))
        waiting = asyncio.create_task(buffer.get_batch(0))
        await asyncio.sleep(0.01)  # one group here, the batch needs two: it waits
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        assert len(buffer) == 1 and buffer.ledger.counts[Status.FINISHED.value] == 0
        await buffer.put(_group(1, 0))
        return await buffer.get_batch(0)

    batch = run(go())
    assert [g.group_id for g in batch] == [0, 1]
    assert buffer.ledger.counts[Status.FINISHED.value] == 4 and buffer.held == 2


def test_stale_groups_are_dropped_counted_and_their_places_freed():
    buffer = _buffer()

    async def go():
        for _ in range(3):
            await buffer.admit()
        for group_id, version in ((0, 0), (1, 3), (2, 3)):
            await buffer.put(_group(group_id, version))
        return await buffer.get_batch(3)  # trains version 4: group 0 (version 0) is 3 > async_ratio old

    batch = run(go())
    assert [g.group_id for g in batch] == [1, 2]
    assert buffer.stats["groups_dropped_stale"] == 1
    assert buffer.ledger.counts[Status.STALE_DROPPED.value] == 2 and buffer.held == 0
