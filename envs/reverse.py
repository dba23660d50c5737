"""A single-turn string transformation with a verifiable reward: reverse a few letters.

The observation is `Reverse: d o g`; the answer is the letters in reverse order, separated
by spaces (`g o d`). Every text is an answer and ends the episode; the reward is the share
of positions that hold the right letter (so a near miss earns part of the reward, and
GRPO groups get a graded signal), 1.0 for the exact reversal. `score` is the reward on
its own, for trainers that take a reward function instead of an env.
"""

from __future__ import annotations

import string

import gymnasium

INSTRUCTIONS = "Write the given letters in reverse order, separated by spaces."
LETTERS = string.ascii_lowercase


def score(letters: str, answer: str) -> float:
    """Share of positions of the reversed `letters` (space separated) that `answer` gets right."""
    target = letters.split()[::-1]
    given = str(answer).split()
    hits = sum(a == b for a, b in zip(given, target))
    return hits / max(len(target), len(given), 1)


class ReverseLettersEnv(gymnasium.Env):
    metadata = {"render_modes": [], "free_text_actions": True}

    def __init__(self, min_letters: int = 3, max_letters: int = 6):
        if not 1 <= min_letters <= max_letters:
            raise ValueError(f"need 1 <= min_letters <= max_letters, got {min_letters}, {max_letters}")
        self.min_letters, self.max_letters = min_letters, max_letters
        self.observation_space = gymnasium.spaces.Text(256, charset=string.printable)
        self.action_space = gymnasium.spaces.Text(10_000, charset=string.printable)
        self.letters = ""

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        n = int(self.np_random.integers(self.min_letters, self.max_letters + 1))
        self.letters = " ".join(LETTERS[i] for i in self.np_random.integers(0, len(LETTERS), size=n))
        return f"Reverse: {self.letters}", {"instructions": INSTRUCTIONS, "success": False, "invalid_action": False}

    def step(self, action: str):
        reward = score(self.letters, action)
        return "Done.", reward, True, False, {"success": reward == 1.0, "invalid_action": False}

    def expert_action(self) -> str:
        return " ".join(self.letters.split()[::-1])
