"""The RL step computes logits only from the earliest trained token on (transformers'
`logits_to_keep`): the losses, metrics and updated weights must equal the full-logits path."""

import random

import pytest
import torch

from roll_agent.config import AlgorithmConfig, ModelConfig, TrainerConfig
from roll_agent.train.trainer import TorchTrainer
from roll_agent.types import Group, Trajectory


def multi_turn_groups(seed: int = 0) -> list[Group]:
    """Two groups of four episodes: different first-prompt lengths, tool results between turns."""
    rng = random.Random(seed)
    groups = []
    for g in range(2):
        trajs = []
        for i in range(4):
            t = Trajectory(group_id=g, reward=rng.random())
            for turn in range(rng.randint(1, 3)):
                t.append([rng.randrange(5, 300) for _ in range(rng.randint(3, 12))], generated=False)
                n = rng.randint(1, 6)
                t.append([rng.randrange(5, 300) for _ in range(n)], generated=True,
                         logprobs=[-rng.uniform(0.5, 4.0) for _ in range(n)], versions=[0] * n)
            trajs.append(t)
        groups.append(Group(g, g, "x", trajs))
    return groups


@pytest.mark.parametrize("updates_per_batch,entropy_coef,temperature", [(1, 0.0, 1.0), (2, 0.01, 0.7)])
def test_narrowed_logits_equal_full_logits(tiny_model_dir, updates_per_batch, entropy_coef, temperature):
    cfg = TrainerConfig(micro_batch_size=3, updates_per_batch=updates_per_batch, lr=1e-2)
    algo = AlgorithmConfig(entropy_coef=entropy_coef, kl_coef=0.05)
    narrow = TorchTrainer(tiny_model_dir, cfg, algo, ModelConfig(), temperature=temperature, seed=3)
    full = TorchTrainer(tiny_model_dir, cfg, algo, ModelConfig(), temperature=temperature, seed=3)
    full.narrow_logits = False
    trajs = [t for g in multi_turn_groups() for t in g.trajectories]
    assert narrow._tensors(trajs)["start"] >= 2 and full._tensors(trajs)["start"] == 0
    for step in range(2):
        a = narrow.step(multi_turn_groups(step))
        b = full.step(multi_turn_groups(step))
        for key in ("loss", "entropy", "is_weight_mean", "clip_frac", "kl", "grad_norm", "train_tokens"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
    # Adam's g / sqrt(v) magnifies float rounding in the rarely-hit embedding rows: a step is lr = 1e-2
    for (name, p), (_, q) in zip(narrow.model.named_parameters(), full.model.named_parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=5e-5, msg=name)
