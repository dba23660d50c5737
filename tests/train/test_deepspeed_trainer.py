"""The deepspeed trainer on CPU (DeepSpeed's CPU accelerator, a gloo world of one):
each ZeRO stage trains, matches the torch trainer's update, checkpoints and resumes,
and its LoRA adapters sync into the hf engine. Skipped where DeepSpeed is not
installed (the `deepspeed` extra)."""

import pytest
import torch
from transformers import AutoModelForCausalLM

pytest.importorskip("deepspeed", reason="the `deepspeed` extra is not installed")

from roll_agent.config import (  # noqa: E402
    AlgorithmConfig, DeepSpeedConfig, EngineConfig, LoraConfig, ModelConfig, TrainerConfig)
from roll_agent.proxy.engines.hf import HFEngine  # noqa: E402
from roll_agent.train.deepspeed_trainer import DeepSpeedTrainer  # noqa: E402
from roll_agent.train.trainer import TorchTrainer, make_trainer  # noqa: E402
from roll_agent.sync.inprocess import InProcessSync  # noqa: E402
from roll_agent.types import SamplingParams  # noqa: E402
from tests.conftest import run, tiny_batch  # noqa: E402

pytestmark = pytest.mark.slow


def _cfg(stage: int, **kw) -> TrainerConfig:
    kw = {"lr": 0.01, "micro_batch_size": 2, **kw}
    return TrainerConfig(type="deepspeed", deepspeed=DeepSpeedConfig(zero_stage=stage), **kw)


def _weights(trainer) -> dict[str, torch.Tensor]:
    return {n: t.float().clone() for n, t in trainer.named_weights()}


@pytest.mark.parametrize("stage,extra", [
    (1, {}),
    (2, {"gradient_checkpointing": True}),
    (3, {"dtype": "bfloat16"}),
], ids=["zero1", "zero2-checkpointing", "zero3-bf16"])
def test_each_zero_stage_trains(tiny_model_dir, stage, extra):
    trainer = make_trainer(tiny_model_dir, _cfg(stage, **extra), AlgorithmConfig(kl_coef=0.05), ModelConfig())
    assert isinstance(trainer, DeepSpeedTrainer)
    before = _weights(trainer)
    for _ in range(2):
        metrics = trainer.step(tiny_batch())
        assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values()), metrics
        assert metrics["grad_norm"] > 0 and metrics["skipped_updates"] == 0
    after = _weights(trainer)
    assert trainer.version == 2
    assert before.keys() == after.keys()
    assert all(not torch.equal(before[n], after[n]) for n in before), "every parameter should move"
    assert metrics["kl"] > 0  # the reference stayed at the initial weights


def test_zero2_update_equals_the_torch_trainer(tiny_model_dir):
    """Same loss code, same AdamW, same lr schedule (warmup: 0.005, then 0.01): fp32 ZeRO and
    plain torch take the same two steps."""
    algo, schedule = AlgorithmConfig(), {"lr_schedule": "linear", "lr_warmup_steps": 2, "lr_decay_steps": 4}
    ds = DeepSpeedTrainer(tiny_model_dir, _cfg(2, **schedule), algo, ModelConfig())
    plain = TorchTrainer(tiny_model_dir, TrainerConfig(lr=0.01, micro_batch_size=2, **schedule), algo, ModelConfig())
    for lr in (0.005, 0.01):
        m_ds, m_plain = ds.step(tiny_batch()), plain.step(tiny_batch())
        assert m_ds["lr"] == m_plain["lr"] == pytest.approx(lr)
        assert m_ds["loss"] == pytest.approx(m_plain["loss"], rel=1e-4, abs=1e-6)
        assert m_ds["grad_norm"] == pytest.approx(m_plain["grad_norm"], rel=1e-4)
    theirs = _weights(plain)
    for name, mine in _weights(ds).items():
        torch.testing.assert_close(mine, theirs[name], rtol=1e-4, atol=1e-5)


def test_no_signal_skips_the_update(tiny_model_dir):
    trainer = DeepSpeedTrainer(tiny_model_dir, _cfg(2), AlgorithmConfig(), ModelConfig())
    flat = tiny_batch()
    for t in flat[0].trajectories:
        t.reward = 1.0  # one group, equal rewards: every advantage is 0
    before = _weights(trainer)
    metrics = trainer.step(flat)
    assert metrics["skipped_updates"] == 1 and metrics["grad_norm"] == 0 and trainer.version == 1
    assert all(torch.equal(before[n], t) for n, t in _weights(trainer).items())


def test_checkpoint_resumes_exactly(tiny_model_dir, tmp_path):
    a = DeepSpeedTrainer(tiny_model_dir, _cfg(3), AlgorithmConfig(), ModelConfig())
    a.step(tiny_batch())
    a.save(tmp_path / "ck")
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "ck" / "model")
    mine = _weights(a)
    for name, p in exported.named_parameters():
        torch.testing.assert_close(p.float(), mine[name])
    a.step(tiny_batch())
    b = DeepSpeedTrainer(tiny_model_dir, _cfg(3), AlgorithmConfig(), ModelConfig(), seed=5)
    b.load(tmp_path / "ck")
    assert b.version == 1
    b.step(tiny_batch())  # optimizer moments and the shuffling RNG came back too: the same second step
    theirs = _weights(b)
    for name, t in _weights(a).items():
        torch.testing.assert_close(t, theirs[name])


def test_lora_adapters_sync_into_the_hf_engine(tiny_model_dir, tmp_path):
    model_cfg = ModelConfig(lora=LoraConfig(enabled=True, r=4, alpha=8))
    trainer = DeepSpeedTrainer(tiny_model_dir, _cfg(2, lr=0.05), AlgorithmConfig(loss="tis", kl_coef=0.1), model_cfg)
    for _ in range(2):
        metrics = trainer.step(tiny_batch())
    assert metrics["kl"] > 0  # against the adapter-disabled base
    batch = trainer.batch(tiny_batch()[0].trajectories)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    torch.testing.assert_close(trainer.reference_logprobs(batch), trainer.logprobs(batch, base)[0])

    names = [n for n, _ in trainer.named_weights()]
    assert names and all("lora_" in n for n in names)
    engine = HFEngine(tiny_model_dir, EngineConfig(), model_cfg)

    async def go():
        report = await InProcessSync(trainer.named_weights).push([engine], version=2)
        out = await engine.generate([1, 2, 3, 4, 5], SamplingParams(max_new_tokens=6, greedy=True), "r")
        await engine.close()
        return report, out

    report, out = run(go())
    full_bytes = sum(p.numel() * 4 for p in base.parameters())
    assert 0 < report["bytes"] < full_bytes / 5 and engine.version == 2
    trainer.save(tmp_path / "ck")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "ck" / "model").eval()
    ids = [1, 2, 3, 4, 5]
    with torch.no_grad():
        for _ in range(6):
            ids.append(int(merged(torch.tensor([ids])).logits[0, -1].argmax()))
        logits = merged(torch.tensor([ids])).logits[0, 4:-1]
    assert out.token_ids == ids[5:]
    ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(out.token_ids)[:, None]).squeeze(-1)
    assert (ref - torch.tensor(out.logprobs)).abs().max() <= 1e-4
    with torch.no_grad():
        assert not torch.allclose(base(torch.tensor([ids])).logits[0, 4:-1], logits, atol=1e-4)


def test_the_run_trains_with_deepspeed_and_lora(tmp_path):
    """`python -m roll_agent.run trainer.type=deepspeed`: warm-start, 2 RL steps, adapter syncs, checkpoint."""
    from roll_agent.metrics import read_rows
    from roll_agent.run import train
    from tests.test_run import small_cfg

    cfg = small_cfg(tmp_path, "trainer.type=deepspeed", "trainer.deepspeed.zero_stage=3", "model.lora.enabled=true",
                    "warmup.sft_steps=1", "warmup.episodes_per_step=2", "algorithm.kl_coef=0.01")
    assert run(train(cfg), timeout=300) == 2
    rows = [r for r in read_rows(tmp_path / "metrics.jsonl") if "loss" in r]
    assert [r["version"] for r in rows] == [1, 2] and all(r["grad_norm"] == r["grad_norm"] for r in rows)
    ckpt = tmp_path / "checkpoints" / "step_000002"
    assert (ckpt / "adapter" / "adapter_model.safetensors").exists() and (ckpt / "deepspeed").is_dir()
    assert sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(ckpt / "model").parameters()) > 0
