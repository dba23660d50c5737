"""configs/gpu/: real models with vLLM engines and the deepspeed trainer on separate GPU pools."""

from pathlib import Path

import pytest

from roll_agent.config_loader import load_config
from roll_agent.proxy.engines import engine_config

GPU_CONFIGS = sorted((Path(__file__).parent.parent / "configs" / "gpu").glob("*.yaml"))


def test_there_are_gpu_presets():
    names = {p.name for p in GPU_CONFIGS}
    assert any("alfworld" in n for n in names) and any("swe" in n for n in names), names


@pytest.mark.parametrize("path", GPU_CONFIGS, ids=[p.name for p in GPU_CONFIGS])
def test_trainer_and_engines_use_separate_gpus(path):
    cfg = load_config(str(path))
    assert cfg.model.path.startswith("Qwen/Qwen2.5-") and cfg.model.path.endswith("-Instruct")
    assert cfg.engine.type == "vllm" and cfg.trainer.type == "deepspeed"
    engine_gpus = {engine_config(cfg.engine, i).device for i in range(cfg.engine.num_engines)}
    assert len(engine_gpus) == cfg.engine.num_engines and all(d.startswith("cuda:") for d in engine_gpus)
    assert cfg.trainer.device.startswith("cuda:") and cfg.trainer.device not in engine_gpus
    if any(s.id == "roll_agent/SWE-v0" for s in cfg.envs):
        assert cfg.rollout.step_timeout_s >= 300  # a submit runs the task's tests
