"""Every episode keeps its turns: where each model call's sampled tokens lie, the state it was
played from (the env's info["state_key"], else a hash of the observation) and its reward."""

from concurrent.futures import ThreadPoolExecutor

import gymnasium

from roll_agent.config import EnvSpec, RolloutConfig
from roll_agent.proxy.engines.scripted import ScriptedEngine
from roll_agent.proxy.llm_proxy import LLMProxy
from roll_agent.rollout.env_manager import EnvServices
from roll_agent.types import state_key
from tests.conftest import run


def mask_runs(loss_mask: list[int]) -> list[tuple[int, int]]:
    runs, start = [], None
    for i, m in enumerate(loss_mask + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


def play(formatter, spec: EnvSpec, answers: list[str], seed: int = 5):
    replies = iter(answers)
    engine = ScriptedEngine(script=lambda _: formatter.encode(next(replies)) + [formatter.end_of_turn_id])
    rollout = RolloutConfig(max_turns=len(answers), max_new_tokens=64, max_context_tokens=4096)
    manager = EnvServices(formatter, LLMProxy([engine]), rollout, ThreadPoolExecutor(2)).env_manager("e0", spec)

    async def go():
        try:
            return await manager.run_episode(seed=seed)
        finally:
            await manager.close()

    return run(go())


def test_env_turns_record_spans_states_and_rewards(formatter):
    spec = EnvSpec(id="roll_agent/FrozenLake-v0", kwargs={"invalid_action_penalty": -0.1})
    traj = play(formatter, spec, ["zzz", "right", "zzz", "down"])
    env = gymnasium.make(spec.id, **spec.kwargs)
    _, info = env.reset(seed=5)
    assert len(traj.turns) == traj.num_turns >= 2
    assert [(t.start, t.end) for t in traj.turns] == mask_runs(traj.loss_mask)
    assert all(t.sample == 0 for t in traj.turns)
    assert [t.reward for t in traj.turns] == traj.step_rewards
    assert traj.turns[0].reward == -0.1  # the invalid answer's penalty is its own turn's
    # FrozenLake keys states by its render: the invalid first answer left the player where it was
    assert traj.turns[0].state_key == traj.turns[1].state_key == info["state_key"]
    env.close()


def test_without_a_state_key_a_turn_is_keyed_by_its_observation(formatter):
    """An env whose infos have no state_key (the plain gymnasium contract): each turn's key is
    the hash of the observation it was shown."""
    spec = EnvSpec(id="roll_agent/ReverseLetters-v0")
    traj = play(formatter, spec, ["olleh"])
    env = gymnasium.make(spec.id)
    obs, info = env.reset(seed=5)
    assert "state_key" not in info
    assert [t.state_key for t in traj.turns] == [state_key(obs, {})]
    env.close()
