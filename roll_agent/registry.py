"""One way to plug things in: a registry per component kind, each a map from a name to what
implements it.

A config names a component by a registered name (`engine.type=hf`) or by `package.module:Name`,
a user's own, imported when the config is validated (so a typo fails at start-up, naming the
registered names and the closest). Adding an engine, trainer, estimator, loss, tracker, tool
parser, weight sync or sandbox backend needs no edit inside roll_agent: name it in the config. Built-ins are
registered below as `module:attribute` strings, imported only when used (the vllm engine
imports vllm, the deepspeed trainer deepspeed).

What each kind's entry is called with (the contracts it returns: roll_agent/protocols.py):

    kind          config field              called as
    engine        engine.type               (model_path, cfg: EngineConfig, model_cfg: ModelConfig, seed) -> Engine
    trainer       trainer.type              (model_path, cfg: TrainerConfig, algo: AlgorithmConfig,
                                             model_cfg: ModelConfig, temperature, seed) -> Trainer
    advantage     algorithm.advantage       (rewards [N], group_ids [N], turn_rewards, state_keys,
                                             *, std_normalize, gamma, step_weight, eps) -> per-turn tensors
    loss          algorithm.loss            (logp, logp_old, logp_behav, advantages [B, T],
                                             *, clip_low, clip_high, is_cap, rewards [B]) -> (loss [B, T], diag)
    tracker       logging.backends[]        (out: Path, cfg: LoggingConfig, run_config: dict) -> Tracker
    tool parser   endpoint.tool_parser      (text) -> (content, tool_calls)
    weight sync   weight_sync.type          (trainer, cfg: Config) -> WeightSync (`trainer`: the trainer
                                             under the local runtime, the trainer actor's handle under ray)
    sandbox       make_sandbox(backend)     a Sandbox class with a `config_class` dataclass of its options

roll_agent/train/algorithms.py says what an estimator and a loss compute (docs/algorithms.md:
the built-ins' math); docs/architecture.md ("Extending") says what each kind's entry does, and
tests/plugins.py has one of each.
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any


class RegistryError(ValueError):
    """A name no registry knows, or a `module:Name` that does not import."""


class Registry:
    def __init__(self, kind: str, builtins: dict[str, str]):
        """`builtins`: name -> `module:attribute` of roll_agent's own; a user's are named in configs."""
        self.kind = kind
        self._entries = dict(builtins)

    def names(self) -> list[str]:
        return list(self._entries)

    def get(self, name: str) -> Any:
        """What `name` (a registered name or `module:Name`) stands for."""
        target = self._entries.get(name, name if ":" in str(name) else None)
        if target is None:
            raise RegistryError(self._unknown(name))
        return load_named(target, self.kind)

    def check(self, name: str) -> None:
        """Raise RegistryError unless `name` is registered or a `module:Name` that imports (a
        registered built-in is not imported: its extra may be absent until it is used)."""
        if name not in self._entries:
            self.get(name)

    def _unknown(self, name: str) -> str:
        close = difflib.get_close_matches(str(name), self.names(), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        return (f"no {self.kind} named {name!r}: the registered ones are {self.names()}, or name your own as "
                f"'package.module:Name'.{hint}")


def load_named(path: str, kind: str) -> Any:
    """The object `package.module:Name` names (`Name` may be dotted: `module:Class.method`)."""
    module, _, attr = path.partition(":")
    try:
        target = importlib.import_module(module)
    except ImportError as exc:
        raise RegistryError(f"the {kind} {path!r} cannot be imported: {exc} (is its module on PYTHONPATH?)") from exc
    for part in attr.split("."):
        if not part or not hasattr(target, part):
            raise RegistryError(f"the {kind} {path!r}: module {module!r} has no {attr!r} (name it as "
                                "'package.module:Name')")
        target = getattr(target, part)
    return target


ENGINES = Registry("engine", {
    "hf": "roll_agent.proxy.engines.hf:HFEngine",
    "vllm": "roll_agent.proxy.engines.vllm:VLLMEngine",
    "scripted": "roll_agent.proxy.engines.scripted:scripted_engine",
    "openai": "roll_agent.proxy.engines.openai:OpenAIEngine",  # evaluation only
})
TRAINERS = Registry("trainer", {
    "torch": "roll_agent.train.trainer:TorchTrainer",
    "deepspeed": "roll_agent.train.deepspeed_trainer:DeepSpeedTrainer",
})
ADVANTAGES = Registry("advantage estimator", {
    name: f"roll_agent.train.algorithms:{name}" for name in ("grpo", "rloo", "reinforce", "turn", "gigpo")})
LOSSES = Registry("policy loss", {
    name: f"roll_agent.train.algorithms:{name}_loss" for name in ("ppo", "tis", "cispo", "topr")})
TRACKERS = Registry("tracker", {
    "tensorboard": "roll_agent.trackers:TensorBoardTracker",
    "wandb": "roll_agent.trackers:WandbTracker",
    "mlflow": "roll_agent.trackers:MlflowTracker",
})
TOOL_PARSERS = Registry("tool parser", {"hermes": "roll_agent.agents.openai_api:parse_hermes"})
WEIGHT_SYNCS = Registry("weight sync", {
    "inprocess": "roll_agent.sync.inprocess:InProcessSync.from_config",
    "broadcast": "roll_agent.sync.actors:BroadcastSync.from_config",
    "object_store": "roll_agent.sync.actors:ObjectStoreSync.from_config",
})
SANDBOXES = Registry("sandbox backend", {
    "docker": "sandboxes.docker_backend:DockerSandbox",
    "bwrap": "sandboxes.bwrap_backend:BwrapSandbox",
    "local": "sandboxes.local_backend:LocalSandbox",
})
