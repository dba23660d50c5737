"""Sokoban as a text env, on procedurally generated levels that are solvable by construction.

A level is made by carving a room, putting the boxes on their targets (the solved state)
and playing backwards: the player walks and pulls boxes, which is exactly a forward push
undone. A bounded BFS solver then confirms the level and its shortest plan becomes
`expert_action()`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from envs.text_adapter import TextGame

Pos = tuple[int, int]
State = tuple[Pos, frozenset[Pos]]  # (player, boxes)

ACTIONS = ("up", "down", "left", "right")
MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
MAX_SOLVER_STATES = 100_000  # bounds generation time; bigger levels are redrawn
GENERATION_TRIES = 200
CANDIDATES = 4
FLOOR_FRACTION = 0.7  # share of the room's interior carved into floor

INSTRUCTIONS = (
    "You play Sokoban. Push every box onto a target. You can push a box by walking into it, "
    "but only one box at a time and never pull. Map: # wall, _ floor, O target, X box, "
    "* box on a target, P you, S you on a target. "
    "Each turn, answer with one word: up, down, left or right."
)


def _step(pos: Pos, move: str) -> Pos:
    dr, dc = MOVES[move]
    return pos[0] + dr, pos[1] + dc


def push(floor: frozenset[Pos], state: State, move: str) -> State | None:
    """The state after `move`, or None when a wall or a second box blocks it."""
    player, boxes = state
    nxt = _step(player, move)
    if nxt not in floor:
        return None
    if nxt in boxes:
        beyond = _step(nxt, move)
        if beyond not in floor or beyond in boxes:
            return None
        boxes = (boxes - {nxt}) | {beyond}
    return nxt, boxes


def live_cells(floor: frozenset[Pos], targets: frozenset[Pos]) -> frozenset[Pos]:
    """Cells from which some sequence of pushes can bring a box onto a target.

    A box anywhere else is dead, so the solver never explores those states.
    """
    live, queue = set(targets), deque(targets)
    while queue:
        box = queue.popleft()
        for move in ACTIONS:
            # A box reaches `box` from `before` when the player stands behind `before`.
            before = _step(box, _opposite(move))
            if before in floor and _step(before, _opposite(move)) in floor and before not in live:
                live.add(before)
                queue.append(before)
    return frozenset(live)


def _opposite(move: str) -> str:
    return {"up": "down", "down": "up", "left": "right", "right": "left"}[move]


def solve(floor: frozenset[Pos], targets: frozenset[Pos], start: State) -> list[tuple[State, str]] | None:
    """A shortest plan as (state, move) pairs, or None if none is found within the bound."""
    live = live_cells(floor, targets)
    parents: dict[State, tuple[State, str] | None] = {start: None}
    queue = deque([start])
    while queue and len(parents) <= MAX_SOLVER_STATES:
        state = queue.popleft()
        if state[1] <= targets:
            return _unwind(parents, state)
        for move in ACTIONS:
            nxt = push(floor, state, move)
            if nxt is not None and nxt not in parents and nxt[1] <= live:
                parents[nxt] = (state, move)
                queue.append(nxt)
    return None


def _unwind(parents: dict[State, tuple[State, str] | None], state: State) -> list[tuple[State, str]]:
    plan = []
    while parents[state] is not None:
        state, move = parents[state]
        plan.append((state, move))
    return plan[::-1]


@dataclass(frozen=True)
class Level:
    dim: int
    floor: frozenset[Pos]
    targets: frozenset[Pos]
    start: State
    plan: list[tuple[State, str]]


def generate_level(dim: int, num_boxes: int, rng: np.random.Generator) -> Level:
    """A random solvable level; the hardest (longest plan) of a few candidates.

    Most random reverse plays leave the boxes next to their targets, so taking the
    longest of several keeps levels from being trivial without much extra work.
    """
    candidates = [_draw_level(dim, num_boxes, rng) for _ in range(CANDIDATES)]
    return max(candidates, key=lambda level: len(level.plan))


def _draw_level(dim: int, num_boxes: int, rng: np.random.Generator) -> Level:
    """Reverse play from the solved state, then a BFS check (redrawn if the bound is hit)."""
    for _ in range(GENERATION_TRIES):
        floor = _carve_room(dim, rng)
        cells = sorted(floor)
        picks = rng.choice(len(cells), size=num_boxes + 1, replace=False)
        targets = frozenset(cells[i] for i in picks[:num_boxes])
        start = _reverse_play(floor, (cells[picks[-1]], targets), 4 * dim * num_boxes, rng)
        if start[1] <= targets:
            continue  # nothing left to do
        plan = solve(floor, targets, start)
        if plan:
            return Level(dim, floor, targets, start, plan)
    raise RuntimeError(f"could not generate a solvable {dim}x{dim} level with {num_boxes} boxes")


def _carve_room(dim: int, rng: np.random.Generator) -> frozenset[Pos]:
    """A connected floor carved by a random walk inside the outer wall."""
    inner = dim - 2
    pos = (int(rng.integers(1, dim - 1)), int(rng.integers(1, dim - 1)))
    floor = {pos}
    while len(floor) < FLOOR_FRACTION * inner * inner:
        nxt = _step(pos, ACTIONS[int(rng.integers(4))])
        if 1 <= nxt[0] <= inner and 1 <= nxt[1] <= inner:
            pos = nxt
            floor.add(pos)
    return frozenset(floor)


def _reverse_play(floor: frozenset[Pos], state: State, steps: int, rng: np.random.Generator) -> State:
    """Walk backwards from `state`, pulling the box behind the player whenever there is one."""
    player, boxes = state
    for _ in range(steps):
        move = ACTIONS[int(rng.integers(4))]
        nxt = _step(player, move)
        if nxt not in floor or nxt in boxes:
            continue
        behind = _step(player, _opposite(move))
        if behind in boxes:
            boxes = (boxes - {behind}) | {player}
        player = nxt
    return player, boxes


class SokobanEnv(TextGame):
    """Push `num_boxes` boxes onto targets in a `dim` x `dim` room (outer wall included).

    Reward: +1 when every box is on a target (success, terminated), plus
    `box_on_target_reward` for each box pushed onto a target and minus it for each pushed off.
    """

    actions = ACTIONS
    instructions = INSTRUCTIONS

    def __init__(
        self,
        dim: int = 6,
        num_boxes: int = 1,
        max_steps: int | None = 100,
        box_on_target_reward: float = 0.1,
        invalid_action_penalty: float = 0.0,
        render_mode: str | None = None,
    ):
        if dim < 5:
            raise ValueError(f"dim must be >= 5 (a 3x3 room inside the wall), got {dim}")
        if not 1 <= num_boxes <= (dim - 2) ** 2 // 4:
            raise ValueError(f"num_boxes must be in [1, {(dim - 2) ** 2 // 4}] for dim={dim}, got {num_boxes}")
        super().__init__(invalid_action_penalty, max_steps, render_mode)
        self.dim = dim
        self.num_boxes = num_boxes
        self.box_on_target_reward = float(box_on_target_reward)
        self.level: Level | None = None
        self.state: State = ((0, 0), frozenset())
        self._plan: dict[State, str] = {}

    def _new_episode(self, seed: int | None) -> None:
        self.level = generate_level(self.dim, self.num_boxes, self.np_random)
        self.state = self.level.start
        self._plan = dict(self.level.plan)

    def _on_target(self) -> int:
        return len(self.state[1] & self.level.targets)

    def _apply(self, action: str) -> tuple[float, bool, bool]:
        before = self._on_target()
        # A blocked move is still a valid action: it just leaves the state as it is.
        self.state = push(self.level.floor, self.state, action) or self.state
        solved = self._on_target() == self.num_boxes
        reward = self.box_on_target_reward * (self._on_target() - before) + (1.0 if solved else 0.0)
        return reward, solved, solved

    def _render(self) -> str:
        player, boxes = self.state
        rows = []
        for r in range(self.dim):
            rows.append("".join(self._glyph((r, c), player, boxes) for c in range(self.dim)))
        return "\n".join(rows) + f"\nBoxes on targets: {self._on_target()} of {self.num_boxes}."

    def _glyph(self, pos: Pos, player: Pos, boxes: frozenset[Pos]) -> str:
        target = pos in self.level.targets
        if pos == player:
            return "S" if target else "P"
        if pos in boxes:
            return "*" if target else "X"
        if target:
            return "O"
        return "_" if pos in self.level.floor else "#"

    def expert_action(self) -> str:
        """Next move of a shortest solution, re-planned whenever the player left the plan."""
        if self.state not in self._plan:
            self._plan = dict(solve(self.level.floor, self.level.targets, self.state) or [])
        # Missing only when solved or dead-locked, where no move helps.
        return self._plan.get(self.state, ACTIONS[0])
