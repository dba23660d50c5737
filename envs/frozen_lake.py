"""FrozenLake as a text env: the default training env of roll_agent.

Each seed draws its own (always solvable) map, so a policy has to read the map rather
than memorise one. Below the grid a short description names what lies next to the
player in each direction and how far the goal is: a tiny model can learn a good policy
from those words alone, the grid carries the rest. Dynamics (including the slippery
variant) are gymnasium's own FrozenLake.
"""

from __future__ import annotations

from collections import deque

from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv as GymFrozenLake
from gymnasium.envs.toy_text.frozen_lake import generate_random_map

from envs.text_adapter import TextGame

# In gymnasium's action-index order (0 left, 1 down, 2 right, 3 up).
ACTIONS = ("left", "down", "right", "up")
MOVES = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}
CELL_WORDS = {"F": "frozen", "S": "frozen", "H": "hole", "G": "goal"}

INSTRUCTIONS = (
    "You are on a frozen lake. Walk to the goal G without falling into a hole H. "
    "Map: P you, F frozen ice (safe), H hole, G goal. Under the map you see what is next "
    "to you in each direction and how far the goal is. "
    "Each turn, answer with one word: left, down, right or up."
)
SLIPPERY_NOTE = " The ice is slippery: sometimes you slide sideways instead."


class FrozenLakeEnv(TextGame):
    """Reach G on a random `size` x `size` lake; reward 1 at the goal, 0 otherwise.

    `p_frozen` is the chance a tile is ice rather than a hole. `max_steps=None` leaves the
    episode length to the caller (the rollout's `max_turns`).
    """

    actions = ACTIONS

    def __init__(
        self,
        size: int = 4,
        p_frozen: float = 0.8,
        is_slippery: bool = False,
        max_steps: int | None = None,
        invalid_action_penalty: float = 0.0,
        render_mode: str | None = None,
    ):
        if size < 2:
            raise ValueError(f"size must be >= 2, got {size}")
        # p_frozen = 0 would make generate_random_map loop forever looking for a path.
        if not 0.0 < p_frozen <= 1.0:
            raise ValueError(f"p_frozen must be in (0, 1], got {p_frozen}")
        super().__init__(invalid_action_penalty, max_steps, render_mode)
        self.size = size
        self.p_frozen = p_frozen
        self.is_slippery = is_slippery
        self.instructions = INSTRUCTIONS + (SLIPPERY_NOTE if is_slippery else "")
        self.desc: list[str] = []
        self._lake: GymFrozenLake | None = None

    def _new_episode(self, seed: int | None) -> None:
        # An explicit seed names the map itself, so every env of a group given that seed
        # plays the same lake; without one the map comes from our seeded generator.
        map_seed = seed if seed is not None else int(self.np_random.integers(2**31))
        self.desc = generate_random_map(self.size, self.p_frozen, seed=map_seed)
        self._lake = GymFrozenLake(desc=self.desc, is_slippery=self.is_slippery)
        self._lake.reset(seed=int(self.np_random.integers(2**31)))

    @property
    def position(self) -> tuple[int, int]:
        return divmod(int(self._lake.s), self.size)

    def _cell(self, pos: tuple[int, int]) -> str | None:
        """The tile at `pos`, or None outside the lake."""
        row, col = pos
        inside = 0 <= row < self.size and 0 <= col < self.size
        return self.desc[row][col] if inside else None

    def _apply(self, action: str) -> tuple[float, bool, bool]:
        _, reward, terminated, _, _ = self._lake.step(ACTIONS.index(action))
        return float(reward), bool(terminated), self._cell(self.position) == "G"

    def _render(self) -> str:
        player = self.position
        rows = []
        for r, line in enumerate(self.desc):
            cells = ["P" if (r, c) == player else "F" if tile == "S" else tile for c, tile in enumerate(line)]
            rows.append("".join(cells))
        return "\n".join(rows) + "\n" + self._describe(player)

    def _describe(self, player: tuple[int, int]) -> str:
        tile = self._cell(player)
        if tile == "H":
            return "You fell into a hole. Game over."
        if tile == "G":
            return "You reached the goal!"
        around = ", ".join(f"{word}: {self._neighbour(player, word)}" for word in ACTIONS)
        return f"{around}. goal: {self._goal_offset(player)}."

    def _neighbour(self, pos: tuple[int, int], word: str) -> str:
        tile = self._cell(_moved(pos, word))
        return "wall" if tile is None else CELL_WORDS[tile]

    def _goal_offset(self, player: tuple[int, int]) -> str:
        # generate_random_map always puts the goal in the bottom-right corner.
        down, right = self.size - 1 - player[0], self.size - 1 - player[1]
        parts = [f"{down} down" if down else "", f"{right} right" if right else ""]
        return ", ".join(part for part in parts if part)

    def expert_action(self) -> str:
        """First move of a shortest path to G that avoids holes (BFS over the map)."""
        start = self.position
        first: dict[tuple[int, int], str | None] = {start: None}
        # Nothing to plan from a hole or the goal: the episode is over there.
        queue = deque([start] if self._cell(start) in ("F", "S") else [])
        while queue:
            pos = queue.popleft()
            for word in ACTIONS:
                nxt = _moved(pos, word)
                tile = self._cell(nxt)
                if tile in (None, "H") or nxt in first:
                    continue
                head = first[pos] or word
                if tile == "G":
                    return head
                first[nxt] = head
                queue.append(nxt)
        # Only on a hole or the goal, where the episode is over: any word is as good.
        return ACTIONS[0]

    def close(self) -> None:
        if self._lake is not None:
            self._lake.close()


def _moved(pos: tuple[int, int], word: str) -> tuple[int, int]:
    dr, dc = MOVES[word]
    return pos[0] + dr, pos[1] + dc
