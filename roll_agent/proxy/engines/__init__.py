"""Inference engines behind the LLMProxy."""

from __future__ import annotations

import dataclasses

from roll_agent.config import EngineConfig, ModelConfig


def engine_config(cfg: EngineConfig, i: int) -> EngineConfig:
    """Engine i's own config: `device=cuda:N` is a pool of GPUs N .. N+num_engines-1, one each."""
    if not cfg.device.startswith("cuda:"):
        return cfg
    return dataclasses.replace(cfg, device=f"cuda:{int(cfg.device.split(':', 1)[1]) + i}")


def make_engines(cfg: EngineConfig, model_cfg: ModelConfig, model_path: str, seed: int = 0) -> list:
    """Build `cfg.num_engines` engines of `cfg.type` serving the checkpoint at `model_path`."""
    if cfg.type == "hf":
        from roll_agent.proxy.engines.hf import HFEngine

        return [HFEngine(model_path, engine_config(cfg, i), model_cfg, seed=seed + i) for i in range(cfg.num_engines)]
    if cfg.type == "vllm":
        from roll_agent.proxy.engines.vllm import VLLMEngine

        return [VLLMEngine(model_path, engine_config(cfg, i), model_cfg, seed=seed + i)
                for i in range(cfg.num_engines)]
    if cfg.type == "scripted":
        from roll_agent.proxy.engines.scripted import ScriptedEngine

        script = text_script(cfg.scripted.script, model_path) if cfg.scripted.script else None
        return [ScriptedEngine(cfg.scripted, seed=seed + i, script=script) for i in range(cfg.num_engines)]
    if cfg.type == "openai":
        from roll_agent.proxy.engines.openai import OpenAIEngine

        return [OpenAIEngine(model_path, cfg, model_cfg, seed=seed + i) for i in range(cfg.num_engines)]
    raise ValueError(f"engine.type={cfg.type!r}: use hf, vllm, scripted or openai")


def text_script(path: str, model_path: str):
    """`engine.scripted.script`: a user's `module:function` (prompt text -> response text) as the
    scripted engine's token script, framed by the model's tokenizer (the response ends with its eos)."""
    import importlib

    from transformers import AutoTokenizer

    module, _, name = path.partition(":")
    try:
        answer = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"engine.scripted.script={path!r} cannot be imported: {exc} (name it as module:function)") from exc
    tokenizer = AutoTokenizer.from_pretrained(model_path)

    def script(prompt_ids: list[int]) -> list[int]:
        text = tokenizer.decode(prompt_ids, skip_special_tokens=False)
        return tokenizer.encode(answer(text), add_special_tokens=False) + [tokenizer.eos_token_id]
    return script
