"""mini-swe-agent (the `mini-swe-agent` package, unchanged) as a roll_agent agent on SWE tasks.

`solve(task, client)` runs mini-swe-agent's `DefaultAgent` with its own SWE-bench config
(`minisweagent/config/benchmarks/swebench.yaml`: its prompts, its bash tool, its submit
command): its model is mini's `LitellmModel` pointed at the episode's endpoint session
(`openai/<model>` at `client.base_url` with the session key), and its commands run in the
sandbox of the task's `roll_agent/SWE-v0` env (docker or bwrap, started by that env's reset)
through `SandboxEnvironment`, mini's environment interface over roll_agent's sandbox. When mini
submits (or stops), `roll_agent/Agent-v0` has the SWE env grade the diff left in the sandbox
(`envs.swe.grading`). configs/swe_mini_swe_agent.yaml is the config.

Run as a plain function (mini is synchronous): roll_agent runs it in a thread.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"  # mini's: the first output line of the submit command


class SandboxEnvironment:
    """mini-swe-agent's Environment interface (execute, get_template_vars, serialize) over a roll_agent sandbox."""

    def __init__(self, sandbox, cwd: str = "/testbed", timeout: float = 60.0, env: dict[str, str] | None = None):
        self.sandbox, self.cwd, self.timeout, self.env = sandbox, cwd, timeout, dict(env or {})

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        from minisweagent.exceptions import Submitted

        result = self.sandbox.exec(action.get("command", ""), timeout=timeout or self.timeout, env=self.env or None,
                                   workdir=cwd or self.cwd)
        output = {"output": result.output, "returncode": result.exit_code,
                  "exception_info": f"the command timed out after {timeout or self.timeout:.0f}s" if result.timed_out
                  else ""}
        lines = result.output.lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_MARKER and result.exit_code == 0:
            submission = "".join(lines[1:])
            raise Submitted({"role": "exit", "content": submission,
                             "extra": {"exit_status": "Submitted", "submission": submission}})
        return output

    def get_template_vars(self, **kwargs) -> dict[str, Any]:
        return {"cwd": self.cwd, "timeout": self.timeout, **kwargs}

    def serialize(self) -> dict:
        return {"info": {"config": {"environment": {"cwd": self.cwd, "timeout": self.timeout},
                                    "environment_type": f"{__name__}.SandboxEnvironment"}}}


def swebench_config() -> dict:
    import minisweagent

    return yaml.safe_load((Path(minisweagent.__file__).parent / "config" / "benchmarks" / "swebench.yaml").read_text())


def solve(task: dict, client, step_limit: int = 30, command_timeout_s: float = 60.0,
          model_kwargs: dict | None = None) -> dict:
    """One mini-swe-agent run on the task's SWE env; returns mini's exit status and submission."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm would fetch its price list
    import litellm
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.models.litellm_model import LitellmModel

    class EndpointModel(LitellmModel):
        # an error from the endpoint (a turn limit, an ended episode) ends the run: no retrying for minutes
        abort_exceptions = [*LitellmModel.abort_exceptions, litellm.exceptions.BadRequestError,
                            litellm.exceptions.APIConnectionError]

    litellm.suppress_debug_info = True  # it prints a provider list whenever it cannot price a call
    swe_env = task["env"]
    if getattr(swe_env, "sandbox", None) is None:
        raise ValueError("mini_swe_agent.solve needs the task env of roll_agent/SWE-v0 (task_env: roll_agent/SWE-v0)")
    config = swebench_config()
    model = EndpointModel(
        model_name="openai/roll_agent", cost_tracking="ignore_errors",
        model_kwargs={"api_base": str(client.base_url), "api_key": client.api_key, "drop_params": True,
                      **(model_kwargs or {})},
        **{k: v for k, v in config.get("model", {}).items() if k in ("observation_template", "format_error_template")})
    environment = SandboxEnvironment(swe_env.sandbox, swe_env.instance.workdir, command_timeout_s,
                                     {k: str(v) for k, v in config.get("environment", {}).get("env", {}).items()
                                      if k != "BASH_ENV"})
    agent_cfg = {**config["agent"], "step_limit": step_limit, "cost_limit": 0}
    agent = DefaultAgent(model, environment, **agent_cfg)
    info = agent.run(task=swe_env.instance.problem_statement)
    return {"exit_status": info.get("exit_status", ""), "submission": info.get("submission", ""),
            "model_calls": agent.n_calls}
