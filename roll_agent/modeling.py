"""Loading the policy model, shared by the trainer and the `hf` engine so both hold
the same parameters under the same names (LoRA adapters included)."""

from __future__ import annotations

import inspect

import torch
from transformers import AutoModelForCausalLM

from roll_agent.config import ModelConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_policy(path: str, cfg: ModelConfig, device: str = "cpu", dtype: str | None = None):
    """The causal LM at `path`, wrapped with fresh LoRA adapters when `cfg.lora.enabled`."""
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=DTYPES[dtype or cfg.dtype], trust_remote_code=cfg.trust_remote_code
    ).to(device)
    if cfg.lora.enabled:
        from peft import LoraConfig, get_peft_model

        lora = cfg.lora
        torch.manual_seed(0)  # identical adapter init in trainer and engines
        model = get_peft_model(model, LoraConfig(
            r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
            target_modules=list(lora.target_modules), task_type="CAUSAL_LM"))
    return model


def sync_parameters(model, cfg: ModelConfig):
    """What a weight sync moves: only the adapters under LoRA, else every parameter."""
    for name, param in model.named_parameters():
        if not cfg.lora.enabled or "lora_" in name:
            yield name, param


def logits_to_keep_kwargs(model, keep: int) -> dict:
    """`{"logits_to_keep": keep}` where the model can compute logits for its last `keep`
    positions only (transformers' causal LMs; through a peft wrapper too), else `{}`."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    supported = getattr(base, "_roll_agent_keeps_logits", None)
    if supported is None:
        supported = "logits_to_keep" in inspect.signature(base.forward).parameters
        base._roll_agent_keeps_logits = supported
    return {"logits_to_keep": keep} if supported else {}
