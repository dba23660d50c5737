"""LoRA: adapters trained, only adapters synced, and the engine then matches the merged model."""


import torch
from transformers import AutoModelForCausalLM

from roll_agent.config import AlgorithmConfig, EngineConfig, LoraConfig, ModelConfig, TrainerConfig
from roll_agent.proxy.engines.hf import HFEngine
from roll_agent.train.trainer import TorchTrainer
from roll_agent.sync.inprocess import InProcessSync
from roll_agent.types import SamplingParams
from tests.conftest import run, tiny_batch


def test_adapter_only_sync_matches_merged_model(tiny_model_dir, tmp_path):
    model_cfg = ModelConfig(lora=LoraConfig(enabled=True, r=4, alpha=8))
    trainer = TorchTrainer(tiny_model_dir, TrainerConfig(lr=0.05), AlgorithmConfig(loss="tis"), model_cfg)
    for _ in range(3):
        trainer.step(tiny_batch())
    names = [n for n, _ in trainer.named_weights()]
    assert names and all("lora_" in n for n in names)
    engine = HFEngine(tiny_model_dir, EngineConfig(), model_cfg)
    sync = InProcessSync(trainer.named_weights)
    full_bytes = sum(p.numel() * 4 for p in AutoModelForCausalLM.from_pretrained(tiny_model_dir).parameters())

    async def go():
        report = await sync.push([engine], version=3)
        out = await engine.generate([1, 2, 3, 4, 5], SamplingParams(max_new_tokens=6, temperature=1.0), "r")
        return report, out

    report, out = run(go())
    assert 0 < report["bytes"] < full_bytes / 5
    trainer.save(tmp_path / "ck")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "ck" / "model").eval()
    ids = torch.tensor([[1, 2, 3, 4, 5] + out.token_ids])
    with torch.no_grad():
        logits = merged(ids).logits[0, 4:-1]
    ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(out.token_ids)[:, None]).squeeze(-1)
    assert (ref - torch.tensor(out.logprobs)).abs().mean() <= 1e-3
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():
        base_logits = base(ids).logits[0, 4:-1]
    assert not torch.allclose(base_logits, logits, atol=1e-4), "training must have moved the adapters"
