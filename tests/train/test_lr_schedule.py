"""`trainer.lr_schedule`: hand-computed learning rates, and the trainer's steps use them."""

import math

import pytest

from roll_agent.config import AlgorithmConfig, Config, ConfigError, ModelConfig, TrainerConfig
from roll_agent.config_loader import load_config
from roll_agent.train.trainer import trainer_for_run
from roll_agent.train.lr_schedule import lr_at
from roll_agent.train.trainer import TorchTrainer
from tests.train.test_policy_step import multi_turn_groups


def test_constant_with_warmup():
    cfg = TrainerConfig(lr=0.4, lr_warmup_steps=4)
    assert [lr_at(cfg, s) for s in range(6)] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.4, 0.4])


def test_linear_decays_to_the_floor_after_warmup():
    cfg = TrainerConfig(lr=0.1, lr_schedule="linear", lr_warmup_steps=2, lr_decay_steps=4, min_lr_ratio=0.5)
    # warmup 0.05, 0.1; then progress 0, 1/2, 1 (and past the horizon it stays at the floor)
    assert [lr_at(cfg, s) for s in range(6)] == pytest.approx([0.05, 0.1, 0.1, 0.075, 0.05, 0.05])


def test_cosine():
    cfg = TrainerConfig(lr=1.0, lr_schedule="cosine", lr_decay_steps=4)
    half = [0.5 * (1 + math.cos(math.pi * p)) for p in (0, 0.25, 0.5, 0.75, 1.0)]
    assert [lr_at(cfg, s) for s in range(5)] == pytest.approx(half)
    assert half[1] == pytest.approx(0.853553, abs=1e-6) and half[4] == 0.0


def test_bad_schedule_values_are_config_errors():
    with pytest.raises(ConfigError, match="Did you mean 'cosine'"):
        load_config(overrides=["trainer.lr_schedule=cosin"])
    with pytest.raises(ConfigError, match="min_lr_ratio"):
        load_config(overrides=["trainer.min_lr_ratio=2"])


def test_trainer_steps_follow_the_schedule(tiny_model_dir):
    cfg = TrainerConfig(micro_batch_size=4, lr=0.1, lr_schedule="linear", lr_warmup_steps=2, lr_decay_steps=4,
                        min_lr_ratio=0.5)
    trainer = TorchTrainer(tiny_model_dir, cfg, AlgorithmConfig(kl_coef=0.0), ModelConfig(), seed=0)
    trainer.sft_step([t for g in multi_turn_groups() for t in g.trajectories], lr=0.3)  # its own lr, then the RL one
    seen = []
    for step in range(4):
        metrics = trainer.step(multi_turn_groups(step))
        assert metrics["lr"] == trainer.optimizer.param_groups[0]["lr"]
        seen.append(metrics["lr"])
    assert seen == pytest.approx([0.05, 0.1, 0.1, 0.075])


def test_run_decays_over_max_steps(tiny_model_dir):
    """`trainer_for_run` (both runtimes build the trainer there) gives the schedule the run's horizon;
    a trainer built directly without one is told what is missing."""
    cfg = Config(max_steps=7, trainer=TrainerConfig(lr_schedule="cosine"))
    assert trainer_for_run(cfg, tiny_model_dir).cfg.lr_decay_steps == 7
    with pytest.raises(ConfigError, match="lr_decay_steps"):
        TorchTrainer(tiny_model_dir, TrainerConfig(lr_schedule="cosine"), AlgorithmConfig(kl_coef=0.0))
