"""The text-env contract shared by the built-in games, and gymnasium's toy-text games as text envs.

`TextGame` owns everything the contract fixes (text spaces, lenient parsing of the
model's raw output, invalid actions, the step limit, the info fields), so a game only
says how to start an episode, apply one action word and render its state.
`ToyTextEnv` adapts Taxi, CliffWalking and Blackjack; FrozenLake has its own env
(`envs.frozen_lake`) because it draws a new map per seed.
"""

from __future__ import annotations

import functools
import re
import string
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium
from gymnasium.envs.toy_text import blackjack

ACTION_MAX_CHARS = 10_000
OBS_MAX_CHARS = 8_192
# Observations are plain ASCII so any tokenizer (even a tiny byte-level one) reads them.
PRINTABLE = string.printable


@functools.lru_cache(maxsize=None)
def _word_pattern(words: tuple[str, ...]) -> re.Pattern[str]:
    # Letters-only lookarounds: "leftover" is not "left", but "left." and "<a>left</a>" are.
    # re.ASCII keeps unicode case folding (e.g. the long s) from forging action words.
    alternatives = "|".join(sorted(map(re.escape, words), key=len, reverse=True))
    return re.compile(rf"(?<![A-Za-z])(?:{alternatives})(?![A-Za-z])", re.IGNORECASE | re.ASCII)


def parse_action(text: Any, words: Sequence[str]) -> str | None:
    """The last action word in `text` (case-insensitive, whole word), or None if there is none."""
    matches = _word_pattern(tuple(words)).findall(text if isinstance(text, str) else str(text))
    return matches[-1].lower() if matches else None


class TextGame(gymnasium.Env):
    """Base of the built-in text games: subclasses set `actions`, `instructions` and the hooks."""

    metadata = {"render_modes": ["ansi"]}
    actions: tuple[str, ...] = ()
    instructions: str = ""

    def __init__(
        self,
        invalid_action_penalty: float = 0.0,
        max_steps: int | None = None,
        render_mode: str | None = None,
    ):
        if max_steps is not None and max_steps < 1:
            raise ValueError(f"max_steps must be >= 1 or None, got {max_steps}")
        if render_mode not in (None, *self.metadata["render_modes"]):
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}")
        self.observation_space = gymnasium.spaces.Text(OBS_MAX_CHARS, charset=PRINTABLE)
        self.action_space = gymnasium.spaces.Text(ACTION_MAX_CHARS, charset=PRINTABLE)
        self.invalid_action_penalty = float(invalid_action_penalty)
        self.max_steps = max_steps
        self.render_mode = render_mode
        self._steps = 0
        self._solved = False

    # -- hooks -------------------------------------------------------------------------
    def _new_episode(self, seed: int | None) -> None:
        """Set up a fresh episode; `self.np_random` is already seeded."""
        raise NotImplementedError

    def _apply(self, action: str) -> tuple[float, bool, bool]:
        """Apply one valid action word; returns (reward, terminated, success)."""
        raise NotImplementedError

    def _render(self) -> str:
        raise NotImplementedError

    # -- gymnasium API -----------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._steps = 0
        self._solved = False
        self._new_episode(seed)
        return self._render(), {**self._info(invalid=False), "instructions": self.instructions}

    def step(self, action: Any):
        word = parse_action(action, self.actions)
        self._steps += 1
        if word is None:
            reward, terminated = self.invalid_action_penalty, False
            obs = f"Invalid action. {self._valid_hint()}\n{self._render()}"
        else:
            reward, terminated, self._solved = self._apply(word)
            obs = self._render()
        # Invalid actions count as steps too, so a model that never answers properly still ends.
        truncated = not terminated and self.max_steps is not None and self._steps >= self.max_steps
        return obs, float(reward), bool(terminated), bool(truncated), self._info(word is None)

    def render(self) -> str | None:
        return self._render() if self.render_mode == "ansi" else None

    # -- helpers -----------------------------------------------------------------------
    def _valid_hint(self) -> str:
        return f"Answer with one word: {', '.join(self.actions[:-1])} or {self.actions[-1]}."

    def _info(self, invalid: bool) -> dict[str, Any]:
        # A fresh list each call: callers may keep and mutate what they are given. The state key
        # is the game's own render, so an invalid action's turn (its observation starts with
        # "Invalid action.") is played from the same state as a valid one's (turn-level credit).
        return {"success": self._solved, "invalid_action": invalid, "admissible_actions": list(self.actions),
                "state_key": self._render()}


# ---------------------------------------------------------------------------------------
# gymnasium toy-text games
# ---------------------------------------------------------------------------------------


def _first_registered(*ids: str) -> str:
    """The first of `ids` this gymnasium has (versions differ between releases)."""
    for env_id in ids:
        if env_id in gymnasium.registry:
            return env_id
    raise gymnasium.error.NameNotFound(f"none of {ids} is registered in this gymnasium")


def plan_first_action(env: Any, is_goal: Callable[[float, bool], bool]) -> int | None:
    """First action of a shortest path to a goal transition (BFS over the tabular model `env.P`).

    Each action is planned with its most likely outcome, which is exact for the default,
    deterministic dynamics. Transitions back to an already seen state (e.g. the cliff,
    which resets to the start) are never on a shortest path, so the plan is also safe.
    """
    start = int(env.s)
    first: dict[int, int | None] = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        for action, transitions in env.P[state].items():
            _, nxt, reward, terminated = max(transitions, key=lambda t: t[0])
            head = action if first[state] is None else first[state]
            if is_goal(reward, terminated):
                return head
            if not terminated and nxt not in first:
                first[nxt] = head
                queue.append(nxt)
    return None


def _terminated(reward: float, terminated: bool) -> bool:
    # Taxi only terminates on a successful dropoff; CliffWalking only at the goal (the
    # cliff sends you back to the start instead).
    return terminated


def _won(reward: float, terminated: bool) -> bool:
    return terminated and reward > 0


def _shortest_path_expert(env: Any) -> int | None:
    return plan_first_action(env, _terminated)


TAXI_STANDS = ("R", "G", "Y", "B")


def _render_taxi(env: Any, done: bool) -> str:
    row, col, passenger, destination = env.decode(env.s)
    grid = [[c.decode() for c in line] for line in env.desc]
    grid[1 + row][2 * col + 1] = "T"
    if passenger == destination:
        where = f"delivered at {TAXI_STANDS[destination]}"
    elif passenger == 4:
        where = "in the taxi"
    else:
        where = f"waiting at {TAXI_STANDS[passenger]}"
    lines = ["".join(line) for line in grid]
    return "\n".join(lines) + f"\nPassenger: {where}. Destination: {TAXI_STANDS[destination]}."


def _render_cliff(env: Any, done: bool) -> str:
    rows, cols = env.shape
    player = divmod(int(env.s), cols)
    goal = (rows - 1, cols - 1)

    def cell(pos: tuple[int, int]) -> str:
        if pos == player:
            return "P"
        return "G" if pos == goal else "C" if env._cliff[pos] else "_"

    grid = "\n".join("".join(cell((r, c)) for c in range(cols)) for r in range(rows))
    return f"{grid}\nYou are at row {player[0]}, column {player[1]}. Goal: row {goal[0]}, column {goal[1]}."


def _card(card: int) -> str:
    return "A" if card == 1 else str(card)


def _cards(hand: list[int]) -> str:
    return f"{', '.join(map(_card, hand))} (total {blackjack.sum_hand(hand)})"


def _render_blackjack(env: Any, done: bool) -> str:
    ace = ", with a usable ace" if blackjack.usable_ace(env.player) else ""
    text = f"Your cards: {_cards(env.player)}{ace}."
    # The dealer's second card stays hidden until the round is over.
    if done:
        return f"{text} Dealer's cards: {_cards(env.dealer)}."
    return f"{text} Dealer shows: {_card(env.dealer[0])}."


@dataclass(frozen=True)
class ToyGame:
    gym_ids: tuple[str, ...]  # candidates, newest first
    actions: tuple[str, ...]  # in gymnasium's action-index order
    instructions: str
    render: Callable[[Any, bool], str]
    is_goal: Callable[[float, bool], bool]  # did this transition solve the task?
    expert: Callable[[Any], int | None]


TOY_GAMES: dict[str, ToyGame] = {
    "Taxi": ToyGame(
        gym_ids=("Taxi-v4", "Taxi-v3"),
        actions=("south", "north", "east", "west", "pickup", "dropoff"),
        instructions=(
            "You drive a taxi T on a 5x5 map. Drive to the passenger's stand, pick them up, "
            "drive to the destination stand and drop them off. Map: R, G, Y, B stands; | wall; "
            ": open road. Rewards: -1 per step, +20 for the delivery, -10 for a wrong pickup or "
            "dropoff. Each turn, answer with one word: south, north, east, west, pickup or dropoff."
        ),
        render=_render_taxi,
        is_goal=_terminated,
        expert=_shortest_path_expert,
    ),
    "CliffWalking": ToyGame(
        gym_ids=("CliffWalking-v1", "CliffWalking-v0"),
        actions=("up", "right", "down", "left"),
        instructions=(
            "Walk from your position P to the goal G. Map: P you, _ ground, C cliff, G goal. "
            "Each step costs -1; stepping on the cliff costs -100 and sends you back to the start. "
            "Each turn, answer with one word: up, right, down or left."
        ),
        render=_render_cliff,
        is_goal=_terminated,
        expert=_shortest_path_expert,
    ),
    "Blackjack": ToyGame(
        gym_ids=("Blackjack-v1",),
        actions=("stick", "hit"),
        instructions=(
            "You play Blackjack against the dealer. Get a card total closer to 21 than the "
            "dealer without going over 21. Aces count 1 or 11, face cards 10. Reward: +1 win, "
            "0 draw, -1 loss. Each turn, answer with one word: hit (take a card) or stick "
            "(stop; then the dealer plays)."
        ),
        render=_render_blackjack,
        is_goal=_won,
        expert=lambda env: int(blackjack.sum_hand(env.player) < 17),
    ),
}


class ToyTextEnv(TextGame):
    """A gymnasium toy-text game (`game` is a key of TOY_GAMES) played with words.

    Rewards are the game's own; `game_kwargs` go to the gymnasium env (e.g. `is_rainy`).
    """

    def __init__(
        self,
        game: str,
        invalid_action_penalty: float = 0.0,
        max_steps: int | None = None,
        render_mode: str | None = None,
        **game_kwargs: Any,
    ):
        if game not in TOY_GAMES:
            raise ValueError(f"unknown toy-text game {game!r}; known: {sorted(TOY_GAMES)}")
        super().__init__(invalid_action_penalty, max_steps, render_mode)
        self.game = TOY_GAMES[game]
        self.actions = self.game.actions
        self.instructions = self.game.instructions
        gym_id = _first_registered(*self.game.gym_ids)
        # .unwrapped drops gymnasium's TimeLimit: `max_steps` is the one step limit.
        self._env = gymnasium.make(gym_id, disable_env_checker=True, **game_kwargs).unwrapped
        self._done = False

    def _new_episode(self, seed: int | None) -> None:
        # Derived from our own generator so `reset()` after `reset(seed=s)` is deterministic too.
        self._env.reset(seed=int(self.np_random.integers(2**31)))
        self._done = False

    def _apply(self, action: str) -> tuple[float, bool, bool]:
        _, reward, terminated, _, _ = self._env.step(self.actions.index(action))
        self._done = bool(terminated)
        return float(reward), self._done, self.game.is_goal(float(reward), self._done)

    def _render(self) -> str:
        return self.game.render(self._env, self._done)

    def expert_action(self) -> str:
        """Taxi, CliffWalking: first move of a shortest path; Blackjack: hit below 17."""
        action = self.game.expert(self._env)
        # None only when no goal is reachable (episode over): any word is as good.
        return self.actions[action or 0]

    def close(self) -> None:
        self._env.close()
