"""Hand-computed checks for roll_agent.train.algorithms.

Expected numbers are written out or derived with plain `math` arithmetic here,
never with the module's own helpers.
"""

import math

import pytest
import torch
from torch.testing import assert_close

from roll_agent.config import AGGREGATIONS
from roll_agent.registry import ADVANTAGES, LOSSES
from roll_agent.train.algorithms import (
    EPISODE_ESTIMATORS,
    aggregate,
    compute_advantages,
    discounted_returns,
    entropy_from_log_softmax,
    kl_k3,
    policy_loss,
    turn_advantages,
)

F64 = torch.float64
LN = math.log


def t(x, **kw):
    return torch.tensor(x, dtype=F64, **kw)


# --------------------------------------------------------------------------- advantages
# Groups (ids deliberately sparse and interleaved):
#   id 3 -> rewards [1, 0, 2]  mean 1,   unbiased std sqrt((0+1+1)/2) = 1
#   id 0 -> rewards [5]        singleton
#   id 9 -> rewards [0, 1]     mean 0.5, unbiased std sqrt((.25+.25)/1) = sqrt(.5)
REWARDS = [1.0, 5.0, 0.0, 0.0, 2.0, 1.0]
GROUPS = [3, 0, 3, 9, 3, 9]
EPS = 1e-6


def _adv(estimator, **kw):
    return compute_advantages(t(REWARDS), torch.tensor(GROUPS), estimator, **kw)


def test_grpo_std_normalized():
    s9 = math.sqrt(0.5)
    expected = [0.0 / (1 + EPS), 0.0, -1.0 / (1 + EPS), -0.5 / (s9 + EPS), 1.0 / (1 + EPS), 0.5 / (s9 + EPS)]
    assert _adv("grpo").tolist() == pytest.approx(expected, abs=1e-12)


def test_grpo_mean_only():
    assert _adv("grpo", std_normalize=False).tolist() == pytest.approx([0.0, 0.0, -1.0, -0.5, 1.0, 0.5])


def test_grpo_constant_group_is_zero_not_nan():
    adv = compute_advantages(t([2.0, 2.0, 2.0]), torch.tensor([1, 1, 1]), "grpo")
    assert adv.tolist() == [0.0, 0.0, 0.0]


def test_rloo_leave_one_out():
    # id 3: 1-(0+2)/2=0, 0-(1+2)/2=-1.5, 2-(1+0)/2=1.5 ; id 9: 0-1=-1, 1-0=1 ; id 0: 0
    expected = [0.0, 0.0, -1.5, -1.0, 1.5, 1.0]
    assert _adv("rloo").tolist() == pytest.approx(expected)
    # rloo never divides by a std
    assert _adv("rloo", std_normalize=False).tolist() == pytest.approx(expected)


def test_reinforce_batch_baseline():
    mean = sum(REWARDS) / 6  # 1.5
    dev = [r - mean for r in REWARDS]
    std = math.sqrt(sum(d * d for d in dev) / 5)  # unbiased: sqrt(17.5 / 5)
    assert std == pytest.approx(math.sqrt(3.5))
    assert _adv("reinforce").tolist() == pytest.approx([d / (std + EPS) for d in dev])
    assert _adv("reinforce", std_normalize=False).tolist() == pytest.approx([-0.5, 3.5, -1.5, -1.5, 0.5, -0.5])


def test_advantages_float32_and_single_episode():
    adv = compute_advantages(torch.tensor([1.0, 3.0]), torch.tensor([0, 0]), "grpo")
    assert adv.dtype == torch.float32
    assert_close(adv, torch.tensor([-1.0, 1.0]) / (math.sqrt(2.0) + EPS))
    for est in EPISODE_ESTIMATORS:
        one = compute_advantages(torch.tensor([4.0]), torch.tensor([0]), est)
        assert one.tolist() == [0.0]
    for est in ADVANTAGES.names():  # a lone episode of one turn has nothing to be compared with
        one = turn_advantages(torch.tensor([4.0]), torch.tensor([0]), [[4.0]], [["s"]], est)
        assert one[0].tolist() == [0.0]


def test_unknown_estimator_names_choices():
    with pytest.raises(ValueError, match="grpo.*rloo.*reinforce"):
        compute_advantages(t([1.0]), torch.tensor([0]), "gae")


# --------------------------------------------------------------------------- turn-level advantages
# docs/algorithms.md's worked example. Task group 0 has three episodes, group 1 one; gamma 0.5.
#   A: states s0 s1 s2     rewards 0 0 1    R 1  G = [0.25, 0.5, 1]
#   B: states s0 s1 s3     rewards 0 0 0    R 0  G = [0, 0, 0]        (truncated: no reward at all)
#   C: states s0 s4 s0 s1  rewards 0 0 0 1  R 1  G = [0.125, 0.25, 0.5, 1]   (s0 twice: two members)
#   D: states s0           rewards 1        R 1  G = [1]  (group 1: its s0 is not group 0's)
TURN_REWARDS = [[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0], [1.0]]
KEYS = [["s0", "s1", "s2"], ["s0", "s1", "s3"], ["s0", "s4", "s0", "s1"], ["s0"]]
EPISODE_GROUPS = [0, 0, 0, 1]


def _turn_adv(estimator, **kw):
    rewards = t([sum(r) for r in TURN_REWARDS])
    out = turn_advantages(rewards, torch.tensor(EPISODE_GROUPS), TURN_REWARDS, KEYS, estimator, gamma=0.5, **kw)
    return [a.tolist() for a in out]


def test_discounted_returns():
    assert discounted_returns([0.0, 0.0, 1.0], 0.5) == [0.25, 0.5, 1.0]
    assert discounted_returns([-0.1, 0.0, 1.0], 1.0) == pytest.approx([0.9, 1.0, 1.0])
    assert discounted_returns([], 0.9) == []


@pytest.mark.parametrize("estimator", EPISODE_ESTIMATORS)
def test_episode_estimators_give_every_turn_the_episode_advantage(estimator):
    per_episode = compute_advantages(t([1.0, 0.0, 1.0, 1.0]), torch.tensor(EPISODE_GROUPS), estimator)
    for turns, a in zip(_turn_adv(estimator), per_episode.tolist()):
        assert turns == [a] * len(turns)  # exactly, not approximately


def test_gigpo_mean_only_by_hand():
    # episode level (grpo, mean only): mean R of group 0 = 2/3; D alone -> 0
    ea, eb, ec = 1 / 3, -2 / 3, 1 / 3
    # anchor s0 in group 0: A0 .25, B0 0, C0 .125, C2 .5 -> mean .21875
    # anchor s1: A1 .5, B1 0, C3 1 -> mean .5; s2, s3, s4 and group 1's s0 are alone -> 0
    expected = [[ea + 0.03125, ea + 0.0, ea],
                [eb - 0.21875, eb - 0.5, eb],
                [ec - 0.09375, ec, ec + 0.28125, ec + 0.5],
                [0.0]]
    for got, want in zip(_turn_adv("gigpo", std_normalize=False), expected):
        assert got == pytest.approx(want, abs=1e-7)


def test_gigpo_episode_part_std_normalized_step_part_in_reward_units():
    """std_normalize divides the episode part (grpo) by the group's std; the step part stays in
    reward units whatever it says, scaled by step_weight."""
    sd = lambda xs: math.sqrt(sum((x - sum(xs) / len(xs)) ** 2 for x in xs) / (len(xs) - 1))  # noqa: E731
    e = [(r - 2 / 3) / (sd([1, 0, 1]) + EPS) for r in (1, 0, 1)]
    w = 0.3
    expected = [[e[0] + w * 0.03125, e[0], e[0]],
                [e[1] - w * 0.21875, e[1] - w * 0.5, e[1]],
                [e[2] - w * 0.09375, e[2], e[2] + w * 0.28125, e[2] + w * 0.5],
                [0.0]]
    for got, want in zip(_turn_adv("gigpo", step_weight=w), expected):
        assert got == pytest.approx(want, abs=1e-6)


def test_near_equal_returns_give_small_step_advantages():
    """Two winning paths, one a move longer: with gamma 0.95 their returns from the shared start
    are 0.95 and 0.9025, and their step advantages +-0.02375: not +-0.71, as dividing by the
    anchor group's spread would make them (the episode part is 0: both won)."""
    out = turn_advantages(t([1.0, 1.0]), torch.tensor([0, 0]), [[0.0, 1.0], [0.0, 0.0, 1.0]],
                          [["s", "a"], ["s", "b", "c"]], "gigpo", gamma=0.95)
    assert out[0].tolist() == pytest.approx([0.02375, 0.0]) and out[1].tolist() == pytest.approx([-0.02375, 0, 0])


def test_gigpo_with_one_turn_each_from_one_state_adds_the_reward_deviation():
    """With one turn per episode every anchor group is the task group at its start, where the
    return is the reward: the step part is r - mean r, so mean-only gigpo = 2 * mean-only grpo."""
    rewards = t(REWARDS)
    grpo = compute_advantages(rewards, torch.tensor(GROUPS), "grpo", std_normalize=False)
    gigpo = turn_advantages(rewards, torch.tensor(GROUPS), [[r] for r in REWARDS], [["start"]] * 6, "gigpo",
                            std_normalize=False)
    assert [a.item() for a in gigpo] == pytest.approx((2 * grpo).tolist(), abs=1e-9)


def test_turn_return_to_go_against_the_groups_mean_at_that_turn():
    # group 0 at turn 0: G = .25, 0, .125 (mean .125); turn 1: .5, 0, .25 (mean .25); turn 2: 1, 0, .5
    # (mean .5); turn 3: C alone; D alone. std_normalize does not change it (reward units)
    expected = [[0.125, 0.25, 0.5], [-0.125, -0.25, -0.5], [0.0, 0.0, 0.0, 0.0], [0.0]]
    assert _turn_adv("turn") == [pytest.approx(e) for e in expected]
    assert _turn_adv("turn", std_normalize=False) == [pytest.approx(e) for e in expected]


def test_an_episode_without_turns_has_no_advantages():
    """A member that made no model call (nothing sampled) has no turns: it still counts in the
    group's episode baseline."""
    out = turn_advantages(t([1.0, 0.0]), torch.tensor([0, 0]), [[1.0], []], [["a"], []], "gigpo",
                          std_normalize=False)
    assert out[0].tolist() == pytest.approx([0.5 + 0.0]) and out[1].tolist() == []


# --------------------------------------------------------------------------- policy losses


def _run(variant, logp, logp_old, logp_behav, adv, mask=None, **kw):
    lp = t(logp, requires_grad=True)
    mask = torch.ones_like(lp) if mask is None else t(mask)
    kw.setdefault("rewards", torch.zeros(lp.shape[0], dtype=lp.dtype))
    loss, diag = policy_loss(lp, t(logp_old), t(logp_behav), t(adv), mask, variant, **kw)
    loss.sum().backward()
    return loss.detach(), lp.grad, diag


def test_ppo_values_grads_clip_and_cap():
    # per token: (A, r = pi/pi_old, raw pi_old/mu)
    #  (0,0) A=+1 r=1.1 raw 1.5 -> inside clip, w=1.5
    #  (0,1) A=+2 r=1.5 raw 3.0 -> r>1.28 clipped, IS cap engages w=2
    #  (1,0) A=-1 r=0.5 raw 0.5 -> r<0.8 with A<0: clipped, w=0.5
    #  (1,1) A=-1 r=1.5 raw 1.0 -> r>1.28 but A<0: unclipped branch wins, w=1
    old = [[-1.0, -0.5], [-2.0, -0.3]]
    r = [[1.1, 1.5], [0.5, 1.5]]
    raw = [[1.5, 3.0], [0.5, 1.0]]
    adv = [[1.0, 2.0], [-1.0, -1.0]]
    logp = [[old[i][j] + LN(r[i][j]) for j in range(2)] for i in range(2)]
    behav = [[old[i][j] - LN(raw[i][j]) for j in range(2)] for i in range(2)]
    loss, grad, diag = _run("ppo", logp, old, behav, adv)

    w = [[1.5, 2.0], [0.5, 1.0]]
    expected_loss = [
        [-1.5 * 1.1 * 1.0, -2.0 * 1.28 * 2.0],
        [-0.5 * (0.8 * -1.0), -1.0 * (1.5 * -1.0)],
    ]
    # d/dlogp: -w*A*r on the unclipped branch, 0 on the clipped one
    expected_grad = [[-1.5 * 1.0 * 1.1, 0.0], [0.0, -1.0 * -1.0 * 1.5]]
    assert_close(loss, t(expected_loss))
    assert_close(grad, t(expected_grad))
    assert_close(diag["is_weight"], t(w))
    assert_close(diag["ratio"], t(r))
    assert diag["clipped"].tolist() == [[0.0, 1.0], [1.0, 0.0]]
    assert not diag["is_weight"].requires_grad and not diag["clipped"].requires_grad


def test_ppo_custom_clip_range():
    # clip_low=0.1, clip_high=0.1: r=1.15 with A=+1 is now clipped at 1.1
    loss, grad, diag = _run("ppo", [[LN(1.15)]], [[0.0]], [[0.0]], [[1.0]], clip_low=0.1, clip_high=0.1)
    assert loss.item() == pytest.approx(-1.1)
    assert grad.item() == 0.0
    assert diag["clipped"].item() == 1.0


def test_tis_values_grads_and_cap():
    # pi/mu = [0.5, 1.5, 3.0]; cap 2 -> w = [0.5, 1.5, 2.0]
    logp = [[-1.0, -2.0, -0.5]]
    behav = [[-1.0 - LN(0.5), -2.0 - LN(1.5), -0.5 - LN(3.0)]]
    adv = [[1.0, -2.0, 0.5]]
    loss, grad, diag = _run("tis", logp, [[0.0, 0.0, 0.0]], behav, adv)
    w = [0.5, 1.5, 2.0]
    assert_close(loss, t([[-w[0] * 1.0 * -1.0, -w[1] * -2.0 * -2.0, -w[2] * 0.5 * -0.5]]))
    assert_close(grad, t([[-w[0] * 1.0, -w[1] * -2.0, -w[2] * 0.5]]))  # -w*A
    assert_close(diag["is_weight"], t([w]))
    assert diag["clipped"].tolist() == [[0.0, 0.0, 1.0]]


def test_tis_ignores_logp_old():
    a = _run("tis", [[-1.0]], [[0.0]], [[-1.0]], [[1.0]])
    b = _run("tis", [[-1.0]], [[-5.0]], [[-1.0]], [[1.0]])
    assert_close(a[0], b[0])
    assert_close(a[1], b[1])


def test_cispo_values_grads_clipped_keeps_gradient():
    # pi/mu = [0.5, 1.1, 1.5] -> clipped to [0.8, 1.1, 1.28]
    logp = [[-1.0, -2.0, -0.5]]
    behav = [[-1.0 - LN(0.5), -2.0 - LN(1.1), -0.5 - LN(1.5)]]
    adv = [[1.0, 1.0, -1.0]]
    loss, grad, diag = _run("cispo", logp, [[0.0, 0.0, 0.0]], behav, adv)
    w = [0.8, 1.1, 1.28]
    assert_close(loss, t([[-0.8 * 1.0 * -1.0, -1.1 * 1.0 * -2.0, -1.28 * -1.0 * -0.5]]))
    # unlike ppo, clipped tokens still get -w*A
    assert_close(grad, t([[-0.8, -1.1, 1.28]]))
    assert_close(diag["is_weight"], t([w]))
    assert diag["clipped"].tolist() == [[1.0, 0.0, 1.0]]


def test_topr_positive_and_negative_episodes():
    # row 0 positive: plain -A*logp whatever pi/mu is (3.0, 0.5)
    # row 1 negative: w = clamp(pi/mu, 0, 1) with pi/mu = (2.0, 0.25) -> (1, 0.25)
    logp = [[-1.0, -2.0], [-0.5, -3.0]]
    behav = [[-1.0 - LN(3.0), -2.0 - LN(0.5)], [-0.5 - LN(2.0), -3.0 - LN(0.25)]]
    adv = [[1.0, 1.0], [-1.0, -1.0]]
    loss, grad, diag = _run("topr", logp, [[0.0, 0.0], [0.0, 0.0]], behav, adv, rewards=t([1.0, 0.0]))
    assert_close(loss, t([[1.0, 2.0], [-1.0 * -1.0 * -0.5, -0.25 * -1.0 * -3.0]]))
    assert_close(grad, t([[-1.0, -1.0], [1.0, 0.25]]))
    assert_close(diag["is_weight"], t([[1.0, 1.0], [1.0, 0.25]]))
    assert diag["clipped"].tolist() == [[0.0, 0.0], [1.0, 0.0]]


@pytest.mark.parametrize("variant", LOSSES.names())
def test_mask_zeroes_loss_and_grad(variant):
    # Masked slots hold garbage (-inf logp, NaN advantage): must give exactly 0 loss
    # and 0 grad, and leave the unmasked tokens identical to an unpadded run.
    inf, nan = float("inf"), float("nan")
    logp = t([[-1.0, -inf, -0.7], [-0.2, -0.4, -inf]], requires_grad=True)
    old = t([[-1.1, 0.0, -0.6], [-0.3, -0.5, 50.0]])
    behav = t([[-0.9, -inf, -0.8], [-0.1, -0.45, -50.0]])
    adv = t([[1.0, nan, -2.0], [0.5, -1.0, nan]])
    mask = t([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    rewards = t([1.0, 0.0])  # topr: row 0 a positive episode, row 1 not
    loss, diag = policy_loss(logp, old, behav, adv, mask, variant, rewards=rewards)
    loss.sum().backward()
    assert torch.isfinite(loss).all() and torch.isfinite(logp.grad).all()
    off = mask == 0
    assert loss[off].tolist() == [0.0, 0.0]
    assert logp.grad[off].tolist() == [0.0, 0.0]
    assert diag["is_weight"][off].tolist() == [0.0, 0.0] and diag["clipped"][off].tolist() == [0.0, 0.0]

    on = ~off
    lp2 = logp.detach().masked_fill(off, -1.0).requires_grad_(True)
    ref, _ = policy_loss(lp2, old.masked_fill(off, -1.0), behav.masked_fill(off, -1.0),
                         adv.masked_fill(off, 0.0), torch.ones_like(mask), variant, rewards=rewards)
    ref.sum().backward()
    assert_close(loss[on], ref[on].detach())
    assert_close(logp.grad[on], lp2.grad[on])


def test_unknown_policy_loss_names_choices():
    with pytest.raises(ValueError, match="ppo.*tis.*cispo.*topr"):
        _run("grpo", [[-1.0]], [[0.0]], [[-1.0]], [[1.0]])


# --------------------------------------------------------------------------- kl / entropy


def test_kl_k3_hand_values():
    logp = t([-1.0, -2.0, -0.5, -3.0])
    ref = t([-1.0 + LN(2.0), -2.0 - LN(2.0), -0.5, -2.0])  # d = ln2, -ln2, 0, 1
    expected = [2.0 - LN(2.0) - 1.0, 0.5 + LN(2.0) - 1.0, 0.0, math.e - 1.0 - 1.0]
    out = kl_k3(logp, ref)
    assert out.tolist() == pytest.approx(expected, abs=1e-12)
    assert out[2].item() == 0.0


def test_kl_k3_nonnegative_and_zero_when_equal():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(64, 32, generator=g)
    b = a + 1e-4 * torch.randn(64, 32, generator=g)  # tiny d is where exp(d)-d-1 would round below 0
    c = torch.randn(64, 32, generator=g) * 3
    assert (kl_k3(a, b) >= 0).all() and (kl_k3(a, c) >= 0).all()
    assert (kl_k3(a, a) == 0).all()


def test_kl_k3_gradient():
    # d/dlogp [exp(d) - d - 1], d = ref - logp  ->  1 - exp(d)
    lp = t([-1.0], requires_grad=True)
    kl_k3(lp, t([-1.0 + LN(2.0)])).sum().backward()
    assert lp.grad.item() == pytest.approx(1.0 - 2.0)


def entropy_of_logits(logits: torch.Tensor) -> torch.Tensor:
    """What the trainer computes from its logits (roll_agent/train/policy.py)."""
    return entropy_from_log_softmax(torch.log_softmax(logits, dim=-1))


def test_entropy_uniform_is_log_v():
    v = 7
    out = entropy_of_logits(torch.zeros(2, 3, v, dtype=F64) + 5.0)
    assert out.shape == (2, 3)
    assert_close(out, torch.full((2, 3), math.log(v), dtype=F64))


def test_entropy_peaked_and_two_class():
    peaked = t([[[100.0, 0.0, 0.0, 0.0], [0.0, 0.0, -1e4, 1e4]]])
    assert entropy_of_logits(peaked).abs().max().item() < 1e-30
    p, q = 0.25, 0.75  # logits [0, ln 3]
    out = entropy_of_logits(t([[[0.0, LN(3.0)]]]))
    assert out.item() == pytest.approx(-(p * math.log(p) + q * math.log(q)))


def test_entropy_neg_inf_logits_finite():
    x = t([[[0.0, 0.0, float("-inf")]]], requires_grad=True)
    out = entropy_of_logits(x)
    assert out.item() == pytest.approx(math.log(2.0))
    out.sum().backward()
    assert torch.isfinite(x.grad).all()


# --------------------------------------------------------------------------- aggregate

VALUES = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]]
RAGGED = [[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]


def test_aggregate_token_mean():
    assert aggregate(t(VALUES), t(RAGGED), "token-mean").item() == pytest.approx((1 + 2 + 4) / 3)


def test_aggregate_seq_mean_skips_empty_rows():
    # row0 mean 1.5, row1 mean 4, row2 has no tokens and is excluded
    assert aggregate(t(VALUES), t(RAGGED), "seq-mean").item() == pytest.approx((1.5 + 4.0) / 2)


@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_aggregate_all_masked_is_zero_and_ignores_nan(mode):
    assert aggregate(t(VALUES), torch.zeros(3, 3, dtype=F64), mode).item() == 0.0
    vals = t([[1.0, float("nan")], [float("inf"), 3.0]], requires_grad=True)
    out = aggregate(vals, t([[1.0, 0.0], [0.0, 1.0]]), mode)
    assert out.item() == pytest.approx(2.0)
    out.backward()
    # token-mean: 1/2 each; seq-mean: (1/1)/2 each
    assert vals.grad.tolist() == [[0.5, 0.0], [0.0, 0.5]]


def test_unknown_aggregation_names_choices():
    with pytest.raises(ValueError, match="token-mean.*seq-mean"):
        aggregate(t(VALUES), t(RAGGED), "seq-sum")
