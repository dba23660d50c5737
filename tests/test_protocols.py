"""Every implementation of a contract in roll_agent/protocols.py has its members, with the
same sync/async kind, in both runtimes; built objects pass the runtime isinstance check."""

from __future__ import annotations

import inspect

import pytest

from roll_agent import protocols
from roll_agent.config import RolloutConfig, ScriptedEngineConfig
from roll_agent.proxy.engines.hf import HFEngine
from roll_agent.proxy.engines.openai import OpenAIEngine
from roll_agent.proxy.engines.scripted import ScriptedEngine
from roll_agent.proxy.engines.vllm import VLLMEngine
from roll_agent.rollout.chat import ChatFormatter
from roll_agent.rollout.stack import RolloutStack, build_rollout
from roll_agent.runtime.trainer_process import ProcessTrainer
from roll_agent.sync.inprocess import InProcessSync, VersionOnlySync
from roll_agent.train.deepspeed_trainer import DeepSpeedTrainer
from roll_agent.train.trainer import TorchTrainer

ray = pytest.importorskip("ray")
from roll_agent.proxy.llm_proxy import LLMProxy  # noqa: E402
from roll_agent.rollout.buffer import SampleBuffer  # noqa: E402
from roll_agent.runtime.ray_hosts import OwnedBuffer, RemoteBuffer, RemoteEngine, RemoteProxy  # noqa: E402
from roll_agent.runtime.ray_runtime import RayRollout, RemoteTrainer  # noqa: E402
from roll_agent.sync.actors import BroadcastSync, ObjectStoreSync  # noqa: E402

IMPLEMENTATIONS = {
    protocols.Engine: [HFEngine, VLLMEngine, OpenAIEngine, ScriptedEngine, RemoteEngine],
    protocols.Proxy: [LLMProxy, RemoteProxy],
    protocols.Buffer: [SampleBuffer, OwnedBuffer, RemoteBuffer],
    protocols.Trainer: [TorchTrainer, DeepSpeedTrainer, ProcessTrainer, RemoteTrainer],
    protocols.WeightSync: [InProcessSync, VersionOnlySync, BroadcastSync, ObjectStoreSync],
    protocols.Rollout: [RolloutStack, RayRollout],
}
CASES = [(proto, cls) for proto, classes in IMPLEMENTATIONS.items() for cls in classes]


def _methods(proto) -> dict[str, bool]:
    """The protocol's methods -> whether each is a coroutine function."""
    return {name: inspect.iscoroutinefunction(fn) for name, fn in vars(proto).items()
            if inspect.isfunction(fn) and not name.startswith("_")}


@pytest.mark.parametrize(("proto", "cls"), CASES, ids=[f"{p.__name__}-{c.__name__}" for p, c in CASES])
def test_each_implementation_has_the_protocols_methods(proto, cls):
    for name, is_async in _methods(proto).items():
        method = getattr(cls, name, None)
        assert callable(method), f"{cls.__name__} lacks {proto.__name__}.{name}"
        assert inspect.iscoroutinefunction(method) == is_async, \
            f"{cls.__name__}.{name} must be {'async' if is_async else 'a plain method'}"


@pytest.mark.parametrize("cls", IMPLEMENTATIONS[protocols.Engine], ids=lambda c: c.__name__)
def test_engines_declare_whether_they_restart(cls):
    assert cls.alive is True  # an engine starts alive
    assert isinstance(cls.restartable, bool)
    assert not cls.restartable or inspect.iscoroutinefunction(cls.restart)


def test_built_components_pass_the_isinstance_check(tiny_model_dir):
    from transformers import AutoTokenizer

    from roll_agent.config import AlgorithmConfig, EnvSpec, TrainerConfig

    engine = ScriptedEngine(ScriptedEngineConfig())
    assert isinstance(engine, protocols.Engine)
    trainer = TorchTrainer(tiny_model_dir, TrainerConfig(), AlgorithmConfig())
    assert isinstance(trainer, protocols.Trainer)
    assert isinstance(InProcessSync(trainer.named_weights), protocols.WeightSync)
    formatter = ChatFormatter(AutoTokenizer.from_pretrained(tiny_model_dir))
    stack = build_rollout(formatter, RolloutConfig(), [EnvSpec()], [engine])
    assert isinstance(stack, protocols.Rollout)
