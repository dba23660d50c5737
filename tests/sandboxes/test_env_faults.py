"""A sandbox container killed mid-episode (the real docker backend) ends that episode
with env_error; the env is rebuilt with a fresh container and the next episode plays."""

from concurrent.futures import ThreadPoolExecutor

import gymnasium
import pytest

from roll_agent.config import EnvSpec, RolloutConfig
from roll_agent.proxy.engines.scripted import ScriptedEngine
from roll_agent.proxy.llm_proxy import LLMProxy
from roll_agent.rollout.env_manager import EnvServices
from roll_agent.types import Status
from tests.conftest import run


class SandboxShellEnv(gymnasium.Env):
    """Each action runs as `echo` in a docker sandbox; four steps an episode."""

    def __init__(self):
        from sandboxes import make_sandbox

        self.sandbox = make_sandbox("docker").start()
        self.observation_space = self.action_space = gymnasium.spaces.Text(10_000)
        self._t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return "a shell", {"instructions": "Say anything."}

    def step(self, action):
        result = self.sandbox.exec("echo turn", timeout=10)
        self._t += 1
        return result.output, float(result.ok), self._t >= 4, False, {"success": result.ok}

    def close(self):
        self.sandbox.close()


gymnasium.register(id="SandboxShell-v0", entry_point=SandboxShellEnv)


@pytest.mark.docker
@pytest.mark.slow
def test_container_killed_mid_episode_is_env_error_and_the_next_episode_plays(formatter, docker_image):
    from sandboxes.build_image import docker_client

    calls = []

    def script(prompt_ids):
        calls.append(1)
        if len(calls) == 2:  # the model's second turn: the env's container dies under it
            docker_client().containers.get(manager.env.unwrapped.sandbox.id).kill()
        return formatter.encode("hello") + [formatter.end_of_turn_id]

    proxy = LLMProxy([ScriptedEngine(script=script)])
    rollout = RolloutConfig(max_turns=4, step_timeout_s=30)
    services = EnvServices(formatter, proxy, rollout, ThreadPoolExecutor(2))
    manager = services.env_manager("e0", EnvSpec(id=f"{__name__}:SandboxShell-v0"))

    async def go():
        try:
            return [await manager.run_episode(seed=s) for s in (0, 1)]
        finally:
            await manager.close()

    killed, after = run(go(), timeout=120)
    assert killed.status is Status.ENV_ERROR and killed.num_turns == 2, (killed.status, killed.error)
    assert after.status is Status.FINISHED and after.num_turns == 4, after.error
