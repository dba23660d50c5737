"""Malformed model output (garbage, empty, huge, odd unicode, broken tool calls) gets the
env's invalid-action handling and never ends an episode with an error."""

from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import envs
from roll_agent.config import EnvSpec, RolloutConfig
from roll_agent.proxy.engines.scripted import ScriptedEngine
from roll_agent.proxy.llm_proxy import LLMProxy
from roll_agent.rollout.env_manager import EnvServices
from roll_agent.types import Status
from tests.conftest import run

OUTPUTS = ["", "zzz qqq", "x" * 10_000, "ÄÖÜ 漢字 🤖 \u200b\u202e", '<tool_call>{"name": "move", "arguments": {',
           "\x00\x01\x02", "left right up down " * 50]
IDS = [i for i in envs.registered_ids() if i.split("/")[1].split("-")[0] in
       ("FrozenLake", "Sokoban", "Taxi", "CliffWalking", "Blackjack", "Calculator")]


@pytest.mark.parametrize("env_id", IDS)
def test_malformed_outputs_are_invalid_actions_not_errors(formatter, env_id):
    texts = iter(OUTPUTS * 10)

    def script(prompt_ids):
        return formatter.encode(next(texts)) + [formatter.end_of_turn_id]

    engine = ScriptedEngine(script=script)
    proxy = LLMProxy([engine])
    rollout = RolloutConfig(max_turns=len(OUTPUTS), max_new_tokens=20_000, max_context_tokens=100_000)
    manager = EnvServices(formatter, proxy, rollout, ThreadPoolExecutor(2)).env_manager("e0", EnvSpec(id=env_id))

    async def go():
        try:
            return await manager.run_episode(seed=3)
        finally:
            await manager.close()

    traj = run(go())
    assert traj.status in (Status.FINISHED, Status.TRUNCATED), traj.error
    assert traj.metrics["invalid_actions"] >= traj.num_turns - 1  # the repeated word list may parse


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_token_stream_from_the_model_ends_the_episode_normally(formatter, data):
    """Raw ids (stop and special tokens anywhere, unterminated tool calls, huge turns), not just text."""
    vocab = len(formatter.tokenizer)
    env_id = data.draw(st.sampled_from(IDS))
    turns = data.draw(st.lists(st.one_of(
        st.lists(st.integers(0, vocab - 1), max_size=300),
        st.sampled_from(OUTPUTS).map(formatter.encode),
        st.text(max_size=200).map(formatter.encode)), min_size=1, max_size=5))
    replies = iter(turns * 4)

    def script(prompt_ids):
        return next(replies)

    proxy = LLMProxy([ScriptedEngine(script=script)])
    rollout = RolloutConfig(max_turns=len(turns), max_new_tokens=400, max_context_tokens=4000)
    manager = EnvServices(formatter, proxy, rollout, ThreadPoolExecutor(1)).env_manager("e0", EnvSpec(id=env_id))

    async def go():
        try:
            return await manager.run_episode(seed=data.draw(st.integers(0, 99)))
        finally:
            await manager.close()

    traj = run(go())
    assert traj.status in (Status.FINISHED, Status.TRUNCATED), traj.error
    assert len(traj.token_ids) == len(traj.loss_mask) == len(traj.logprobs) == len(traj.versions)
