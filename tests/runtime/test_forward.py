"""Clients derived from a contract (roll_agent/runtime/forward.py), over a loopback transport
that serialises each call as a process boundary would: the real LLMProxy and SampleBuffer
behind them."""

from __future__ import annotations

import pickle
from typing import Protocol

import pytest

from roll_agent import protocols
from roll_agent.config import RolloutConfig, ScriptedEngineConfig
from roll_agent.proxy.engines.scripted import ScriptedEngine
from roll_agent.proxy.llm_proxy import LLMProxy
from roll_agent.rollout.accounting import EpisodeLedger
from roll_agent.rollout.buffer import SampleBuffer
from roll_agent.runtime.forward import answer, answer_async, forwards, members
from roll_agent.types import GenerateRequest, Group, SamplingParams, Status, Trajectory
from tests.conftest import run


def _over_the_wire(value):
    return pickle.loads(pickle.dumps(value))


@forwards(protocols.Proxy)
class LoopbackProxy:
    def __init__(self, target, proto=protocols.Proxy):
        self.target, self.proto, self.version = target, proto, -1
        self.notifications = []

    async def _forward_async(self, name, args, kwargs):
        return _over_the_wire(await answer_async(self.target, self.proto, name, *_over_the_wire((args, kwargs))))

    def _forward(self, name, args, kwargs):
        self.notifications.append(name)
        return _over_the_wire(answer(self.target, self.proto, name, args, kwargs))


def test_members_are_the_methods_and_the_plain_attributes():
    methods, attrs = members(protocols.Buffer)
    assert methods == {"is_fresh": False, "admit": True, "release": True, "put": True}
    assert attrs == ("async_ratio",)  # `ledger` is a component: it does not travel back with answers
    assert members(protocols.Trainer)[1] == ("version",)


def test_a_derived_client_forwards_calls_and_brings_back_the_served_version():
    proxy = LLMProxy([ScriptedEngine(ScriptedEngineConfig(response_tokens=3))], version=4)
    client = LoopbackProxy(proxy)
    assert isinstance(client, protocols.Proxy)

    result = run(client.generate(GenerateRequest([1, 2, 3], SamplingParams(max_new_tokens=3), "env-0")))
    assert len(result.token_ids) == 3 and result.versions == [4, 4, 4]
    assert client.version == 4  # the proxy's served version came back with the answer
    assert proxy.stats["requests"] == 1


@forwards(protocols.Ledger)
class LoopbackLedger(LoopbackProxy):
    pass


def test_a_plain_method_is_sent_as_a_notification():
    ledger = EpisodeLedger()
    client = LoopbackLedger(ledger, protocols.Ledger)
    assert isinstance(client, protocols.Ledger)
    assert client.start(3) is None and client.end(Status.FINISHED, 2) is None
    assert client.notifications == ["start", "end"]
    assert ledger.counts == {"started": 3, "finished": 2}


def test_only_the_contract_is_callable_and_a_method_added_to_it_is_forwarded_with_no_edit():
    buffer = SampleBuffer(RolloutConfig(groups_per_batch=1, group_size=2, group_size_redundancy=0))
    with pytest.raises(AttributeError, match="Buffer has no method 'get_batch'"):
        run(answer_async(buffer, protocols.Buffer, "get_batch", (0,), {}))

    class BufferWithBatches(protocols.Buffer, Protocol):  # a method added to the contract
        async def get_batch(self, train_version: int) -> list[Group]: ...

    @forwards(BufferWithBatches)
    class Client:
        async def _forward_async(self, name, args, kwargs):
            return await answer_async(buffer, BufferWithBatches, name, *_over_the_wire((args, kwargs)))

    client = Client()

    async def scenario():
        await client.admit()
        await client.put(Group(0, 1, "sim", [Trajectory(group_id=0, token_ids=[1]) for _ in range(2)]))
        return await client.get_batch(0)

    batch = run(scenario())
    assert [g.group_id for g in batch] == [0] and client.async_ratio == buffer.async_ratio


def test_every_client_the_runtimes_use_is_derived_from_its_contract():
    """A method added to a protocol needs no edit in roll_agent/runtime/: every client of a component in
    another process forwards each method of its contract it does not write out (the test above: a method
    added to the contract is forwarded), and the Ray rollout is the local RolloutStack over clients of
    the actors (a method added to Rollout and written in RolloutStack is inherited)."""
    pytest.importorskip("ray")
    from roll_agent.rollout.stack import RolloutStack
    from roll_agent.runtime.ray_hosts import RemoteBuffer, RemoteEngine, RemoteLedger, RemoteProxy
    from roll_agent.runtime.ray_runtime import RayRollout, RemoteTrainer
    from roll_agent.runtime.trainer_process import ProcessTrainer

    written_out = {  # (contract, the methods a client writes out itself)
        RemoteEngine: (protocols.Engine, {"generate", "abort", "load_weights", "close"}),
        RemoteProxy: (protocols.Proxy, {"generate"}),
        RemoteBuffer: (protocols.Buffer, {"is_fresh"}),  # the buffer's own: a pure function
        RemoteLedger: (protocols.Ledger, set()),
        RemoteTrainer: (protocols.Trainer, set()),
        ProcessTrainer: (protocols.Trainer, set()),
    }
    for client, (contract, own) in written_out.items():
        methods = members(contract)[0]
        forwarded = {name for name in methods if vars(client)[name].__doc__ == f"{contract.__name__}.{name}, forwarded."}
        assert set(methods) - forwarded == own, client.__name__

    assert issubclass(RayRollout, RolloutStack)
    # what it does beyond the local stack: refresh the snapshots its synchronous reads answer from
    assert set(vars(RayRollout)) & set(members(protocols.Rollout)[0]) == {"stats", "close", "refresh"}
