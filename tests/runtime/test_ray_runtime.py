"""runtime.type=ray: the same run as the local runtime, with the components as Ray actors
on a local 2-CPU Ray cluster started and stopped by the run."""

import asyncio
import os
import signal

import pytest

ray = pytest.importorskip("ray")

from roll_agent.config import ConfigError  # noqa: E402
from roll_agent.config_loader import load_config  # noqa: E402
from roll_agent.metrics import read_rows  # noqa: E402
from roll_agent.run import train  # noqa: E402
from roll_agent.runtime import ray_hosts  # noqa: E402
from tests.conftest import processes_naming, run  # noqa: E402
from tests.test_run import SMALL  # noqa: E402

RAY = ["runtime.type=ray", "runtime.ray.num_cpus=2", "runtime.ray.start_timeout_s=60"]


def ray_cfg(tmp_path, *extra):
    return load_config(None, SMALL + RAY + [f"output_dir={tmp_path}", *extra])


def _ray_processes_of(out) -> list[int]:
    """Pids of processes still running from this run's Ray session (temp dir under `out`)."""
    return processes_naming(os.path.realpath(out / "ray"))


@pytest.mark.slow
@pytest.mark.timeout(900)  # two runs of up to 300 s each
def test_ray_run_trains_checkpoints_resumes_and_leaves_nothing_running(tmp_path):
    # the env in env worker processes (as TextWorld and ALFWorld run by default), inside the
    # env-worker actors and, for evaluation, beside the driver; turn-level advantages from the
    # turns that travel with the samples to the trainer actor
    cfg = ray_cfg(tmp_path, "max_steps=2", "warmup.sft_steps=2", "warmup.episodes_per_step=2",
                  "checkpoint.every=1", "checkpoint.keep_last=5", "algorithm.advantage=gigpo",
                  "envs=[{id: roll_agent/FrozenLake-v0, workers: 1}]")
    assert run(train(cfg), timeout=300) == 2
    rows = read_rows(tmp_path / "metrics.jsonl")
    steps = [r for r in rows if "loss" in r]
    assert [r["version"] for r in steps] == [1, 2]
    for r in steps:  # the local runtime's metrics, weights moved by the torch.distributed broadcast
        for key in ("reward_mean", "staleness_max", "episodes_started", "episodes_lost", "gen_tokens_per_s",
                    "train_tokens_per_s", "time_sync_s", "grad_norm"):
            assert key in r, key
        assert r["sync_bytes"] > 0 and r["episodes_lost"] == 0 and r["accounting_ok"]
        assert "proxy_request_failures" in r and "episodes_in_flight" in r
    assert [r["step"] for r in rows if "eval_success_rate" in r] == [0, 2]
    assert (tmp_path / "checkpoints" / "step_000002" / "model" / "config.json").exists()
    assert list((tmp_path / "ray").glob("session_*/logs")), "Ray's logs go under output_dir/ray"
    assert _ray_processes_of(tmp_path) == []

    resumed = ray_cfg(tmp_path, "max_steps=3", "resume=true")
    assert run(train(resumed), timeout=300) == 3
    steps = [r["step"] for r in read_rows(tmp_path / "metrics.jsonl") if "loss" in r]
    assert steps == [1, 2, 3]
    assert _ray_processes_of(tmp_path) == []


async def _first_step(out, training: asyncio.Task, after: int = 0) -> None:
    """Wait for the run's first training step after step `after`; a run that ended before it
    raises its own error."""
    path = out / "metrics.jsonl"
    while not (path.exists() and any("loss" in r and r["step"] > after for r in read_rows(path))):
        if training.done():
            training.result()
            raise AssertionError(f"the run ended before step {after + 1}")
        await asyncio.sleep(0.2)


def test_inprocess_weight_sync_is_refused_under_ray(tmp_path):
    from roll_agent.runtime.ray_runtime import RayRuntime

    cfg = ray_cfg(tmp_path, "weight_sync.type=inprocess")
    with pytest.raises(ConfigError, match="weight_sync.type=inprocess needs one process"):
        RayRuntime(cfg, "unused", tmp_path)


def test_ray_temp_dir_is_short_and_linked_from_a_long_output_dir(tmp_path):
    from roll_agent.runtime.ray_runtime import MAX_SOCKET_DIR, _temp_dir

    deep = tmp_path / ("x" * 80)
    temp = _temp_dir(deep)
    try:
        assert len(temp) <= MAX_SOCKET_DIR
        assert os.path.realpath(deep / "ray") == os.path.realpath(temp)
    finally:
        os.rmdir(temp)


async def _kill_engine_after_first_step(out, training) -> tuple[dict, int]:
    """SIGKILL the engine actor after the first training step; returns the proxy's stats
    once Ray restarted it and the proxy re-synced it, and the version the restarted engine
    then serves."""
    await _first_step(out, training)
    engine, proxy = ray.get_actor("engine-0"), ray.get_actor("proxy")
    os.kill(await engine.ping.remote(), signal.SIGKILL)
    while True:
        if training.done():  # the run ended before the restart: its own error, or a plain failure
            training.result()
            raise AssertionError("the run ended before the proxy saw the engine restarted")
        try:
            stats = (await proxy.apply.remote(ray_hosts.report)).stats
        except Exception:  # the proxy actor is gone: the run is ending (the check above says how)
            await asyncio.sleep(1.0)
            if not training.done():
                raise
            continue
        if stats.get("engine_restarts"):
            break
        await asyncio.sleep(0.2)
    while not training.done():  # the restart is counted before the re-sync: wait for the engine's weights
        try:
            served = (await engine.state.remote())["version"]
        except Exception:  # the run is ending: the check above says how
            await asyncio.sleep(1.0)
            continue
        if served >= 1:
            return stats, served
        await asyncio.sleep(0.2)
    training.result()
    raise AssertionError("the run ended before the restarted engine was re-synced")


@pytest.mark.slow
def test_killed_engine_is_restarted_resynced_and_no_episode_is_lost(tmp_path):
    cfg = ray_cfg(tmp_path, "max_steps=4")

    async def scenario():
        training = asyncio.create_task(train(cfg))
        stats, served = await _kill_engine_after_first_step(tmp_path, training)
        return await training, stats, served

    final, stats, served = run(scenario(), timeout=300)
    assert final == 4
    assert served >= 1  # the restarted engine itself serves trained weights, not the base model's
    # the kill hit requests in flight (lost, re-issued), or an idle engine that the next answer
    # (at its initial weights' version) or the next sync (a new pid) found restarted
    assert stats["engine_restarts"] == 1
    assert stats["version"] >= 1  # re-synced to the served version, not the base model's 0
    rows = [r for r in read_rows(tmp_path / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert sum(r["episodes_lost"] for r in rows) == 0
    assert _ray_processes_of(tmp_path) == []


@pytest.mark.slow
def test_deepspeed_trainer_runs_as_the_trainer_actor(tmp_path):
    """trainer.type=deepspeed under ray: a DeepSpeed world of one in the trainer actor; its full
    weights reach the engines through the object store (the broadcast group would replace
    DeepSpeed's process group)."""
    pytest.importorskip("deepspeed", reason="the `deepspeed` extra is not installed")
    cfg = ray_cfg(tmp_path, "max_steps=2", "trainer.type=deepspeed", "trainer.deepspeed.zero_stage=2")
    assert run(train(cfg), timeout=400) == 2
    steps = [r for r in read_rows(tmp_path / "metrics.jsonl") if "loss" in r]
    assert [r["version"] for r in steps] == [1, 2]
    assert all(r["sync_bytes"] > 0 and r["accounting_ok"] for r in steps)
    assert (tmp_path / "checkpoints" / "step_000002" / "deepspeed").is_dir()
    assert _ray_processes_of(tmp_path) == []


def test_broadcast_sync_is_refused_beside_deepspeed_under_ray(tmp_path):
    from roll_agent.runtime.ray_runtime import RayRuntime

    cfg = ray_cfg(tmp_path, "trainer.type=deepspeed", "weight_sync.type=broadcast")
    with pytest.raises(ConfigError, match="use auto or object_store"):
        RayRuntime(cfg, "unused", tmp_path)
