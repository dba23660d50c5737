"""One plug-in of each registry kind, as a user would write them in a module of their own
(roll_agent/registry.py): tests/test_registry.py names them in a config, nothing else. Each
records its calls in CALLS so the test can see it was the one used."""

from __future__ import annotations

import dataclasses
from collections import Counter

import torch

from roll_agent.proxy.engines.hf import HFEngine
from roll_agent.sync.inprocess import InProcessSync
from roll_agent.train.trainer import TorchTrainer
from sandboxes.config import LocalConfig
from sandboxes.local_backend import LocalSandbox

CALLS: Counter = Counter()
SEEN: dict[str, list] = {"advantage_turns": [], "tracker_rows": []}


class CountingEngine(HFEngine):
    """engine.type=tests.plugins:CountingEngine: the hf engine, counting its requests."""

    async def generate(self, prompt_ids, sampling, request_id, on_tokens=None):
        CALLS["engine.generate"] += 1
        return await super().generate(prompt_ids, sampling, request_id, on_tokens)


class CountingTrainer(TorchTrainer):
    """trainer.type=tests.plugins:CountingTrainer: the torch trainer, counting its steps."""

    def step(self, groups, capture=()):
        CALLS["trainer.step"] += 1
        return super().step(groups, capture)


def last_turn_sign(rewards, group_ids, turn_rewards, state_keys, **options):
    """algorithm.advantage=tests.plugins:last_turn_sign: +1 on an episode's last turn when its
    return is above its group's mean, -1 when below, 0 on every other turn."""
    CALLS["advantage"] += 1
    SEEN["advantage_turns"].append([len(turns) for turns in turn_rewards])
    out = []
    for i, turns in enumerate(turn_rewards):
        group = [float(rewards[j]) for j in range(len(turn_rewards)) if group_ids[j] == group_ids[i]]
        sign = float(torch.sign(torch.tensor(float(rewards[i]) - sum(group) / len(group))))
        out.append(torch.tensor([0.0] * (len(turns) - 1) + [sign] if turns else []))
    return out


def vanilla_pg_loss(logp, logp_old, logp_behav, advantages, *, rewards, **options):
    """algorithm.loss=tests.plugins:vanilla_pg_loss: -A * log pi, no importance weight."""
    CALLS["loss"] += 1
    return -advantages * logp, {}


class ListTracker:
    """logging.backends=[jsonl, tests.plugins:ListTracker]: keeps every row it is given."""

    def __init__(self, out, cfg, run_config):
        CALLS["tracker.open"] += 1

    def log(self, scalars, step):
        SEEN["tracker_rows"].append((step, dict(scalars)))

    def table(self, name, rows, step):
        CALLS["tracker.table"] += 1

    def close(self):
        CALLS["tracker.close"] += 1


class CountingSync(InProcessSync):
    """weight_sync.type=tests.plugins:counting_sync: the in-process copy, counting its pushes."""

    async def push(self, engines, version):
        CALLS["weight_sync.push"] += 1
        return await super().push(engines, version)


def counting_sync(trainer, cfg):
    return CountingSync(trainer.named_weights)


def shouting_tool_parser(text: str):
    """endpoint.tool_parser=tests.plugins:shouting_tool_parser: no tool calls; content upper-cased."""
    CALLS["tool_parser"] += 1
    return text.upper(), []


@dataclasses.dataclass
class EchoConfig(LocalConfig):
    """The local backend's options and one of its own."""

    prefix: str = "echo"


class EchoSandbox(LocalSandbox):
    """make_sandbox("tests.plugins:EchoSandbox", unsafe=True, prefix=...): the local backend, each
    command run through `echo <prefix>` first."""

    config_class = EchoConfig

    def exec(self, cmd, timeout=None, env=None, workdir=None):
        CALLS["sandbox.exec"] += 1
        return super().exec(f"echo {self.config.prefix}; {cmd}", timeout=timeout, env=env, workdir=workdir)
