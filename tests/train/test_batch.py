"""collate: trajectories into one padded TokenBatch, targets shifted by one."""

import pytest
import torch

from roll_agent.train.batch import collate
from roll_agent.types import Trajectory


def _traj(prompt: list[int], response: list[int], logprob: float) -> Trajectory:
    t = Trajectory()
    t.append(prompt, generated=False)
    t.append(response, generated=True, logprobs=[logprob] * len(response), versions=[0] * len(response))
    return t


def test_padding_masks_and_shifted_targets():
    batch = collate([_traj([1, 2, 3], [4, 5], -0.5), _traj([6], [7, 8, 9], -1.0)])
    assert batch.ids.tolist() == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 0]]
    # target j is token j + 1: trained where that token was sampled, with its sampler log-prob
    assert batch.loss_mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 0]]
    assert batch.behaviour_logprobs.tolist() == [[0, 0, -0.5, -0.5], [-1.0, -1.0, -1.0, 0]]
    assert batch.start == 0 and batch.num_targets == 4


def test_skip_untrained_starts_at_the_position_predicting_the_first_trained_token():
    full = collate([_traj([1, 2, 3, 4], [5, 6], -0.5), _traj([7, 8, 9], [10], -1.0)])
    narrow = collate([_traj([1, 2, 3, 4], [5, 6], -0.5), _traj([7, 8, 9], [10], -1.0)], skip_untrained=True)
    assert narrow.start == 2  # the earliest sampled token is at index 3, predicted by position 2
    assert narrow.num_targets == full.num_targets - 2 == narrow.loss_mask.shape[1]
    torch.testing.assert_close(narrow.loss_mask, full.loss_mask[:, 2:])
    torch.testing.assert_close(narrow.behaviour_logprobs, full.behaviour_logprobs[:, 2:])
    assert narrow.to("cpu").start == 2


def test_an_empty_batch_is_an_error():
    with pytest.raises(ValueError, match="at least one trajectory"):
        collate([])
