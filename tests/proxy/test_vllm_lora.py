"""LoRA adapter-only sync into the vLLM engine: after a push of the trainer's adapters
(torch and deepspeed trainers), the engine's greedy tokens and log-probs are the merged
model's. One LoRA engine serves the module (vLLM takes ~20-40 s to start on CPU).
Skipped where vLLM is not installed (the `vllm` extra)."""

import copy
import shutil

import pytest
import torch

pytest.importorskip("vllm")

from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from roll_agent.config import (  # noqa: E402
    AlgorithmConfig, DeepSpeedConfig, EngineConfig, LoraConfig, ModelConfig, TrainerConfig)
from roll_agent.proxy.engines import make_engines  # noqa: E402
from roll_agent.train.trainer import TorchTrainer, make_trainer  # noqa: E402
from roll_agent.sync.inprocess import InProcessSync  # noqa: E402
from roll_agent.types import SamplingParams  # noqa: E402
from tests.conftest import run, tiny_batch  # noqa: E402

pytestmark = pytest.mark.slow

# r=4 is served with vLLM's smallest max_lora_rank above it (8)
MODEL_CFG = ModelConfig(lora=LoraConfig(enabled=True, r=4, alpha=8))
PROMPTS = [[5, 9, 11, 20, 33], [7, 8, 40, 41]]


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir, tmp_path_factory):
    """The fixture model with head_dim 32 (vLLM's CPU attention has no kernel for 16)."""
    out = tmp_path_factory.mktemp("tiny_model_lora_hd32")
    shutil.copytree(tiny_model_dir, out, dirs_exist_ok=True)
    config = AutoConfig.from_pretrained(tiny_model_dir)
    config.num_attention_heads, config.num_key_value_heads = 2, 1
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out)
    return str(out)


@pytest.fixture(scope="module")
def engine(model_dir):
    cfg = EngineConfig(type="vllm", kv_cache_space_gib=0.5, max_batch_size=8)
    (eng,) = make_engines(cfg, MODEL_CFG, model_dir, seed=0)
    yield eng
    run(eng.close())


def _greedy(model, prompt, n=8):
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        logits = model(torch.tensor([ids])).logits[0, len(prompt) - 1:-1]
    lps = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[len(prompt):])[:, None]).squeeze(-1)
    return ids[len(prompt):], lps


def _push_and_compare(engine, trainer, merged, version):
    async def go():
        report = await InProcessSync(trainer.named_weights).push([engine], version)
        outs = [await engine.generate(p, SamplingParams(max_new_tokens=8, greedy=True), f"v{version}-{i}")
                for i, p in enumerate(PROMPTS)]
        return report, outs

    report, outs = run(go())
    assert engine.version == version
    for prompt, out in zip(PROMPTS, outs):
        tokens, lps = _greedy(merged, prompt)
        assert out.token_ids == tokens
        assert (lps - torch.tensor(out.logprobs)).abs().max() <= 1e-3
    return report


def _merged(trainer):
    return copy.deepcopy(trainer.model).merge_and_unload().eval()


def test_torch_trainer_adapters_sync_into_vllm(engine, model_dir):
    base = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    trainer = TorchTrainer(model_dir, TrainerConfig(lr=0.2), AlgorithmConfig(loss="tis"), MODEL_CFG)
    for _ in range(3):
        trainer.step(tiny_batch())
    merged = _merged(trainer)
    with torch.no_grad():
        moved = merged(torch.tensor([PROMPTS[0]])).logits - base(torch.tensor([PROMPTS[0]])).logits
    assert moved.abs().max() > 1e-3, "training must have moved the adapters"
    report = _push_and_compare(engine, trainer, merged, version=1)
    full_bytes = sum(p.numel() * 4 for p in base.parameters())
    assert 0 < report["bytes"] < full_bytes / 5


def test_deepspeed_trainer_adapters_replace_the_served_adapter(engine, model_dir):
    pytest.importorskip("deepspeed", reason="the `deepspeed` extra is not installed")
    cfg = TrainerConfig(type="deepspeed", lr=0.2, deepspeed=DeepSpeedConfig(zero_stage=2))
    trainer = make_trainer(model_dir, cfg, AlgorithmConfig(loss="tis"), MODEL_CFG)
    for _ in range(2):
        trainer.step(tiny_batch())
    _push_and_compare(engine, trainer, _merged(trainer), version=2)
    with pytest.raises(KeyError, match="LoRA adapters only"):
        run(engine.load_weights([("model.embed_tokens.weight", torch.zeros(2))], version=3))
    assert engine.version == 2
