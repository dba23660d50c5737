"""A user's own environment: guess a secret number with higher/lower hints.

Nothing here imports roll_agent. Registering with gymnasium is all it takes; a config
then names the env as `guess_number:GuessNumber-v0` and gymnasium imports this module
on demand.
"""

import re

import gymnasium
from gymnasium import spaces

ANSWER = re.compile(r"\s*(?:guess|answer)?[:\s]*(-?\d{1,6})\s*\.?\s*", re.IGNORECASE)
CHARSET = "".join(chr(c) for c in range(32, 127)) + "\n\t"


class GuessNumberEnv(gymnasium.Env):
    metadata = {"render_modes": []}

    def __init__(self, low: int = 1, high: int = 16, max_guesses: int = 6):
        self.low, self.high, self.max_guesses = low, high, max_guesses
        self.observation_space = spaces.Text(max_length=1000, charset=CHARSET)
        self.action_space = spaces.Text(max_length=100_000, charset=CHARSET)
        self._secret = low
        self._lo, self._hi, self._guesses = low, high, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._secret = int(self.np_random.integers(self.low, self.high + 1))
        self._lo, self._hi, self._guesses = self.low, self.high, 0
        instructions = (f"I think of a number from {self.low} to {self.high}. Each turn, answer with one number. "
                        "I say whether the secret is higher or lower.")
        return f"Guess a number from {self.low} to {self.high}.", {"instructions": instructions, "success": False,
                                                                 "invalid_action": False}

    def step(self, action):
        match = ANSWER.fullmatch(str(action))
        if match is None:
            return "Answer with one number.", 0.0, False, False, {"success": False, "invalid_action": True}
        guess = int(match.group(1))
        self._guesses += 1
        if guess == self._secret:
            return "Correct!", 1.0, True, False, {"success": True, "invalid_action": False}
        if guess < self._secret:
            self._lo = max(self._lo, guess + 1)
            hint = "higher"
        else:
            self._hi = min(self._hi, guess - 1)
            hint = "lower"
        truncated = self._guesses >= self.max_guesses
        return f"{guess} is wrong, the secret is {hint}.", 0.0, False, truncated, {"success": False, "invalid_action": False}

    def expert_action(self) -> str:
        """Binary search: used for the optional supervised warm-start."""
        return str((self._lo + self._hi) // 2)


gymnasium.register(id="GuessNumber-v0", entry_point=GuessNumberEnv)
