"""TextWorld games as text envs: generated offline by TextWorld's own challenge generators.

`CommandGameEnv` holds what every parser-game env shares (also ALFWorld, see
`envs.alfworld_env`): the model's raw text is matched against the game's admissible
commands, so only a command the engine accepts reaches it and anything else is an
invalid action that leaves the game untouched. `TextWorldEnv` generates one game per
seed with `textworld.challenges` (coin collector, treasure hunter, simple, cooking),
compiles it with the Inform 7 compiler shipped in the textworld wheel and caches it by
(challenge, settings, seed), so a seed is generated once and then only loaded. A seed
makes the same game in every process and on every machine (see `_generate`); a process
started with PYTHONHASHSEED=0 generates in-process, others in a child process (~5 s more).

    python -m envs.textworld_env generate --challenge tw-cooking --seeds 0-99 recipe=2 go=6
fills the cache ahead of training (about 1-3 s a game).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import unicodedata
import warnings
from pathlib import Path
from typing import Any

import gymnasium

from envs.text_adapter import ACTION_MAX_CHARS, OBS_MAX_CHARS, PRINTABLE

# Settings each challenge accepts, with the defaults of TextWorld's own `tw-make` (where
# tw-make has no default, the easiest value).
CHALLENGES: dict[str, dict[str, Any]] = {
    "tw-coin_collector": {"level": 1},
    "tw-treasure_hunter": {"level": 1},
    "tw-simple": {"rewards": "dense", "goal": "detailed", "test": False},
    "tw-cooking": {
        "recipe": 1, "take": 0, "go": 1, "open": False, "cook": False, "cut": False, "drop": False,
        "recipe_seed": 0, "split": None,
    },
}
# TextWorld and the engines under it keep process-global state: tatsu's logic parser (a
# game's load parses its rules), jericho's frotz (a ctypes library, run without the GIL) and
# ALFWorld's libdownward. Envs stepped from parallel threads (the env managers' pool) raced
# there: parser errors, and a segfault that ended a whole test run. Every engine call of
# these envs (generate, load, reset, step, close) holds this lock; uncontended in roll_agent's
# env worker processes, which serve one call at a time. Load, reset, step and close
# take milliseconds; an in-process generation (only under PYTHONHASHSEED=0, see `_generate`)
# holds it for its 1-3 s (pre-generate: `python -m envs.textworld_env generate ...`).
ENGINE_LOCK = threading.RLock()

COMMAND_FORMAT = (
    "Each turn, answer with exactly one of the available actions listed under the "
    "observation, written as shown (for example: {example}). Anything else is not understood."
)


# -- text helpers ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def _command_pattern(command: str) -> re.Pattern[str]:
    # Case and spacing free; alphanumeric lookarounds, so "cabinet 1" is not read inside "cabinet 12".
    words = r"\s+".join(map(re.escape, command.split()))
    return re.compile(rf"(?<![A-Za-z0-9]){words}(?![A-Za-z0-9])", re.IGNORECASE | re.ASCII)


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def match_command(text: Any, commands: list[str]) -> str | None:
    """The admissible command mentioned last in `text` (case and spacing free), or None.

    The text is read left to right as one alternation of the commands would read it: at each
    place the longest command that matches there wins ("go to cabinet 10" over "go to cabinet
    1"), and reading goes on after it. Each command's pattern is compiled once per process (the
    admissible set changes every turn; compiling the alternation each turn was ~1/4 of a step)."""
    commands = [c for c in commands if c.strip()]
    if not commands:
        return None
    ranked = sorted(commands, key=len, reverse=True)
    text = text if isinstance(text, str) else str(text)
    ahead = {}  # rank: the command's first match at or after the reading position
    for rank, command in enumerate(ranked):
        if (found := _command_pattern(command).search(text)) is not None:
            ahead[rank] = found
    last = None
    while ahead:
        last = min(ahead.values(), key=lambda m: m.start())  # dicts keep rank order: the longest on a tie
        for rank in [r for r, m in ahead.items() if m.start() < last.end()]:
            if (found := _command_pattern(ranked[rank]).search(text, last.end())) is None:
                del ahead[rank]
            else:
                ahead[rank] = found
    if last is None:
        return None
    return {_norm(c): c for c in commands}[_norm(last.group(0))]


# A line of TextWorld's ASCII-art title: drawing characters and no letter or digit.
_BANNER_LINE = re.compile(r"^[^A-Za-z0-9]*[$_|\\/][^A-Za-z0-9]*$")
_ENGINE_NOISE = [
    re.compile(r"\n>[^\n]*$"),  # the parser prompt and Jericho's status line after it
    re.compile(r"Would you like to RESTART, RESTORE a saved game, QUIT or UNDO[^\n]*"),
    re.compile(r"-= Welcome to TextWorld, ALFRED! =-"),
]


def clean_text(text: str) -> str:
    """Engine output as plain printable ASCII, without the title art, prompts and blank runs."""
    text = unicodedata.normalize("NFKD", str(text)).encode("ascii", "ignore").decode()
    text = "".join(ch for ch in text if ch in PRINTABLE).replace("\r", "")
    text = "\n".join(line for line in text.split("\n") if not _BANNER_LINE.match(line))
    for noise in _ENGINE_NOISE:
        text = noise.sub("", text)
    text = "\n".join(line.strip() for line in text.split("\n"))
    return re.sub(r"\n{3,}", "\n\n", text).strip()


# -- the shared env -------------------------------------------------------------------------


class CommandGameEnv(gymnasium.Env):
    """A parser game whose valid actions are its admissible commands.

    Subclasses implement `_load(seed)` (pick, load and start the seed's game; returns
    (feedback, admissible, instructions)), `_send(command)` (returns feedback,
    admissible, won, lost, score) and `_expert()`; this class does the rest of the contract.
    """

    # The engines keep process-global state (see ENGINE_LOCK): roll_agent runs these envs in
    # worker processes (roll_agent/rollout/env_workers.py) unless a spec sets workers: 0.
    metadata = {"render_modes": ["ansi"], "thread_safe": False}

    def warm_up(self) -> None:
        """What a process's first game load does once (import the engine, ...), done ahead: env
        workers call it as they start, while the run loads its model (roll_agent/rollout/env_workers.py)."""
        raise NotImplementedError

    def __init__(self, max_steps: int | None, invalid_action_penalty: float, show_admissible: bool,
                 render_mode: str | None):
        if max_steps is not None and max_steps < 1:
            raise ValueError(f"max_steps must be >= 1 or None, got {max_steps}")
        if render_mode not in (None, *self.metadata["render_modes"]):
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}")
        self.observation_space = gymnasium.spaces.Text(OBS_MAX_CHARS, charset=PRINTABLE)
        self.action_space = gymnasium.spaces.Text(ACTION_MAX_CHARS, charset=PRINTABLE)
        self.max_steps = max_steps
        self.invalid_action_penalty = float(invalid_action_penalty)
        self.show_admissible = show_admissible
        self.render_mode = render_mode
        self._feedback = ""
        self._admissible: list[str] = []
        self._score = 0.0
        self._steps = 0
        self._done = self._success = False
        self._closed = False

    # -- hooks ---------------------------------------------------------------------------
    def _load(self, seed: int | None) -> tuple[str, list[str], str]:
        raise NotImplementedError

    def _send(self, command: str) -> tuple[str, list[str], bool, bool, float]:
        raise NotImplementedError

    def _expert(self) -> str | None:
        raise NotImplementedError

    def _step_reward(self, won: bool, score: float) -> float:
        return 1.0 if won else 0.0

    # -- gymnasium API -------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if self._closed:
            raise RuntimeError("reset() after close()")
        feedback, self._admissible, instructions = self._load(seed)
        self._feedback = clean_text(feedback)
        self._score, self._steps = 0.0, 0
        self._done = self._success = False
        return self._obs(), {**self._info(False), "instructions": instructions}

    def step(self, action: Any):
        self._steps += 1
        command = None if self._done else match_command(action, self._admissible)
        reward, terminated = 0.0, self._done
        if self._done:
            obs = "The game is over. " + self._obs()
        elif command is None:
            reward = self.invalid_action_penalty
            example = self._admissible[0] if self._admissible else "look"
            obs = f"Invalid action. Answer with exactly one available action, e.g. {example}\n\n{self._obs()}"
        else:
            feedback, self._admissible, won, lost, score = self._send(command)
            self._feedback = clean_text(feedback)
            reward = self._step_reward(won, score)
            self._score = score
            self._success, self._done = bool(won), bool(won or lost)
            terminated = self._done
            obs = self._obs()
        truncated = not terminated and self.max_steps is not None and self._steps >= self.max_steps
        info = self._info(command is None and not self._done)
        return obs[:OBS_MAX_CHARS], float(reward), bool(terminated), bool(truncated), info

    def render(self) -> str | None:
        return self._obs() if self.render_mode == "ansi" else None

    def expert_action(self) -> str:
        """The game's expert move; any admissible command once no expert move exists."""
        action = None if self._done else self._expert()
        return action or (self._admissible[0] if self._admissible else "look")

    # -- helpers -------------------------------------------------------------------------
    def _obs(self) -> str:
        text = self._feedback
        if self.show_admissible and self._admissible and not self._done:
            text += "\n\nAvailable actions: " + ", ".join(self._admissible)
        if len(text) > OBS_MAX_CHARS:  # keep the head: the feedback matters more than the list's tail
            text = text[: OBS_MAX_CHARS - 3] + "..."
        return text

    def _info(self, invalid: bool) -> dict[str, Any]:
        return {
            "success": bool(self._success),
            "invalid_action": bool(invalid),
            "admissible_actions": list(self._admissible),
            "score": float(self._score),
        }


# -- TextWorld --------------------------------------------------------------------------------


def default_cache_dir() -> Path:
    """$ROLL_AGENT_CACHE/textworld, else ~/.cache/roll_agent/textworld."""
    root = os.environ.get("ROLL_AGENT_CACHE") or Path.home() / ".cache" / "roll_agent"
    return Path(root) / "textworld"


def resolve_settings(challenge: str, level: int | None = None, settings: dict | None = None) -> dict[str, Any]:
    if challenge not in CHALLENGES:
        raise ValueError(f"unknown TextWorld challenge {challenge!r}; known: {sorted(CHALLENGES)}")
    merged = {**CHALLENGES[challenge], **(settings or {})}
    if level is not None:
        if "level" not in merged:
            raise ValueError(f"{challenge} has no level; use settings= ({sorted(merged)})")
        merged["level"] = int(level)
    unknown = set(merged) - set(CHALLENGES[challenge])
    if unknown:
        raise ValueError(f"unknown settings {sorted(unknown)} for {challenge}; known: {sorted(CHALLENGES[challenge])}")
    return merged


def game_path(cache_dir: Path, challenge: str, settings: dict[str, Any], seed: int) -> Path:
    import textworld

    # The textworld version is in the key: another generator version makes other games.
    key = json.dumps([textworld.__version__, settings], sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return Path(cache_dir) / challenge / digest / f"seed-{seed}" / "game.z8"


def generate_game(cache_dir: Path, challenge: str, settings: dict[str, Any], seed: int) -> Path:
    """The compiled game for (challenge, settings, seed): from the cache, else generated into it."""
    path = game_path(cache_dir, challenge, settings, seed)
    if not (path.is_file() and path.with_suffix(".json").is_file()):
        _generate(path, challenge, settings, seed)
    return path


def _generate(path: Path, challenge: str, settings: dict[str, Any], seed: int) -> None:
    if sys.flags.hash_randomization:
        # TextWorld's generators iterate over sets of strings, so a seed's game depends on
        # Python's per-process hash seed: a child with PYTHONHASHSEED=0 makes the same game
        # for a seed in every process and on every machine.
        _run_hash_fixed(["generate", "--challenge", challenge, "--seeds", str(seed),
                         "--cache-dir", str(path.parents[3]), *_settings_args(settings)])
        return
    import textworld
    import textworld.challenges
    from textworld.generator import compile_game

    path.parent.parent.mkdir(parents=True, exist_ok=True)
    (path.parent.parent / "settings.json").write_text(json.dumps({"challenge": challenge, **settings}, indent=1))
    # Built in a private folder then renamed into place, so concurrent generators of the
    # same seed (several envs, several processes) never see half a game.
    tmp = Path(tempfile.mkdtemp(prefix=f".seed-{seed}-", dir=path.parent.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp's 0700 would hide a shared cache from other users
        options = textworld.GameOptions()
        options.seeds = int(seed)
        options.path = str(tmp / path.name)
        options.force_recompile = True
        with ENGINE_LOCK, warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*is not fully supported")  # see _start
            game = textworld.challenges.CHALLENGES[challenge][1](dict(settings), options)
            compile_game(game, options)
        try:
            os.rename(tmp, path.parent)
        except OSError:
            if not path.is_file():  # not a concurrent winner: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _settings_args(settings: dict[str, Any]) -> list[str]:
    return [f"{key}={json.dumps(value)}" for key, value in settings.items()]  # JSON scalars are YAML


def _run_hash_fixed(argv: list[str]) -> None:
    """`python -m envs.textworld_env ARGV` with PYTHONHASHSEED=0; raises with its stderr if it fails."""
    root = str(Path(__file__).resolve().parents[1])  # so the child imports this checkout's envs
    pythonpath = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": pythonpath}
    done = subprocess.run([sys.executable, "-m", "envs.textworld_env", *argv], env=env, capture_output=True,
                          text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"TextWorld generation failed ({' '.join(argv)}):\n{done.stderr[-3000:]}")


class TextWorldEnv(CommandGameEnv):
    """One generated TextWorld game per seed; reward 1 on a win.

    `challenge` is one of CHALLENGES; `level` or `settings` set its difficulty (unset keys
    keep CHALLENGES' defaults). `num_games` (optional) plays game `seed % num_games`, so
    training cycles over a fixed, pre-generable set; unseeded resets draw from the env's
    seeded generator. `reward="score"` pays the game's score increments over its max
    score instead (it still sums to 1 on a full-score win).
    """

    def __init__(
        self,
        challenge: str = "tw-coin_collector",
        level: int | None = None,
        settings: dict | None = None,
        cache_dir: str | None = None,
        num_games: int | None = None,
        reward: str = "win",
        max_steps: int | None = None,
        invalid_action_penalty: float = 0.0,
        show_admissible: bool = True,
        render_mode: str | None = None,
    ):
        super().__init__(max_steps, invalid_action_penalty, show_admissible, render_mode)
        self.challenge = challenge
        self.settings = resolve_settings(challenge, level, settings)
        if num_games is not None and num_games < 1:
            raise ValueError(f"num_games must be >= 1 or None, got {num_games}")
        if reward not in ("win", "score"):
            raise ValueError(f"reward must be 'win' or 'score', got {reward!r}")
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        self.num_games = num_games
        self.reward = reward
        self.game_seed: int | None = None
        self._game = None  # the running textworld env
        self._state: Any = None
        self._max_score = 1.0

    def warm_up(self) -> None:
        """Import textworld (~1.2 s: it parses its built-in logic) and parse the logic document
        that the cached games of this challenge and these settings embed (~0.8 s; textworld keeps
        it for the process, an lru_cache on `GameLogic.parse`, so loading those games skips it)."""
        import textworld  # noqa: F401
        from textworld.logic import GameLogic

        cached = next(game_path(self.cache_dir, self.challenge, self.settings, 0).parents[1].glob("seed-*/game.json"),
                      None)
        if cached is not None:
            with ENGINE_LOCK:
                GameLogic.deserialize(json.loads(cached.read_text())["KB"]["logic"])

    def _load(self, seed: int | None) -> tuple[str, list[str], str]:
        game_seed = seed if seed is not None else int(self.np_random.integers(2**31))
        if self.num_games is not None:
            game_seed %= self.num_games
        if self._game is None or game_seed != self.game_seed:
            path = generate_game(self.cache_dir, self.challenge, self.settings, game_seed)
            self._close_game()
            self._game = _start(path)
            self.game_seed = game_seed
        with ENGINE_LOCK:
            self._state = self._game.reset()
        self._max_score = float(self._state["max_score"] or 1)
        objective = clean_text(self._state["objective"] or "")
        example = self._state["admissible_commands"][0] if self._state["admissible_commands"] else "look"
        instructions = (
            "You are playing a text adventure game. Explore and use the objects around you to "
            f"complete the objective.\nObjective: {objective}\n" + COMMAND_FORMAT.format(example=example)
        )
        return self._state.feedback, list(self._state["admissible_commands"]), instructions

    def _send(self, command: str) -> tuple[str, list[str], bool, bool, float]:
        with ENGINE_LOCK:
            self._state, score, _ = self._game.step(command)
        s = self._state
        return s.feedback, list(s["admissible_commands"] or []), bool(s["won"]), bool(s["lost"]), float(score)

    def _step_reward(self, won: bool, score: float) -> float:
        if self.reward == "score":
            return (score - self._score) / self._max_score
        return 1.0 if won else 0.0

    def _expert(self) -> str | None:
        """First command of the walkthrough from the current state (TextWorld's winning policy)."""
        policy = self._state["policy_commands"] if self._state is not None else None
        return policy[0] if policy else None

    def _close_game(self) -> None:
        if self._game is not None:
            game, self._game = self._game, None
            with ENGINE_LOCK:
                game.close()
                del game  # jericho's finaliser (shutdown, dlclose) runs here, under the lock

    def close(self) -> None:
        self._closed = True
        self._close_game()


def _start(path: Path) -> Any:
    import textworld

    infos = textworld.EnvInfos(admissible_commands=True, policy_commands=True, objective=True,
                               won=True, lost=True, score=True, max_score=True)
    with ENGINE_LOCK, warnings.catch_warnings():
        # Jericho can't track score in TextWorld-made games; TextWorld's own state does.
        warnings.filterwarnings("ignore", message=".*is not fully supported")
        return textworld.start(str(path), request_infos=infos)


# -- command line -----------------------------------------------------------------------------


def _seeds(spec: str) -> list[int]:
    seeds = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        seeds.extend(range(int(lo), int(hi or lo) + 1))
    return seeds


def main(argv: list[str] | None = None) -> int:
    from envs import parse_kwargs

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    gen = sub.add_parser("generate", help="generate (and cache) games for a range of seeds")
    gen.add_argument("--challenge", default="tw-coin_collector", choices=sorted(CHALLENGES))
    gen.add_argument("--seeds", default="0-9", help="e.g. 0-99 or 1,5,7-9")
    gen.add_argument("--cache-dir", default=None,
                     help="default: $ROLL_AGENT_CACHE/textworld, else ~/.cache/roll_agent/textworld")
    gen.add_argument("settings", nargs="*", metavar="key=value", help="challenge settings, e.g. level=5")
    args = parser.parse_args(argv)
    settings = resolve_settings(args.challenge, settings=parse_kwargs(args.settings))
    cache_dir = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    paths = [game_path(cache_dir, args.challenge, settings, seed) for seed in _seeds(args.seeds)]
    if sys.flags.hash_randomization and not all(p.is_file() for p in paths):
        # One hash-fixed child for all the seeds (see _generate), not one per seed.
        _run_hash_fixed(["generate", "--challenge", args.challenge, "--seeds", args.seeds,
                         "--cache-dir", str(cache_dir), *_settings_args(settings)])
    for seed in _seeds(args.seeds):
        print(generate_game(cache_dir, args.challenge, settings, seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
