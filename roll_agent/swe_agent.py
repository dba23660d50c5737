"""Agent mode of `python -m roll_agent.swe_eval --policy CHECKPOINT_OR_CONFIG`.

A policy plays every task of a dataset in `roll_agent/SWE-v0` through the LLMProxy
(any engine: hf, vllm, openai, scripted), greedily, with the same EnvManager the
training rollout uses; the diff each episode leaves is written as a SWE-bench
prediction (instance_id, model_name_or_path, model_patch), plus how the episode
ended (`episode_status`, `end`, `num_turns`, `error`). The env does not grade here:
`swe_eval` grades the predictions file afterwards.

    from roll_agent.swe_agent import generate_predictions
    path = generate_predictions("outputs/swe", "data/swe_tasks/tasks.jsonl", "eval_out",
                                sandbox="docker", workers=4)

CHECKPOINT_OR_CONFIG is one of: a YAML config (its model, engine and rollout
sections; e.g. engine.type=openai for a model served elsewhere), a transformers
checkpoint directory, a run's output_dir (its latest checkpoint and config.yaml), or
a checkpoint step directory (`.../checkpoints/step_N`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from roll_agent.config import Config, EnvSpec, RolloutConfig
from roll_agent.config_loader import load_config
from roll_agent.rollout.chat import ChatFormatter
from roll_agent.rollout.env_manager import EnvManager, EnvServices
from roll_agent.types import Trajectory

SWE_ENV_ID = "roll_agent/SWE-v0"


def policy_config(policy: str, overrides: list[str] | None = None) -> Config:
    """The Config a CHECKPOINT_OR_CONFIG argument names (overrides applied last)."""
    path = Path(policy)
    overrides = list(overrides or [])
    if path.is_file():
        return load_config(str(path), overrides)
    if not path.is_dir():
        raise FileNotFoundError(f"--policy {policy!r}: no such file or directory; give a YAML config, a "
                                "checkpoint directory or a training run's output_dir")
    if (path / "checkpoints").is_dir():  # a run's output_dir: its latest checkpoint
        steps = sorted(p for p in (path / "checkpoints").glob("step_*") if (p / "model").is_dir())
        if not steps:
            raise FileNotFoundError(f"--policy {policy!r}: the run has no checkpoint yet under {path / 'checkpoints'}")
        config = path / "config.yaml"
        cfg = load_config(str(config) if config.exists() else None, overrides)
        return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=str(steps[-1] / "model")))
    model_dir = path / "model" if (path / "model" / "config.json").exists() else path
    if not (model_dir / "config.json").exists():
        raise FileNotFoundError(f"--policy {policy!r}: a directory without config.json is not a checkpoint")
    return load_config(None, [f"model.path={model_dir}", *overrides])


def swe_env_spec(cfg: Config, dataset: str, sandbox: str, instance_ids: list[str] | None) -> EnvSpec:
    """The config's SWE env (its tools, max_steps, ...) pointed at `dataset`; no grading in the env."""
    base = next((s for s in cfg.envs if s.id == SWE_ENV_ID), None)
    kwargs: dict[str, Any] = dict(base.kwargs) if base else {"max_steps": cfg.rollout.max_turns}
    kwargs.update(dataset=str(dataset), sandbox=sandbox, instance_ids=instance_ids, grade_on_submit=False)
    # the env must end (and record its patch) before the rollout's turn limit cuts the episode
    kwargs["max_steps"] = min(int(kwargs.get("max_steps") or cfg.rollout.max_turns), cfg.rollout.max_turns)
    return EnvSpec(id=SWE_ENV_ID, tag="swe", kwargs=kwargs)


async def rollout_predictions(spec: EnvSpec, num_tasks: int, proxy, formatter: ChatFormatter,
                              rollout: RolloutConfig, output: Path, model_name: str, workers: int = 1) -> Path:
    """One greedy episode per task (seed i = the env's i-th task) on `workers` env managers."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(num_tasks):
        queue.put_nowait(i)
    rows: dict[int, dict] = {}
    executor = ThreadPoolExecutor(max(workers, 1), thread_name_prefix="swe-agent")
    services = EnvServices(formatter, proxy, rollout, executor)
    managers = [services.env_manager(f"swe-agent-{w}", spec)
                for w in range(min(max(workers, 1), num_tasks))]

    async def work(manager: EnvManager) -> None:
        while not queue.empty():
            index = queue.get_nowait()
            traj = await manager.run_episode(index, greedy=True)
            rows[index] = await _prediction(manager, traj, model_name)

    try:
        await asyncio.gather(*(work(m) for m in managers))
    finally:
        for manager in managers:
            await manager.close()
        executor.shutdown(wait=False)
    output.parent.mkdir(parents=True, exist_ok=True)
    with open(output, "w", encoding="utf-8") as f:
        for index in sorted(rows):
            f.write(json.dumps(rows[index]) + "\n")
    return output


async def _prediction(manager: EnvManager, traj: Trajectory, model_name: str) -> dict:
    env = manager.env.unwrapped if manager.env is not None else None  # None: discarded after an env error
    patch, end, instance_id = "", "", ""
    if env is not None:
        # an episode cut short by the context budget never submitted: its work so far is the patch
        try:
            patch = await asyncio.get_running_loop().run_in_executor(manager.executor, env.current_patch)
        except Exception as exc:  # the sandbox died after the last step: no patch, said so
            traj.error = traj.error or f"taking the patch failed: {type(exc).__name__}: {exc}"
        end = env.last_episode.get("end", "") or "context_limit"
        instance_id = env.instance.instance_id
    return {"instance_id": instance_id or _instance_id(manager, traj), "model_name_or_path": model_name,
            "model_patch": patch, "episode_status": traj.status.value, "end": end,
            "num_turns": traj.num_turns, "error": traj.error}


def _instance_id(manager: EnvManager, traj: Trajectory) -> str:
    """The task of an episode whose env died (and was discarded): from the dataset order."""
    from envs.swe.env import select_instances
    from envs.swe.instance import load_instances

    kwargs = manager.spec.kwargs
    good = load_instances(kwargs["dataset"], errors="collect")[0]
    instances = select_instances(good, kwargs.get("instance_ids"), kwargs["dataset"])
    return instances[traj.seed % len(instances)].instance_id


def generate_predictions(policy: str, dataset: str, output_dir: str, *, instance_ids: list[str] | None = None,
                         sandbox: str = "docker", workers: int = 1, overrides: list[str] | None = None,
                         model_name: str | None = None) -> Path:
    """Roll `policy` out on `dataset` and write `output_dir/predictions.jsonl`; returns its path."""
    from transformers import AutoTokenizer

    from envs.swe.env import select_instances
    from envs.swe.instance import load_instances
    from roll_agent.proxy.engines import make_engines
    from roll_agent.proxy.llm_proxy import LLMProxy
    from roll_agent.tiny_model import prepare_model

    cfg = policy_config(policy, overrides)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    spec = swe_env_spec(cfg, dataset, sandbox, instance_ids)
    # malformed lines are skipped here; swe_eval reports them as errors
    num_tasks = len(select_instances(load_instances(dataset, errors="collect")[0], instance_ids, dataset))
    model_path = prepare_model(cfg, out)
    formatter = ChatFormatter(AutoTokenizer.from_pretrained(model_path))
    engines = make_engines(cfg.engine, cfg.model, model_path, seed=cfg.seed)

    async def go() -> Path:
        proxy = LLMProxy(engines, cfg.proxy)
        try:
            return await rollout_predictions(spec, num_tasks, proxy, formatter, cfg.rollout,
                                             out / "predictions.jsonl", model_name or policy, workers)
        finally:
            await proxy.close()

    return asyncio.run(go())
