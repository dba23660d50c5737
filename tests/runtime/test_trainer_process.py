"""The local runtime's trainer in a child process: same updates as in this process, weights
shared with no copy, errors and a dead child reported, nothing left running."""

import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from roll_agent.config_loader import load_config
from roll_agent.train.trainer import trainer_for_run
from roll_agent.runtime.trainer_process import ProcessTrainer, TrainerProcessError
from tests.train.test_policy_step import multi_turn_groups


@pytest.fixture
def cfg():
    return load_config(None, ["runtime.torch_threads=1", "trainer.micro_batch_size=3", "trainer.lr=0.01"])


@pytest.mark.slow
def test_child_trains_exactly_like_this_process_and_shares_its_weights(cfg, tiny_model_dir, tmp_path):
    here = trainer_for_run(cfg, tiny_model_dir)
    child = ProcessTrainer(cfg, tiny_model_dir, threads=1)
    try:
        assert child.version == 0 and child._proc.pid != os.getpid()
        for step in range(2):
            a, b = here.step(multi_turn_groups(step)), child.step(multi_turn_groups(step))
            assert child.version == here.version == step + 1
            for key in ("loss", "entropy", "grad_norm", "train_tokens"):
                assert a[key] == pytest.approx(b[key], rel=1e-5), key
        # named_weights are the child's parameters themselves: they moved with its optimizer steps
        for (name, p), (name2, q) in zip(here.named_weights(), child.named_weights()):
            assert name == name2
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)
        child.save(tmp_path / "ckpt")
        child.step(multi_turn_groups(3))
        child.load(tmp_path / "ckpt")
        assert child.version == 2
        # a failing call raises here with the child's traceback; the child goes on serving
        with pytest.raises(TrainerProcessError, match="failed in 'load'"):
            child.load(tmp_path / "missing")
        assert child.sft_step([t for g in multi_turn_groups(5) for t in g.trajectories], 1e-3)["sft_nll"] > 0
    finally:
        child.close()
    assert not child._proc.is_alive()


@pytest.mark.slow
def test_a_dead_trainer_process_fails_the_waiting_call(cfg, tiny_model_dir):
    child = ProcessTrainer(cfg, tiny_model_dir, threads=1)
    os.kill(child._proc.pid, signal.SIGKILL)
    child._proc.join(timeout=30)
    with pytest.raises(TrainerProcessError, match=r"died \(exit code -9\) during 'step'"):
        child.step(multi_turn_groups())
    child.close()


def _kill_the_child_once_it_starts() -> threading.Thread:
    def kill() -> None:
        while True:
            for proc in multiprocessing.active_children():
                if proc.name == "roll_agent-trainer":
                    os.kill(proc.pid, signal.SIGKILL)
                    return
            time.sleep(0.01)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


def _failure_after_kill(child: ProcessTrainer, call) -> tuple[BaseException | None, float]:
    """Freeze the child, start `call` (it waits on the frozen child), SIGKILL the child;
    returns what the call raised and how long after the kill it returned."""
    os.kill(child._proc.pid, signal.SIGSTOP)
    outcome: list = []

    def waiting() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            outcome.append(e)

    thread = threading.Thread(target=waiting, daemon=True)
    thread.start()
    time.sleep(0.5)
    assert thread.is_alive(), "the call returned while the child was frozen"
    killed = time.monotonic()
    os.kill(child._proc.pid, signal.SIGKILL)
    thread.join(timeout=30)
    assert not thread.is_alive(), "the call still waits 30 s after its child was killed"
    return outcome[0], time.monotonic() - killed


@pytest.fixture
def forked_twins(monkeypatch):
    """Each trainer child started here gets a twin: a process forked from this one while the
    pipe to the child is open (as a library forks its worker pool at any moment), so it holds
    a copy of the child's end of the pipe and outlives the child: the pipe stays open after
    the child dies, and only a wait on the child itself can notice."""
    from types import SimpleNamespace

    from roll_agent.runtime import trainer_process

    spawn, twins = trainer_process.mp.get_context("spawn"), []

    class Context:
        def __getattr__(self, name):
            return getattr(spawn, name)

        def Process(self, *args, **kwargs):  # noqa: N802 - multiprocessing's name
            pid = os.fork()  # the pipe exists (made before the process): the twin holds both ends
            if pid == 0:
                time.sleep(600)
                os._exit(0)
            twins.append(pid)
            return spawn.Process(*args, **kwargs)

    monkeypatch.setattr(trainer_process, "mp", SimpleNamespace(get_context=lambda kind: Context()))
    yield twins
    for pid in twins:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


@pytest.mark.slow
@pytest.mark.timeout(300)  # ~25 s here; the old pipe wait hung forever
def test_a_killed_child_fails_every_waiting_call_within_seconds_beside_a_ray_cluster(cfg, tiny_model_dir, tmp_path,
                                                                                     forked_twins):
    """Other processes of this parent (a Ray cluster started here, a forked twin holding the
    pipe) must not keep a call waiting on a dead child, at any call site."""
    ray = pytest.importorskip("ray")
    from tests.conftest import ray_cluster

    big_batch = [g for seed in range(400) for g in multi_turn_groups(seed)]
    assert len(pickle.dumps(big_batch)) > 1 << 20  # more than a pipe buffer holds: sent from a thread
    calls = {"step": lambda c: c.step(multi_turn_groups()), "big step": lambda c: c.step(big_batch),
             "save": lambda c: c.save(tmp_path / "ckpt"), "load": lambda c: c.load(tmp_path / "ckpt")}
    with ray_cluster(tmp_path):
        assert ray.is_initialized()
        start = time.monotonic()
        _kill_the_child_once_it_starts()
        with pytest.raises(TrainerProcessError, match=r"died \(exit code -9\) during 'start'"):
            ProcessTrainer(cfg, tiny_model_dir, threads=1)
        assert time.monotonic() - start < 120
        for name, call in calls.items():
            child = ProcessTrainer(cfg, tiny_model_dir, threads=1)
            if name == "load":
                child.save(tmp_path / "ckpt")
            try:
                error, after = _failure_after_kill(child, lambda: call(child))
            finally:
                child.close()
            assert isinstance(error, TrainerProcessError), (name, error)
            assert "died (exit code -9)" in str(error), (name, error)
            assert after < 10, f"{name}: the call failed {after:.1f}s after the kill"
    assert len(forked_twins) == 1 + len(calls)


SPLIT = max(1, len(os.sched_getaffinity(0)) // 2)


@pytest.mark.parametrize("overrides, wait_policy, expected", [
    ([], "PASSIVE", 0),  # the default, roll_agent imported before torch: torch's own threads in each process
    ([], None, SPLIT),  # OpenMP threads spin: the CPUs split between the two processes
    ([], "active", SPLIT),
    (["runtime.torch_threads=3"], "PASSIVE", 3),
    (["runtime.trainer_process=false"], None, 0),  # one process: torch's default, left alone
])
def test_the_local_runtime_splits_the_cpus_only_where_openmp_threads_spin(overrides, wait_policy, expected, tmp_path,
                                                                           monkeypatch):
    from roll_agent.runtime.local import LocalRuntime

    if wait_policy is None:
        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    else:
        monkeypatch.setenv("OMP_WAIT_POLICY", wait_policy)
    before = torch.get_num_threads()
    try:
        runtime = LocalRuntime(load_config(None, overrides), "unused", tmp_path)
        assert runtime.threads == expected
        assert torch.get_num_threads() == (expected or before)
    finally:
        torch.set_num_threads(before)


def test_importing_roll_agent_before_torch_makes_openmp_threads_sleep():
    code = "import os, roll_agent, torch; print(os.environ.get('OMP_WAIT_POLICY'))"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert first.stdout.strip() == "PASSIVE"
    late = subprocess.run([sys.executable, "-c", code.replace("roll_agent, torch", "torch, roll_agent")], env=env,
                          capture_output=True, text=True, check=True)
    assert late.stdout.strip() == "None"  # torch loaded OpenMP first: the policy is left as it was
    mine = subprocess.run([sys.executable, "-c", code], env={**env, "OMP_WAIT_POLICY": "ACTIVE"}, capture_output=True,
                          text=True, check=True)
    assert mine.stdout.strip() == "ACTIVE"
