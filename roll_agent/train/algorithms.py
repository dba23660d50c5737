"""RL objective math for agent training: advantages, policy losses, KL, entropy, aggregation.

Pure functions on torch tensors; no model code lives here. The estimators (`grpo`, `rloo`,
`reinforce`, `turn`, `gigpo`) and losses (`ppo_loss`, ...) are the built-ins of the registries
`algorithm.advantage` and `algorithm.loss` name (roll_agent/registry.py); `turn_advantages` and
`policy_loss` call whichever is named, a user's own included, and check what it returns.
"""

from __future__ import annotations

import torch

from roll_agent.config import AGGREGATIONS
from roll_agent.registry import ADVANTAGES, LOSSES

EPISODE_ESTIMATORS = ("grpo", "rloo", "reinforce")  # one advantage per episode, every turn takes it

# exp() of a log-ratio above this overflows float32/bf16 on the way to the
# clip; an inf there turns the (zero) gradient of the clipped branch into NaN.
_MAX_LOG_RATIO = 20.0


def _check_choice(kind: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"unknown {kind} {value!r}; valid choices: {', '.join(choices)}")


# --------------------------------------------------------------------------- advantages


def compute_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    estimator: str,
    *,
    std_normalize: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Per-episode advantages [N] from scalar rewards [N] and task group ids [N] (the episode-level
    estimators; turn_advantages gives every estimator's per-turn values).

    grpo: (r - group mean) / (group std + eps), std unbiased; singleton groups -> 0.
    rloo: r - mean of the other episodes in the group; singleton groups -> 0.
    reinforce: r - batch mean, optionally / (batch std + eps).
    """
    _check_choice("episode-level advantage estimator", estimator, EPISODE_ESTIMATORS)
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_ids must both be 1-D of equal length, got "
            f"{tuple(rewards.shape)} and {tuple(group_ids.shape)}"
        )
    r = rewards.detach()
    if not r.is_floating_point():
        r = r.to(torch.get_default_dtype())
    if r.numel() == 0:
        return r.clone()

    if estimator == "reinforce":
        dev = r - r.mean()
        if not std_normalize:
            return dev
        # A batch of one has no spread; treat its std as 0 rather than NaN.
        std = r.std() if r.numel() > 1 else r.new_zeros(())
        return dev / (std + eps)

    # Map arbitrary (sparse, unsorted) ids to 0..G-1 so scatter-adds stay small.
    _, inv = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inv.max()) + 1
    count = torch.zeros(n_groups, dtype=r.dtype, device=r.device).index_add_(0, inv, torch.ones_like(r))
    total = torch.zeros_like(count).index_add_(0, inv, r)
    n = count[inv]
    dev = r - (total / count)[inv]  # exactly 0 for singleton groups

    if estimator == "rloo":
        # r_i - (S - r_i)/(n-1) == n/(n-1) * (r_i - mean); guard n=1 (dev is 0 there).
        return dev * n / (n - 1).clamp_min(1)

    # grpo. Two-pass variance (deviations first) avoids cancellation when
    # rewards are large and nearly equal.
    if not std_normalize:
        return dev
    sq = torch.zeros_like(count).index_add_(0, inv, dev * dev)
    std = (sq / (count - 1).clamp_min(1)).sqrt()[inv]
    return dev / (std + eps)


def discounted_returns(rewards: list[float], gamma: float) -> list[float]:
    """Return-to-go of each turn: G_t = r_t + gamma * G_{t+1}, G after the last turn = 0."""
    out, g = [0.0] * len(rewards), 0.0
    for t in range(len(rewards) - 1, -1, -1):
        g = rewards[t] + gamma * g
        out[t] = g
    return out


def turn_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    turn_rewards: list[list[float]],
    state_keys: list[list[str]],
    estimator: str,
    *,
    std_normalize: bool = True,
    gamma: float = 1.0,
    step_weight: float = 1.0,
    eps: float = 1e-6,
) -> list[torch.Tensor]:
    """Per-turn advantages by the estimator named `estimator` (roll_agent/registry.py: ADVANTAGES):
    for episode i a tensor [len(turn_rewards[i])] (docs/algorithms.md).

    `rewards` [N] and `group_ids` [N] are the episodes' returns and task groups, `turn_rewards[i]`
    and `state_keys[i]` episode i's turns in order (the reward the env gave for each, the state
    each was played from). Every estimator is called with these and the keyword options.
    """
    if not (len(turn_rewards) == len(state_keys) == rewards.numel()):
        raise ValueError(f"{rewards.numel()} episodes but {len(turn_rewards)} turn reward lists and "
                         f"{len(state_keys)} state key lists")
    out = ADVANTAGES.get(estimator)(rewards, group_ids, turn_rewards, state_keys, std_normalize=std_normalize,
                                    gamma=gamma, step_weight=step_weight, eps=eps)
    lengths = [len(turns) for turns in turn_rewards]
    if len(out) != len(lengths) or any(torch.as_tensor(a).numel() != n for a, n in zip(out, lengths)):
        raise ValueError(f"advantage estimator {estimator!r} returned {[torch.as_tensor(a).numel() for a in out]} "
                         f"values per episode for episodes of {lengths} turns: it must return one value a turn")
    dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    return [torch.as_tensor(a, dtype=dtype) for a in out]


def _every_turn(estimator: str, rewards, group_ids, turn_rewards, std_normalize, eps) -> list[torch.Tensor]:
    adv = compute_advantages(rewards, group_ids, estimator, std_normalize=std_normalize, eps=eps)
    return [adv[i].expand(len(turns)).clone() for i, turns in enumerate(turn_rewards)]


def grpo(rewards, group_ids, turn_rewards, state_keys, *, std_normalize=True, eps=1e-6, **_) -> list[torch.Tensor]:
    """Every turn takes its episode's grpo advantage (compute_advantages)."""
    return _every_turn("grpo", rewards, group_ids, turn_rewards, std_normalize, eps)


def rloo(rewards, group_ids, turn_rewards, state_keys, *, std_normalize=True, eps=1e-6, **_) -> list[torch.Tensor]:
    """Every turn takes its episode's rloo advantage (compute_advantages)."""
    return _every_turn("rloo", rewards, group_ids, turn_rewards, std_normalize, eps)


def reinforce(rewards, group_ids, turn_rewards, state_keys, *, std_normalize=True, eps=1e-6,
              **_) -> list[torch.Tensor]:
    """Every turn takes its episode's reinforce advantage (compute_advantages)."""
    return _every_turn("reinforce", rewards, group_ids, turn_rewards, std_normalize, eps)


def turn(rewards, group_ids, turn_rewards, state_keys, *, gamma=1.0, **_) -> list[torch.Tensor]:
    """G_t - the mean G_t of the group's episodes that made a turn t (G_t: the discounted
    return-to-go of turn t; a per-turn-index baseline)."""
    return _compare_returns(group_ids, turn_rewards, [list(range(len(r))) for r in turn_rewards], gamma,
                            base=[0.0] * len(turn_rewards), weight=1.0)


def gigpo(rewards, group_ids, turn_rewards, state_keys, *, std_normalize=True, gamma=1.0, step_weight=1.0,
          eps=1e-6, **_) -> list[torch.Tensor]:
    """The grpo advantage of the episode + step_weight * the step advantage: G_t minus the mean
    G of its anchor group (every turn of the task group played from the same state, repeats
    inside one episode included; a turn alone in its anchor group gets 0)."""
    base = compute_advantages(rewards, group_ids, "grpo", std_normalize=std_normalize, eps=eps).tolist()
    return _compare_returns(group_ids, turn_rewards, state_keys, gamma, base=base, weight=step_weight)


def _compare_returns(group_ids, turn_rewards, keys, gamma, *, base, weight) -> list[torch.Tensor]:
    """base[i] + weight * (G_t - the mean G of the turns of i's task group with the same key).
    Returns-to-go are compared in reward units, never divided by their spread: near-equal returns
    (winning paths one move apart) would otherwise become advantages as large as win against loss."""
    returns = [discounted_returns(r, gamma) for r in turn_rewards]
    members: dict[int, list[int]] = {}
    for i, gid in enumerate(group_ids.tolist()):
        members.setdefault(gid, []).append(i)
    out = [[0.0] * len(r) for r in returns]
    for episodes in members.values():
        comparable: dict[object, list[tuple[int, int]]] = {}
        for i in episodes:
            for t, key in enumerate(keys[i]):
                comparable.setdefault(key, []).append((i, t))
        for turns in comparable.values():
            mean = sum(returns[i][t] for i, t in turns) / len(turns)
            for i, t in turns:
                out[i][t] = base[i] + weight * (returns[i][t] - mean)
    return [torch.tensor(values) for values in out]


# --------------------------------------------------------------------------- policy losses


def policy_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    logp_behav: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    variant: str,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    is_cap: float = 2.0,
    rewards: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token policy-gradient loss [B, T] (0 where mask is 0) and detached diagnostics, by the
    loss named `variant` (roll_agent/registry.py: LOSSES).

    logp: current policy (with grad); logp_old: proximal policy; logp_behav: the policy that
    sampled the tokens; advantages [B, T]; rewards [B]: each row's episode return. The named loss
    is called with these, padding already replaced by 0 (never -inf or NaN), and returns the
    per-token loss and a dict that may hold "is_weight" (the weight applied to each token) and
    "clipped" (1.0 where a clip or truncation was active); both are masked here.
    """
    if not (logp.shape == logp_old.shape == logp_behav.shape == mask.shape):
        raise ValueError(
            "logp, logp_old, logp_behav and mask must share a shape, got "
            f"{tuple(logp.shape)}, {tuple(logp_old.shape)}, {tuple(logp_behav.shape)}, {tuple(mask.shape)}"
        )
    loss_fn = LOSSES.get(variant)
    keep = mask > 0
    zero = logp.new_zeros(())
    # Padding positions may hold -inf log-probs or NaN advantages. Replacing them
    # *before* any arithmetic keeps both the loss and its gradient exactly 0 there;
    # masking only the output would still leak NaN through backward (0 * inf).
    logp = torch.where(keep, logp, zero)
    logp_old = torch.where(keep, logp_old.detach(), zero)
    logp_behav = torch.where(keep, logp_behav.detach(), zero)
    adv = torch.where(keep, torch.broadcast_to(advantages.detach(), logp.shape), zero)
    loss, diag = loss_fn(logp, logp_old, logp_behav, adv, clip_low=clip_low, clip_high=clip_high, is_cap=is_cap,
                         rewards=rewards.detach().to(device=logp.device, dtype=logp.dtype))
    if loss.shape != logp.shape:
        raise ValueError(f"policy loss {variant!r} returned a loss of shape {tuple(loss.shape)} for tokens of shape "
                         f"{tuple(logp.shape)}: it must return one value a token")
    loss = torch.where(keep, loss, zero)
    fmask = keep.to(logp.dtype)
    diag = {key: value.detach() for key, value in diag.items()}
    diag["is_weight"] = diag.get("is_weight", torch.ones_like(logp)) * fmask
    diag["clipped"] = diag.get("clipped", torch.zeros_like(logp)).to(logp.dtype) * fmask
    return loss, diag


def ppo_loss(logp, logp_old, logp_behav, adv, *, clip_low, clip_high, is_cap, **_):
    """Decoupled PPO: -sg(min(pi_old/mu, is_cap)) * min(r*A, clip(r, 1-lo, 1+hi)*A), r = pi/pi_old.
    Off-policyness vs. the sampler is corrected by a fixed weight; the trust region is measured
    against the proximal policy only. Diagnostics add the ppo ratio ("ratio")."""
    ratio = torch.exp((logp - logp_old).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))
    w = torch.exp(logp_old - logp_behav).clamp(max=is_cap)
    surr = ratio * adv
    surr_clip = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    clipped = surr_clip < surr  # the clipped branch won -> zero gradient
    return -w * torch.minimum(surr, surr_clip), {"is_weight": w, "clipped": clipped, "ratio": ratio}


def tis_loss(logp, logp_old, logp_behav, adv, *, is_cap, **_):
    """Truncated importance sampling: -sg(min(pi/mu, is_cap)) * A * logp."""
    raw = torch.exp((logp - logp_behav).detach())
    w = raw.clamp(max=is_cap)
    return -w * adv * logp, {"is_weight": w, "clipped": raw > is_cap}


def cispo_loss(logp, logp_old, logp_behav, adv, *, clip_low, clip_high, **_):
    """-sg(clip(pi/mu, 1-lo, 1+hi)) * A * logp: unlike ppo, clipping only bounds the weight; the
    token keeps its gradient."""
    raw = torch.exp((logp - logp_behav).detach())
    w = raw.clamp(1.0 - clip_low, 1.0 + clip_high)
    return -w * adv * logp, {"is_weight": w, "clipped": (raw < 1.0 - clip_low) | (raw > 1.0 + clip_high)}


def topr_loss(logp, logp_old, logp_behav, adv, *, rewards, **_):
    """-A * logp on positive episodes (return > 0), -sg(clamp(pi/mu, 0, 1)) * A * logp otherwise."""
    raw = torch.exp((logp - logp_behav).detach())
    pos = torch.broadcast_to((rewards > 0).unsqueeze(-1) if rewards.dim() == logp.dim() - 1 else rewards > 0,
                             logp.shape)
    w = torch.where(pos, torch.ones_like(raw), raw.clamp(0.0, 1.0))
    return -w * adv * logp, {"is_weight": w, "clipped": ~pos & (raw > 1.0)}


# --------------------------------------------------------------------------- KL / entropy


def kl_k3(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || ref): exp(d) - d - 1 with d = logp_ref - logp."""
    d = logp_ref - logp
    # expm1(d) - d is accurate for small d where exp(d) - 1 cancels; the clamp
    # absorbs any remaining rounding so the estimate is never negative.
    return (torch.expm1(d) - d).clamp_min(0.0)


def entropy_from_log_softmax(logp: torch.Tensor) -> torch.Tensor:
    """Per-position entropy [...] from log-probabilities [..., V] (a log_softmax)."""
    # -inf logits (masked vocab) give p=0, logp=-inf; 0 * -inf would be NaN, so
    # floor logp at the dtype's min: p * logp is then exactly 0 with finite grads.
    logp = logp.clamp_min(torch.finfo(logp.dtype).min)
    return -(logp.exp() * logp).sum(dim=-1)


# --------------------------------------------------------------------------- aggregation


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """Reduce per-token values [B, T] to a scalar under mask [B, T].

    token-mean: sum(values*mask) / max(sum(mask), 1).
    seq-mean: mean over sequences with any masked token of their per-sequence token mean.
    """
    _check_choice("aggregation", mode, AGGREGATIONS)
    m = mask.to(values.dtype)
    # where() rather than values * mask so NaN/inf at padded positions cannot leak.
    masked = torch.where(mask > 0, values * m, values.new_zeros(()))
    if mode == "token-mean":
        return masked.sum() / m.sum().clamp_min(1.0)
    per_tok = m.sum(dim=-1)
    has_tok = (per_tok > 0).to(values.dtype)
    per_seq = masked.sum(dim=-1) / torch.where(per_tok > 0, per_tok, torch.ones_like(per_tok))
    return (per_seq * has_tok).sum() / has_tok.sum().clamp_min(1.0)
