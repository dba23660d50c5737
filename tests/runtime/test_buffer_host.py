"""The buffer actor's bookkeeping (a plain class; no cluster needed): the episode ledger
the env workers report into, and what a dead worker incarnation leaves behind."""

import pytest

pytest.importorskip("ray")

from roll_agent.config import RolloutConfig  # noqa: E402
from roll_agent.rollout.accounting import OUTCOMES  # noqa: E402
from roll_agent.runtime.ray_hosts import BufferHost  # noqa: E402
from roll_agent.types import Group, Trajectory  # noqa: E402
from tests.conftest import run  # noqa: E402


def _identity(snap) -> bool:
    counts = snap.counts
    ended = sum(counts.get(k, 0) for k in OUTCOMES)
    return counts["started"] == ended + snap.in_flight


def test_a_dead_workers_in_flight_episodes_end_as_lost_and_its_places_come_back():
    cfg = RolloutConfig(num_env_groups=2, groups_per_batch=1, group_size=2, group_size_redundancy=1)

    async def scenario():
        host = BufferHost(cfg, version=0)
        live, dead = (0, 0), (1, 0)
        for owner in (live, dead):  # each plays a group of 3 episodes, its calls as a RemoteBuffer sends them
            await host.call_as(owner, "admit", (), {})
            await host.call_as(owner, "ledger.start", (3,), {})
        await host.call_as(live, "ledger.end", ("cancelled", 1), {})  # the redundant one
        await host.call_as(live, "put", (Group(0, 7, "sim", [Trajectory(group_id=0), Trajectory(group_id=0)]),), {})
        await host.call_as(dead, "ledger.end", ("env_error",), {"n": 1, "reason": "ValueError: boom\n  File env.py"})
        before = host.snapshot()
        assert before.in_flight == 2 + 2 and _identity(before)  # 2 waiting here, 2 running in the dead worker
        # what a checkpoint keeps: the episodes in flight never end in the resumed run
        assert before.state["episodes"]["cancelled"] == before.counts["cancelled"] + 4

        assert await host.release_owner(dead) == 2
        await host.call_as(dead, "ledger.end", ("cancelled", 2), {})  # a late call of the dead worker: already lost
        after = host.snapshot()
        assert after.counts["lost"] == 2 and after.in_flight == 2 and _identity(after)
        # why they ended reaches the driver with the counts: the env's error, the dead worker
        assert after.reasons == {"env_error/ValueError": 1, "lost/EnvWorkerDied": 2}
        assert after.examples["env_error/ValueError"].startswith("ValueError: boom")
        assert dead not in after.held and host.buffer.held == cfg.group_size  # only the waiting group's places
        batch = await host.get_batch(0)
        assert len(batch) == 1 and _identity(host.snapshot()) and host.snapshot().in_flight == 0

    run(scenario())
