"""The local runtime's trainer in a child process: same updates as in this process, weights
shared with no copy, errors and a dead child reported, nothing left running."""

import os
import signal

import pytest
import torch

from roll_agent.config import load_config
from roll_agent.runtime.local import trainer_of
from roll_agent.runtime.trainer_process import ProcessTrainer, TrainerProcessError
from tests.train.test_policy_step import multi_turn_groups


@pytest.fixture
def cfg():
    return load_config(None, ["runtime.torch_threads=1", "trainer.micro_batch_size=3", "trainer.lr=0.01"])


@pytest.mark.slow
def test_child_trains_exactly_like_this_process_and_shares_its_weights(cfg, tiny_model_dir, tmp_path):
    here = trainer_of(cfg, tiny_model_dir)
    child = ProcessTrainer(cfg, tiny_model_dir)
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
        child.save(tmp_path / "ckpt", {"note": 1})
        assert child.load(tmp_path / "ckpt") == {"note": 1} and child.version == 2
        # a failing call raises here with the child's traceback; the child goes on serving
        with pytest.raises(TrainerProcessError, match="failed in 'load'"):
            child.load(tmp_path / "missing")
        assert child.sft_step([t for g in multi_turn_groups(5) for t in g.trajectories], 1e-3)["sft_nll"] > 0
    finally:
        child.close()
    assert not child._proc.is_alive()


@pytest.mark.slow
def test_a_dead_trainer_process_fails_the_waiting_call(cfg, tiny_model_dir):
    child = ProcessTrainer(cfg, tiny_model_dir)
    os.kill(child._proc.pid, signal.SIGKILL)
    child._proc.join(timeout=30)
    with pytest.raises(TrainerProcessError, match=r"died \(exit code -9\) during 'step'"):
        child.step(multi_turn_groups())
    child.close()
