"""The `deepspeed` trainer: ZeRO stages 1/2/3 (optionally offloaded to the CPU), bf16
mixed precision, gradient checkpointing; the same contract and RL step as the torch
trainer (`roll_agent/train/policy.py`).

- One process per trainer rank. Started outside a launcher (the local runtime: one
  process), it joins a world of one itself (gloo on CPU, NCCL on GPU), so ZeRO-3 with
  offload still lets a model larger than one GPU's memory train there.
- Micro-batches per optimizer step vary with the batch, so DeepSpeed's own gradient
  accumulation counter is off (`managed_gradient_accumulation: false`): every
  `backward` accumulates and `engine.step()` is the boundary.
- On CPU (`trainer.device=cpu`) DeepSpeed runs with its CPU accelerator
  (`DS_ACCELERATOR=cpu`); its first use JIT-compiles a communication op with g++ (~35 s,
  then cached under ~/.cache/torch_extensions).
- Weights for the engines are gathered under ZeRO-3 in buckets of at most 256 MB, so no
  rank ever holds the whole model twice.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import torch

from roll_agent.config import AlgorithmConfig, ModelConfig, TrainerConfig
from roll_agent.modeling import load_policy
from roll_agent.train.policy import PolicyTrainer

GATHER_BUCKET_NUMEL = 1 << 26  # 64M elements (256 MB in fp32) gathered per ZeRO-3 collective


def import_deepspeed(device: str):
    """`import deepspeed` with the CPU accelerator selected on CPU (it must be set before the import)."""
    if not device.startswith("cuda"):
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        import deepspeed
    except ImportError as exc:
        raise ImportError("trainer.type=deepspeed needs DeepSpeed: pip install -e '.[deepspeed]' "
                          "(on CPU it also needs g++ for its JIT-built ops)") from exc
    return deepspeed


def init_distributed(device: str) -> None:
    """Join the launcher's process group, or a world of one when started without a launcher."""
    import torch.distributed as dist

    deepspeed = import_deepspeed(device)
    if dist.is_initialized():
        if dist.get_world_size() == 1:  # a world of one lives as long as the process; DeepSpeed
            _world_of_one_env()  # also reads its rank from the environment, which may have changed since
        return
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device) if ":" in device else int(os.environ.get("LOCAL_RANK", 0)))
    if "MASTER_ADDR" not in os.environ:  # no launcher (they all set it): a world of one
        # it needs no rendezvous: an in-process store, so no TCP port can be taken by another
        # process between choosing it and binding it (Ray opens many)
        _world_of_one_env()
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    deepspeed.init_distributed(dist_backend=backend, verbose=False)  # adopts a group already made


def _world_of_one_env() -> None:
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")


def ds_config(cfg: TrainerConfig) -> dict:
    ds = cfg.deepspeed
    zero: dict = {"stage": ds.zero_stage}
    pin = cfg.device.startswith("cuda")
    if ds.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": pin}
    if ds.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": pin}
    config = {
        "train_micro_batch_size_per_gpu": cfg.micro_batch_size,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "gradient_clipping": cfg.max_grad_norm,
        "bf16": {"enabled": cfg.dtype == "bfloat16"},
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,  # torch's AdamW as the client optimizer
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    if ds.offload_optimizer:  # DeepSpeed's CPU Adam runs the step where the states live
        config["optimizer"] = {"type": "AdamW", "params": {
            "lr": cfg.lr, "betas": list(cfg.betas), "weight_decay": cfg.weight_decay}}
    return config


class DeepSpeedTrainer(PolicyTrainer):
    def __init__(self, model_path: str, cfg: TrainerConfig, algo: AlgorithmConfig, model_cfg: ModelConfig | None = None,
                 temperature: float = 1.0, seed: int = 0):
        super().__init__(cfg, algo, model_cfg, temperature, seed)
        init_distributed(cfg.device)
        deepspeed = import_deepspeed(cfg.device)
        self.model_path = model_path
        self.zero3 = cfg.deepspeed.zero_stage == 3
        torch.manual_seed(seed)
        model = self._prepare(load_policy(model_path, self.model_cfg, "cpu", dtype="float32"))
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        config = ds_config(cfg)
        optimizer = None if "optimizer" in config else torch.optim.AdamW(
            params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, model_parameters=params, optimizer=optimizer, config=config)
        self.model, self.net = self.engine.module, self.engine
        self.device = self.engine.device
        self._autocast_bf16 = False  # bf16 weights already, when asked for
        if algo.kl_coef > 0 and not self.lora:  # under LoRA the reference is the adapter-disabled base
            dtype = "bfloat16" if cfg.dtype == "bfloat16" else "float32"
            self.ref_model = load_policy(model_path, ModelConfig(trust_remote_code=self.model_cfg.trust_remote_code),
                                         str(self.device), dtype=dtype).eval().requires_grad_(False)

    # ---- backend hooks -------------------------------------------------------
    def _zero_grad(self) -> None:
        self.engine.zero_grad()

    def _backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss, scale_wrt_gas=False)

    def _apply_gradients(self) -> float:
        self.engine.step()  # clips to trainer.max_grad_norm (`gradient_clipping`)
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else 0.0

    def _param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    # ---- weights -------------------------------------------------------------
    def _gathered(self, named) -> Iterator[tuple[str, torch.Tensor]]:
        """Each (name, full tensor). ZeRO-3 partitions are gathered in buckets of up to
        `GATHER_BUCKET_NUMEL` elements, one collective per bucket: a LoRA model's adapters
        all come in one call (per-parameter calls cost more than the adapters' bytes)."""
        if not self.zero3:
            for name, p in named:
                yield name, p.detach()
            return
        deepspeed = import_deepspeed(self.cfg.device)
        bucket, numel = [], 0
        for name, p in [*named, (None, None)]:
            if bucket and (p is None or numel + p.ds_numel > GATHER_BUCKET_NUMEL):
                with deepspeed.zero.GatheredParameters([q for _, q in bucket]):
                    gathered = [(n, q.detach().clone()) for n, q in bucket]
                yield from gathered
                bucket, numel = [], 0
            if p is not None:
                bucket.append((name, p))
                numel += p.ds_numel

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        yield from self._gathered(self._synced())

    # ---- checkpoints ---------------------------------------------------------
    def save(self, path: Path) -> None:
        """`deepspeed/`: DeepSpeed's own checkpoint (module and partitioned optimizer states),
        for resuming; `model/` (and `adapter/` under LoRA) for transformers users."""
        path.mkdir(parents=True, exist_ok=True)
        self.engine.save_checkpoint(str(path / "deepspeed"), tag="state", exclude_frozen_parameters=self.lora)
        named = self._synced() if self.lora else self.model.named_parameters()
        weights = {n: t.to("cpu", torch.float32 if self.lora else t.dtype) for n, t in self._gathered(named)}
        if torch.distributed.get_rank() == 0:  # every rank gathers, one writes
            if self.lora:
                self.model.save_pretrained(path / "adapter", state_dict=weights)
                merged = load_policy(self.model_path, self.model_cfg, "cpu", dtype="float32")
                merged.load_state_dict(weights, strict=False)
                merged.merge_and_unload().save_pretrained(path / "model")
            else:
                self.model.save_pretrained(path / "model", state_dict=weights)
        torch.save(self._trainer_state(), path / "trainer_state.pt")

    def load(self, path: Path) -> None:
        self.engine.load_checkpoint(str(path / "deepspeed"), tag="state", load_module_strict=not self.lora)
        self._restore_trainer_state(torch.load(path / "trainer_state.pt", weights_only=False))
