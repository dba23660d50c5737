"""Engine placement: `engine.device=cuda:N` is a pool of GPUs, one engine each."""

from roll_agent.config import EngineConfig
from roll_agent.proxy.engines import engine_config


def test_cuda_device_is_a_pool_one_gpu_per_engine():
    cfg = EngineConfig(type="vllm", device="cuda:2", num_engines=3)
    assert [engine_config(cfg, i).device for i in range(3)] == ["cuda:2", "cuda:3", "cuda:4"]
    assert engine_config(cfg, 1).type == "vllm" and cfg.device == "cuda:2"


def test_cpu_and_bare_cuda_are_shared():
    assert engine_config(EngineConfig(device="cpu", num_engines=2), 1).device == "cpu"
    assert engine_config(EngineConfig(device="cuda", num_engines=2), 1).device == "cuda"
