"""WeightSync implementations (the contract: roll_agent/protocols.py, `WeightSync`): each moves
the trainer's weights into the engines it is given, while the LLMProxy that owns it is
suspended, and returns a `SyncReport` (bytes moved, seconds taken).

    inprocess.InProcessSync   tensors copied between models in one process (the local runtime)
    inprocess.VersionOnlySync no weights, only the version (scripted engines in tests, benchmarks)
    actors.BroadcastSync      trainer actor -> engine actors: torch.distributed in flat buckets (buckets.py)
    actors.ObjectStoreSync    trainer actor -> engine actors: one object in Ray's store (LoRA adapters)

Which one a run uses is `weight_sync.type` (a name in roll_agent/registry.py: WEIGHT_SYNCS, or
a user's `module:Name`), chosen and checked against the runtime here, in one place.
"""

from __future__ import annotations

from roll_agent.config import Config, ConfigError
from roll_agent.registry import WEIGHT_SYNCS


def weight_sync_type(cfg: Config) -> str:
    """`weight_sync.type`, with `auto` resolved: inprocess under the local runtime; under ray,
    broadcast, or object_store for LoRA adapters and beside DeepSpeed (whose trainer owns the
    actor's default process group, which the broadcast group would replace)."""
    kind, ray = cfg.weight_sync.type, cfg.runtime.type == "ray"
    deepspeed = cfg.trainer.type == "deepspeed"
    if kind == "auto":
        return ("object_store" if cfg.model.lora.enabled or deepspeed else "broadcast") if ray else "inprocess"
    if not ray and kind in ("broadcast", "object_store"):
        raise ConfigError(f"weight_sync.type={kind} moves weights between processes: use it with runtime.type=ray, "
                          "or set weight_sync.type=auto")
    if ray and kind == "inprocess":
        raise ConfigError("weight_sync.type=inprocess needs one process: under runtime.type=ray use auto, "
                          "broadcast or object_store")
    if ray and kind == "broadcast" and deepspeed:
        raise ConfigError("weight_sync.type=broadcast cannot run beside trainer.type=deepspeed under "
                          "runtime.type=ray (both need the trainer actor's process group): use auto or object_store")
    return kind


def make_weight_sync(cfg: Config, trainer):
    """The run's WeightSync, pushing the weights of `trainer`: the trainer itself under the local
    runtime, the trainer actor's handle under ray. Each entry is called as (trainer, cfg)."""
    return WEIGHT_SYNCS.get(weight_sync_type(cfg))(trainer, cfg)
