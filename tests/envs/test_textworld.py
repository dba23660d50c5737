"""TextWorld envs: games generated here by textworld's own generators and won by their walkthroughs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import gymnasium
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("textworld")

import envs  # noqa: E402,F401  registers the ids
from envs import textworld_env  # noqa: E402
from envs.textworld_env import (  # noqa: E402
    TextWorldEnv,
    clean_text,
    default_cache_dir,
    game_path,
    main,
    match_command,
    resolve_settings,
)
from roll_agent.check_env import GARBAGE_ACTIONS, check_text_env  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
# Small games: generation is ~1-3 s each on a busy 2-core machine.
GAMES = {
    "tw-coin_collector": {"level": 5},
    "tw-treasure_hunter": {"level": 3},
    "tw-simple": {"rewards": "dense", "goal": "detailed"},
    "tw-cooking": {"recipe": 2, "take": 2, "go": 6, "open": True, "cook": True},
}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("tw-cache")


def play_walkthrough(env: TextWorldEnv, seed: int, max_steps: int = 100) -> tuple[list[float], dict]:
    _, info = env.reset(seed=seed)
    rewards = []
    for _ in range(max_steps):
        # Wrapped in chatter, as a model writes it: the command is still found.
        _, reward, terminated, truncated, info = env.step(f"Let me think. I will {env.expert_action()}.")
        assert not info["invalid_action"]
        rewards.append(reward)
        if terminated or truncated:
            return rewards, info
    raise AssertionError(f"walkthrough did not finish in {max_steps} steps")


# -- parsing and text ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("take coin", "take coin"),
        ("  TAKE   Coin\n", "take coin"),
        ("I could go north, but I will take coin.", "take coin"),
        ("go to cabinet 10", "go to cabinet 10"),
        ("go to cabinet 1.", "go to cabinet 1"),
        ("go to cabinet 12", None),
        ("overtake coins", None),
        ("take the coin", None),
        ("", None),
        ("<tool_call>{", None),
    ],
)
def test_match_command(text, expected):
    commands = ["go north", "take coin", "go to cabinet 1", "go to cabinet 10", "look"]
    assert match_command(text, commands) == expected


def alternation_match(text: str, commands: list[str]) -> str | None:
    """The reading match_command promises, as one regex alternation (longest first) of the commands."""
    commands = [c for c in commands if c.strip()]
    if not commands:
        return None
    words = [r"\s+".join(map(re.escape, c.split())) for c in sorted(commands, key=len, reverse=True)]
    pattern = re.compile(rf"(?<![A-Za-z0-9])(?:{'|'.join(words)})(?![A-Za-z0-9])", re.IGNORECASE | re.ASCII)
    last = None
    for last in pattern.finditer(text):
        pass
    return None if last is None else {" ".join(c.lower().split()): c for c in commands}[" ".join(last[0].lower().split())]


WORDS = st.sampled_from(["go", "to", "cabinet", "1", "10", "take", "coin", "Go", "TO", "look", "a.b", "(x)", "go1"])
COMMANDS = st.lists(st.lists(WORDS, min_size=1, max_size=4).map(" ".join), max_size=8)
TEXTS = st.lists(st.one_of(WORDS, st.sampled_from([" ", "  ", "\n", ",", ".", "x", "1"])), max_size=30).map("".join)


@given(text=TEXTS, commands=COMMANDS)
@settings(max_examples=400, deadline=None)
def test_match_command_reads_as_one_alternation_would(text, commands):
    assert match_command(text, commands) == alternation_match(text, commands)


def test_match_command_odd_inputs():
    assert match_command("look", []) is None
    assert match_command(None, ["look"]) is None
    assert match_command(b"look", ["look"]) == "look"  # str() of bytes still names it
    assert match_command("look (a.b)?", ["look (a.b)?"]) == "look (a.b)?"  # regex characters are literal


def test_clean_text_drops_engine_noise():
    raw = (
        "\n\n  ________  ________\n |  \\  $$ /  |\n\nWelcome!\n\n\n\nYou see a caf\u00e9.\n"
        "Would you like to RESTART, RESTORE a saved game, QUIT or UNDO the last command?\n>   -= Kitchen =-1/2"
    )
    assert clean_text(raw) == "Welcome!\n\nYou see a cafe."


def test_settings_are_checked():
    assert resolve_settings("tw-coin_collector", level=7) == {"level": 7}
    assert resolve_settings("tw-cooking", settings={"go": 6})["go"] == 6
    with pytest.raises(ValueError, match="unknown TextWorld challenge"):
        resolve_settings("tw-nope")
    with pytest.raises(ValueError, match="unknown settings"):
        resolve_settings("tw-simple", settings={"levle": 3})
    with pytest.raises(ValueError, match="has no level"):
        resolve_settings("tw-cooking", level=3)


def test_cache_dir_follows_roll_agent_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("ROLL_AGENT_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path / "textworld"
    monkeypatch.delenv("ROLL_AGENT_CACHE")
    assert default_cache_dir().parts[-3:] == (".cache", "roll_agent", "textworld")
    # Each (challenge, settings, seed) has its own game.
    paths = {game_path(tmp_path, "tw-simple", s, seed) for s in ({"a": 1}, {"a": 2}) for seed in (0, 1)}
    assert len(paths) == 4


# -- generated games ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("challenge", sorted(GAMES))
def test_walkthrough_wins_generated_game(challenge, cache):
    env = TextWorldEnv(challenge=challenge, settings=GAMES[challenge], cache_dir=str(cache))
    _, info = env.reset(seed=11)
    assert "Objective:" in info["instructions"] and info["admissible_actions"]
    rewards, info = play_walkthrough(env, seed=11)
    assert info["success"] is True
    assert rewards[-1] == 1.0 and sum(rewards) == 1.0
    env.close()


@pytest.mark.slow
def test_games_are_cached_and_seeded(cache, monkeypatch):
    env = TextWorldEnv(challenge="tw-coin_collector", settings=GAMES["tw-coin_collector"], cache_dir=str(cache))
    first = env.reset(seed=11)
    env.close()
    # A cached seed is only loaded: with the generator gone it still plays.
    def no_generation(*args, **kwargs):
        raise AssertionError("a cached game was generated again")

    monkeypatch.setattr(textworld_env, "_generate", no_generation)
    env = TextWorldEnv(challenge="tw-coin_collector", settings=GAMES["tw-coin_collector"], cache_dir=str(cache))
    assert env.reset(seed=11) == first
    assert env.unwrapped.game_seed == 11
    assert not list(cache.glob("**/.seed-*")), "generation left a temporary folder"
    with pytest.raises(AssertionError, match="generated again"):
        env.reset(seed=12)  # a new seed is a new game
    env.close()


@pytest.mark.slow
def test_num_games_cycles_and_score_reward(cache):
    env = TextWorldEnv(challenge="tw-simple", settings=GAMES["tw-simple"], cache_dir=str(cache), num_games=4,
                       reward="score")
    assert env.reset(seed=15) == env.reset(seed=3)
    rewards, info = play_walkthrough(env, seed=3)
    # tw-simple's dense score pays along the way; the increments add up to 1 at the win.
    assert info["success"] and sum(rewards) == pytest.approx(1.0) and sum(r > 0 for r in rewards) > 1
    env.close()


@pytest.mark.slow
def test_garbage_never_raises_and_keeps_state(cache):
    env = TextWorldEnv(challenge="tw-treasure_hunter", settings=GAMES["tw-treasure_hunter"], cache_dir=str(cache))
    obs, info = env.reset(seed=11)
    for garbage in GARBAGE_ACTIONS.values():
        after, reward, terminated, truncated, step_info = env.step(garbage)
        assert step_info["invalid_action"] and not terminated and not truncated and reward == 0.0
        assert obs in after and step_info["admissible_actions"] == info["admissible_actions"]
    assert env.step(env.expert_action())[4]["invalid_action"] is False
    env.close()


PARALLEL_PLAY = """
import json, sys
from concurrent.futures import ThreadPoolExecutor
from envs.textworld_env import TextWorldEnv

games, cache = json.loads(sys.argv[1]), sys.argv[2]

def transcript(challenge):
    env = TextWorldEnv(challenge=challenge, settings=games[challenge], cache_dir=cache)
    try:
        seen = [env.reset(seed=11)[0]]
        for _ in range(30):
            obs, reward, terminated, truncated, _ = env.step(env.expert_action())
            seen.append([obs, reward])
            if terminated or truncated:
                break
        return seen
    finally:
        env.close()

work = sorted(games) * 6
with ThreadPoolExecutor(8) as pool:
    together = list(pool.map(transcript, work))
alone = {challenge: transcript(challenge) for challenge in games}
assert together == [alone[challenge] for challenge in work], "a thread's game differs from the same game alone"
print("same")
"""


@pytest.mark.slow
@pytest.mark.timeout(900)  # the child's own bound is 600 s
def test_envs_in_parallel_threads_play_as_one_alone(cache):
    # The env managers step envs from a thread pool. TextWorld's rule parser and jericho's
    # frotz keep process-global state: unguarded, parallel loads raised parser errors and
    # once segfaulted the process. A fresh process (the parser's first loads raced) plays
    # fresh envs (a load each) from 8 threads, then each game alone.
    for challenge, settings in GAMES.items():  # generated here, so the child only loads
        env = TextWorldEnv(challenge=challenge, settings=settings, cache_dir=str(cache))
        env.reset(seed=11)
        env.close()
    done = subprocess.run([sys.executable, "-c", PARALLEL_PLAY, json.dumps(GAMES), str(cache)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.split() == ["same"], done.stderr[-3000:]


@pytest.fixture(scope="module")
def cooking_env(cache):
    # One env for all hypothesis examples: a reset with the same seed reuses the loaded game.
    env = TextWorldEnv(challenge="tw-cooking", settings=GAMES["tw-cooking"], cache_dir=str(cache))
    yield env
    env.close()


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(text=st.text(max_size=300))
def test_any_text_is_a_legal_step(text, cooking_env):
    cooking_env.reset(seed=11)
    obs, reward, terminated, truncated, info = cooking_env.step(text)
    assert isinstance(obs, str) and cooking_env.observation_space.contains(obs)
    assert isinstance(info["invalid_action"], bool) and isinstance(info["success"], bool)


@pytest.mark.slow
def test_step_after_the_end_and_close(cache, monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # what the engine leaves in temp
    env = TextWorldEnv(challenge="tw-coin_collector", settings=GAMES["tw-coin_collector"], cache_dir=str(cache))
    rewards, _ = play_walkthrough(env, seed=11)
    obs, reward, terminated, _, info = env.step("look")
    assert terminated and reward == 0.0 and info["success"] and "game is over" in obs
    env.close()
    env.close()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RuntimeError, match="after close"):
        env.reset(seed=11)


@pytest.mark.slow
def test_generate_command_and_registered_ids(cache, capsys):
    assert main(["generate", "--challenge", "tw-coin_collector", "--seeds", "20-21", "--cache-dir", str(cache),
                 "level=2"]) == 0
    printed = capsys.readouterr().out.split()
    assert len(printed) == 2 and all(p.endswith("game.z8") for p in printed)
    env = gymnasium.make("roll_agent/TWCoinCollector-v0", cache_dir=str(cache), level=2)
    assert env.unwrapped.settings == {"level": 2}
    env.close()
    # num_games bounds what the checker's many resets generate.
    assert check_text_env("roll_agent/TextWorld-v0", challenge="tw-treasure_hunter", level=2, num_games=2,
                          cache_dir=str(cache))


@pytest.mark.slow
@pytest.mark.timeout(1300)  # two children of up to 600 s each
def test_a_seed_makes_the_same_game_in_every_process(tmp_path):
    # tw-cooking's generator depends on the hash seed; generation runs with a fixed one.
    for run, hash_seed in (("a", "1"), ("b", "2")):
        done = subprocess.run(
            [sys.executable, "-m", "envs.textworld_env", "generate", "--challenge", "tw-cooking", "--seeds", "5",
             "--cache-dir", str(tmp_path / run)],
            env={**os.environ, "PYTHONHASHSEED": hash_seed}, cwd=REPO, capture_output=True, text=True, timeout=600,
        )
        assert done.returncode == 0, done.stderr[-2000:]
    games = [next((tmp_path / run).glob("tw-cooking/*/seed-5/game.json")).read_bytes() for run in "ab"]
    assert games[0] == games[1]
