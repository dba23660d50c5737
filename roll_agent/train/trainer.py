"""The `torch` trainer: single process, CPU or GPU, plain AdamW on fp32 master weights
(trainer.dtype=bfloat16 autocasts the forward). The RL step itself is shared with the
other backends (`roll_agent/train/policy.py`)."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from roll_agent.config import AlgorithmConfig, Config, ModelConfig, TrainerConfig
from roll_agent.modeling import load_policy
from roll_agent.registry import TRAINERS
from roll_agent.train.policy import PolicyTrainer


class TorchTrainer(PolicyTrainer):
    def __init__(self, model_path: str, cfg: TrainerConfig, algo: AlgorithmConfig, model_cfg: ModelConfig | None = None,
                 temperature: float = 1.0, seed: int = 0):
        super().__init__(cfg, algo, model_cfg, temperature, seed)
        self.device = torch.device(cfg.device)
        torch.manual_seed(seed)
        self.model = self.net = self._prepare(load_policy(model_path, self.model_cfg, cfg.device, dtype="float32"))
        if algo.kl_coef > 0 and not self.lora:  # under LoRA the reference is the adapter-disabled base
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.model.train()
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay,
        )

    def _zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def _backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def _apply_gradients(self) -> float:
        params = [p for p in self.model.parameters() if p.requires_grad]
        norm = float(torch.nn.utils.clip_grad_norm_(params, self.cfg.max_grad_norm))
        if norm > 0:
            self.optimizer.step()
        return norm

    def _param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    def save(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        if self.lora:  # the adapter for resuming, and the merged model for transformers users
            self.model.save_pretrained(path / "adapter")
            copy.deepcopy(self.model).merge_and_unload().save_pretrained(path / "model")
        else:
            self.model.save_pretrained(path / "model")
        torch.save({"optimizer": self.optimizer.state_dict(), **self._trainer_state()},
                   path / "trainer_state.pt")

    def load(self, path: Path) -> None:
        state = torch.load(path / "trainer_state.pt", weights_only=False)
        if self.lora:
            from peft import set_peft_model_state_dict
            from safetensors.torch import load_file

            set_peft_model_state_dict(self.model, load_file(path / "adapter" / "adapter_model.safetensors"))
        else:
            loaded = AutoModelForCausalLM.from_pretrained(path / "model", dtype=torch.float32)
            self.model.load_state_dict(loaded.state_dict())
        self.optimizer.load_state_dict(state["optimizer"])
        self._restore_trainer_state(state)


def make_trainer(model_path: str, cfg: TrainerConfig, algo: AlgorithmConfig, model_cfg: ModelConfig,
                 temperature: float = 1.0, seed: int = 0):
    """The trainer backend named by `trainer.type` (roll_agent/registry.py: TRAINERS)."""
    return TRAINERS.get(cfg.type)(model_path, cfg, algo, model_cfg, temperature, seed)


def trainer_for_run(cfg: Config, model_path: str):
    """The trainer of a run's config (every runtime builds it here: in this process, a child or an actor).
    Its lr schedule decays over the run's `max_steps` unless `trainer.lr_decay_steps` says otherwise."""
    trainer_cfg = dataclasses.replace(cfg.trainer, lr_decay_steps=cfg.trainer.lr_decay_steps or cfg.max_steps)
    return make_trainer(model_path, trainer_cfg, cfg.algorithm, cfg.model, cfg.rollout.temperature, seed=cfg.seed)
