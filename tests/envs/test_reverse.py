"""The single-turn letter-reversal env and its reward."""

import gymnasium
import pytest

import envs  # noqa: F401
from envs.reverse import score


@pytest.mark.parametrize(("letters", "answer", "reward"), [
    ("d o g", "g o d", 1.0),
    ("d o g", "g o x", 2 / 3),
    ("d o g", "g o d d", 3 / 4),  # extra letters cost their share
    ("d o g", "", 0.0),
    ("d o g", "god", 0.0),  # one token, not three letters
])
def test_score_is_the_share_of_right_positions(letters, answer, reward):
    assert score(letters, answer) == pytest.approx(reward)


def test_every_answer_ends_the_episode_with_the_env_reward():
    env = gymnasium.make("roll_agent/ReverseLetters-v0", min_letters=4, max_letters=4)
    obs, info = env.reset(seed=7)
    letters = obs.removeprefix("Reverse: ")
    assert len(letters.split()) == 4 and info["instructions"]
    _, reward, terminated, _, info = env.step(env.unwrapped.expert_action())
    assert terminated and reward == 1.0 and info["success"]
    env.reset(seed=7)
    _, reward, terminated, _, info = env.step(letters)  # not reversed
    assert terminated and reward == score(letters, letters) and not info["success"]


def test_bad_lengths_are_refused():
    with pytest.raises(ValueError, match="min_letters"):
        gymnasium.make("roll_agent/ReverseLetters-v0", min_letters=5, max_letters=2)
