"""The real rollout stack with its agent endpoint, on the scripted engine: each test's agent is a
real client (the openai SDK, the OpenAI Agents SDK, a subprocess) calling it over loopback."""

from __future__ import annotations

import contextlib

from roll_agent.config import EndpointConfig, EnvSpec, RolloutConfig, ScriptedEngineConfig
from roll_agent.proxy.engines.scripted import ScriptedEngine
from roll_agent.rollout.stack import build_rollout
from roll_agent.types import Trajectory

TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}]
TOOL_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'


def answering(formatter, answer):
    """A scripted engine's script: `answer(prompt_text) -> response text`, ended by the turn's stop token."""
    def script(prompt_ids: list[int]) -> list[int]:
        text = formatter.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        return formatter.encode(answer(text)) + [formatter.end_of_turn_id]
    return script


def tool_then_answer(text: str) -> str:
    """Calls `add` until a tool result is in the conversation, then answers with it."""
    last_turn = text.rsplit("<|im_start|>", 2)[-2]
    if "<tool_response>" in last_turn:
        return "The sum is " + last_turn.split("<tool_response>\n")[1].split("\n")[0] + "."
    return TOOL_CALL


def stack_for(formatter, script=None, rollout: RolloutConfig | None = None, specs: list[EnvSpec] | None = None,
              engine_cfg: ScriptedEngineConfig | None = None, endpoint: EndpointConfig | None = None,
              num_engines: int = 1):
    engines = [ScriptedEngine(engine_cfg or ScriptedEngineConfig(), seed=i, script=script) for i in range(num_engines)]
    rollout = rollout or RolloutConfig(num_env_groups=1, groups_per_batch=1, group_size=2, group_size_redundancy=0,
                                       max_turns=8, max_new_tokens=256, max_context_tokens=4096)
    return build_rollout(formatter, rollout, specs or [EnvSpec()], engines, endpoint_cfg=endpoint)


def train_stack(stack, steps: int = 2, timeout: float = 120):
    """Consume `steps` batches of `stack` like the controller, then close it: (stack, consumed)."""
    from tests.conftest import run
    from tests.rollout.harness import train_loop

    async def go():
        try:
            return await train_loop(stack, steps=steps)
        finally:
            await stack.close()

    return stack, run(go(), timeout=timeout)


@contextlib.asynccontextmanager
async def session_of(stack, env_id: str = "agent-test"):
    """A started endpoint and one open session; yields (session, base_url)."""
    await stack.services.endpoint.start()
    session = stack.services.endpoint.open_session(env_id, Trajectory(env_id=env_id))
    try:
        yield session, stack.services.endpoint.session_url(session)
    finally:
        stack.services.endpoint.close_session(session)


# the SWE task fixtures (a tiny real project with a bug, its docker image) for mini-swe-agent
from tests.swe.conftest import swe_image, swe_instance, swe_project  # noqa: E402,F401
