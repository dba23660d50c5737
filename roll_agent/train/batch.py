"""The training batch: trajectories padded into tensors, targets shifted by one.

Position t's logits predict token t+1, so the per-target tensors (`loss_mask`,
`behaviour_logprobs`) are one shorter than `ids`. With `skip_untrained`, no position before
the earliest trained (loss-masked) token of the batch is kept: the model computes logits
(and their log-softmax, entropy and backward) only from `start`, the position that predicts
that token, and the per-target tensors begin there.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from roll_agent.types import Trajectory, Turn


@dataclass
class TokenBatch:
    ids: torch.Tensor  # [n, width] long, right-padded with 0 (causal attention: no mask needed)
    loss_mask: torch.Tensor  # [n, width - 1 - start] float: 1 where the target token is trained
    behaviour_logprobs: torch.Tensor  # [n, width - 1 - start] float: the sampler's log-prob of each target
    advantages: torch.Tensor  # [n, width - 1 - start] float: each target's advantage (0 when not given)
    start: int = 0  # the first position whose logits are computed

    @property
    def num_targets(self) -> int:
        return self.ids.shape[1] - 1 - self.start

    def to(self, device: torch.device | str) -> "TokenBatch":
        return dataclasses.replace(self, **{f.name: getattr(self, f.name).to(device)
                                            for f in dataclasses.fields(self) if f.name != "start"})


def collate(trajs: list[Trajectory], skip_untrained: bool = False,
            advantages: list[list[float]] | None = None) -> TokenBatch:
    """Pad `trajs` (token ids, loss masks, behaviour log-probs and, when given, one advantage per
    token of each: `token_advantages`) into one TokenBatch on the CPU."""
    if not trajs:
        raise ValueError("collate needs at least one trajectory")
    width = max(len(t.token_ids) for t in trajs)
    n = len(trajs)
    ids = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.float32)
    behav = torch.zeros((n, width), dtype=torch.float32)
    adv = torch.zeros((n, width), dtype=torch.float32)
    for i, t in enumerate(trajs):
        length = len(t.token_ids)
        ids[i, :length] = torch.tensor(t.token_ids)
        mask[i, :length] = torch.tensor(t.loss_mask, dtype=torch.float32)
        behav[i, :length] = torch.tensor(t.logprobs, dtype=torch.float32)
        if advantages is not None:
            adv[i, :length] = torch.tensor(advantages[i], dtype=torch.float32)
    start = max(0, min(first_trained(t.loss_mask) for t in trajs) - 1) if skip_untrained else 0
    return TokenBatch(ids, mask[:, 1 + start:], behav[:, 1 + start:], adv[:, 1 + start:], start)


def episode_turns(traj: Trajectory) -> list[Turn]:
    """The turns credit is given by: the episode's recorded turns, or, for an episode recorded
    without them (a trajectory built by hand), one turn per sample covering all of it, with the
    episode's reward on the last and a state key of its own (alone in any anchor group)."""
    if traj.turns:
        return traj.turns
    samples = traj.samples()
    return [Turn(k, 0, len(s.token_ids), f"untracked:{id(traj)}:{k}", traj.reward if k == len(samples) - 1 else 0.0)
            for k, s in enumerate(samples)]


def token_advantages(traj: Trajectory, turns: list[Turn], values: list[float]) -> list[list[float]]:
    """One advantage per token of each of the episode's samples: turn k's value on its sampled
    tokens, 0 elsewhere (prompts and observations are not trained)."""
    out = [[0.0] * len(s.token_ids) for s in traj.samples()]
    for turn, value in zip(turns, values):
        row = out[turn.sample]
        row[turn.start:turn.end] = [float(value)] * (turn.end - turn.start)
    return out


def first_trained(loss_mask: list[int]) -> int:
    """Index of the first loss-masked token (the length when there is none)."""
    return next((i for i, m in enumerate(loss_mask) if m), len(loss_mask))
