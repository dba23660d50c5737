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
    assert narrow.batch(trajs).start >= 2 and full.batch(trajs).start == 0
    for step in range(2):
        a = narrow.step(multi_turn_groups(step))
        b = full.step(multi_turn_groups(step))
        for key in ("loss", "entropy", "is_weight_mean", "logprob_diff_mean", "clip_frac", "kl", "grad_norm",
                    "train_tokens"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
    # Adam's g / sqrt(v) magnifies float rounding in the rarely-hit embedding rows: a step is lr = 1e-2
    for (name, p), (_, q) in zip(narrow.model.named_parameters(), full.model.named_parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=5e-5, msg=name)


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean"])
def test_samples_without_advantage_get_no_backward_and_the_gradient_is_unchanged(tiny_model_dir, aggregation):
    """A group whose rewards are all equal has advantage 0: only a forward pass (metrics) runs for
    it, and the accumulated gradient equals the plain one (every sample through autograd,
    the loss normalised over all generated tokens)."""
    from roll_agent.train import algorithms as alg

    cfg = TrainerConfig(micro_batch_size=3, lr=1e-30, max_grad_norm=1e9)  # the step moves nothing: read p.grad
    algo = AlgorithmConfig(aggregation=aggregation, kl_coef=0.0)  # KL would need every sample's backward
    trainer = TorchTrainer(tiny_model_dir, cfg, algo, ModelConfig(), seed=3)
    groups = multi_turn_groups(7)
    for t in groups[1].trajectories:
        t.reward = 0.5  # all equal: advantage 0
    backward_rows = []
    real_backward = trainer._backward
    trainer._backward = lambda loss: (backward_rows.append(loss), real_backward(loss))
    metrics = trainer.step(groups)
    assert len(backward_rows) == 2  # 4 samples with an advantage in micro-batches of 3; none for the rest
    got = {name: p.grad.clone() for name, p in trainer.model.named_parameters()}

    trajs = [t for g in groups for t in g.trajectories]
    rewards = torch.tensor([t.reward for t in trajs])
    adv = alg.compute_advantages(rewards, torch.tensor([t.group_id for t in trajs]), "grpo", std_normalize=True)
    assert adv[4:].abs().sum() == 0 and adv[:4].abs().sum() > 0
    trainer.model.zero_grad()
    batch = trainer.batch(trajs)
    logp, _ = trainer.logprobs(batch)
    loss_tok, _ = alg.policy_loss(logp, logp.detach(), batch.behaviour_logprobs, adv[:, None].expand_as(logp),
                                  batch.loss_mask,
                                  "ppo", clip_low=0.2, clip_high=0.28, is_cap=2.0,
                                  rewards=torch.tensor([t.reward for t in trajs]))
    alg.aggregate(loss_tok, batch.loss_mask, aggregation).backward()  # the whole batch at once
    for name, p in trainer.model.named_parameters():
        torch.testing.assert_close(got[name], p.grad, rtol=1e-4, atol=1e-7, msg=name)
    assert metrics["entropy"] > 0  # the metrics still cover every sample


def test_proximal_log_probs_line_up_across_micro_batches_with_other_starts(tiny_model_dir):
    """updates_per_batch > 1: pi_old is computed in one micro-batch layout and read in another.
    A long-prompt episode first batched with long prompts (a late start) and then beside a short
    one (an early start) must still get its own log-probs at every trained position."""
    from roll_agent.train.policy import _stack_rows

    trainer = TorchTrainer(tiny_model_dir, TrainerConfig(micro_batch_size=2, updates_per_batch=2),
                           AlgorithmConfig(kl_coef=0.0), ModelConfig(), seed=0)
    rng = random.Random(1)
    trajs = []
    for prompt_len in (30, 25, 4, 6):
        t = Trajectory(group_id=0, reward=rng.random())
        t.append([rng.randrange(5, 300) for _ in range(prompt_len)], generated=False)
        t.append([rng.randrange(5, 300) for _ in range(5)], generated=True, logprobs=[-1.0] * 5, versions=[0] * 5)
        trajs.append(t)
    old = trainer._proximal_logps(trajs)  # micro-batches [0, 1] (start 24) and [2, 3] (start 3)
    for idx in ([0, 2], [3, 1], [1, 0]):
        batch = trainer.batch([trajs[i] for i in idx])
        with torch.no_grad():
            direct, _ = trainer.logprobs(batch)
        stacked = _stack_rows([old[i] for i in idx], batch.start, direct.shape[1])
        keep = batch.loss_mask > 0
        assert keep.sum() == 10
        torch.testing.assert_close(stacked[keep], direct[keep], rtol=1e-5, atol=1e-5)


def test_logprob_diff_is_the_mean_gap_between_trainer_and_sampler_per_trained_token(tiny_model_dir):
    """On-policy samples (the sampler's log-probs are the trainer's own) read ~0; a sampler off
    by 0.5 nats on every token reads 0.5: the metric that shows a weight sync that missed."""
    trainer = TorchTrainer(tiny_model_dir, TrainerConfig(micro_batch_size=3, lr=1e-30), AlgorithmConfig(kl_coef=0.0),
                           ModelConfig(), seed=3)

    def groups(offset: float) -> list[Group]:
        out = multi_turn_groups()
        trajs = [t for g in out for t in g.trajectories]
        with torch.no_grad():
            batch = trainer.batch(trajs)
            logp, _ = trainer.logprobs(batch)
        for row, t in zip(logp, trajs):  # row j scores token start + 1 + j
            t.logprobs = [float(row[j - 1 - batch.start]) + offset if m else 0.0
                          for j, m in enumerate(t.loss_mask)]
        return out

    assert trainer.step(groups(0.0))["logprob_diff_mean"] < 1e-5
    assert trainer.step(groups(0.5))["logprob_diff_mean"] == pytest.approx(0.5, abs=1e-4)


def test_a_rows_log_probs_do_not_depend_on_the_padding_beside_it(tiny_model_dir):
    """Rows are right-padded and the model runs without an attention mask (causal attention: a
    token never sees the padding after it): a short episode batched beside a long one gets the
    log-probs it gets alone, at every position."""
    trainer = TorchTrainer(tiny_model_dir, TrainerConfig(), AlgorithmConfig(kl_coef=0.0), ModelConfig(), seed=0)
    trainer.narrow_logits = False  # every position compared
    rng = random.Random(2)
    trajs = []
    for prompt_len, response_len in ((40, 9), (5, 3)):
        t = Trajectory(group_id=0, reward=1.0)
        t.append([rng.randrange(5, 300) for _ in range(prompt_len)], generated=False)
        t.append([rng.randrange(5, 300) for _ in range(response_len)], generated=True,
                 logprobs=[-1.0] * response_len, versions=[0] * response_len)
        trajs.append(t)
    with torch.no_grad():
        together, _ = trainer.logprobs(trainer.batch(trajs))
        alone, _ = trainer.logprobs(trainer.batch(trajs[1:]))
    n = alone.shape[1]
    assert together.shape[1] > n
    torch.testing.assert_close(together[1, :n], alone[0], rtol=1e-5, atol=1e-6)


def test_a_sample_with_an_id_outside_the_vocabulary_is_refused_and_the_rest_train(tiny_model_dir):
    """The trainer's defence behind the agent endpoint's check: an episode holding a token id the
    embedding has no row for (or a negative one) is left out of the step and named; the step
    trains the others exactly as it would without it, and its capture indices still point at
    the batch's own samples."""
    cfg, algo = TrainerConfig(micro_batch_size=3, lr=1e-2), AlgorithmConfig(kl_coef=0.0)
    clean = TorchTrainer(tiny_model_dir, cfg, algo, ModelConfig(), temperature=1.0, seed=3)
    guarded = TorchTrainer(tiny_model_dir, cfg, algo, ModelConfig(), temperature=1.0, seed=3)
    vocab = guarded.model.get_input_embeddings().num_embeddings
    groups = multi_turn_groups()
    bad = []
    for token in (vocab + 10**6, -5):
        t = Trajectory(group_id=7, reward=1.0, env_id=f"agent-{token}")
        t.append([3, token, 4], generated=False)
        t.append([5, 6], generated=True, logprobs=[-1.0, -1.0], versions=[0, 0])
        bad.append(t)
    hostile = [Group(7, 7, "x", bad), *groups]  # the refused group comes first: every index shifts
    metrics = guarded.step(hostile, capture=[2, 9])
    reference = clean.step(multi_turn_groups(), capture=[0, 7])
    assert len(metrics["refused_episodes"]) == 2
    assert "outside the model's vocabulary" in metrics["refused_episodes"][0]
    assert "refused_episodes" not in reference
    assert sorted(metrics["trainer_logprobs"]) == [2, 9]
    assert metrics["trainer_logprobs"][2] == pytest.approx(reference["trainer_logprobs"][0])
    assert metrics["trainer_logprobs"][9] == pytest.approx(reference["trainer_logprobs"][7])
    assert metrics["loss"] == pytest.approx(reference["loss"], rel=1e-5)
    for p, q in zip(guarded.model.parameters(), clean.model.parameters()):
        torch.testing.assert_close(p, q)


def test_each_turn_trains_with_its_own_advantage(tiny_model_dir):
    """gigpo (mean only, gamma 1) on one group of two episodes that share their first state:
    episode advantages +-0.5, the first turns' anchor group adds +-0.5, the second turns are alone
    (0). At the first update (ratio 1, sampler = trainer) the ppo loss of a token is -A, so the
    step's token-mean loss is minus the mean of the per-token advantages: the values reached
    the tokens of their own turns."""
    from roll_agent.types import Turn

    algo = AlgorithmConfig(advantage="gigpo", std_normalize=False, gamma=1.0, kl_coef=0.0)
    trainer = TorchTrainer(tiny_model_dir, TrainerConfig(micro_batch_size=4, lr=1e-3), algo, ModelConfig(),
                           temperature=1.0, seed=0)
    trajs = []
    for reward, (first, second), key in ((1.0, (3, 1), "s1"), (0.0, (1, 2), "s2")):
        t = Trajectory(group_id=0, reward=reward)
        t.append([1, 2, 3], generated=False)
        t.turns.append(Turn(0, 3, 3 + first, "s0", 0.0))
        t.append(list(range(10, 10 + first)), generated=True, logprobs=[0.0] * first, versions=[0] * first)
        t.append([4, 5], generated=False)
        start = len(t.token_ids)
        t.turns.append(Turn(0, start, start + second, key, reward))
        t.append(list(range(20, 20 + second)), generated=True, logprobs=[0.0] * second, versions=[0] * second)
        trajs.append(t)
    logp, _ = trainer.logprobs(trainer.batch(trajs))  # the sampler's log-probs are the trainer's own
    for row, t in zip(logp.tolist(), trajs):
        for j in range(1, len(t.token_ids)):
            if t.loss_mask[j]:
                t.logprobs[j] = row[j - 1 - trainer.batch(trajs).start]
    metrics = trainer.step([Group(0, 0, "x", trajs)])
    # per token: episode 1: 3 x (0.5 + 0.5), 1 x 0.5; episode 2: 1 x (-0.5 - 0.5), 2 x -0.5
    assert metrics["loss"] == pytest.approx(-(3 * 1.0 + 0.5 - 1.0 - 2 * 0.5) / 7, abs=1e-5)
    assert metrics["advantage_abs_mean"] == pytest.approx(((3 + 0.5) / 4 + (1 + 1) / 3) / 2)
