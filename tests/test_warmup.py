"""The supervised warm-start ends by making the KL reference the warm-started policy:
RL's KL term anchors to the model RL starts from, not to the untrained one."""

import torch

from roll_agent.config import AlgorithmConfig, EnvSpec, ModelConfig, RolloutConfig, TrainerConfig, WarmupConfig
from roll_agent.rollout.chat import ChatFormatter
from roll_agent.train.trainer import TorchTrainer
from roll_agent.warmup import run_warmup
from tests.train.test_policy_step import multi_turn_groups


def test_warmup_moves_the_kl_reference_to_the_warm_started_policy(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    trainer = TorchTrainer(tiny_model_dir, TrainerConfig(micro_batch_size=4), AlgorithmConfig(kl_coef=0.1),
                           ModelConfig(), seed=0)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    formatter = ChatFormatter(AutoTokenizer.from_pretrained(tiny_model_dir))
    run_warmup(trainer, [EnvSpec()], formatter, WarmupConfig(sft_steps=2, episodes_per_step=4, lr=1e-2),
               RolloutConfig(max_turns=3), seed=0)
    ref = dict(trainer.ref_model.named_parameters())
    moved = False
    for name, p in trainer.model.named_parameters():
        torch.testing.assert_close(ref[name], p, rtol=0, atol=0, msg=name)
        moved |= not torch.equal(p, before[name])
    assert moved, "the warm-start changed no weight"
    assert not any(p.requires_grad for p in trainer.ref_model.parameters())
    # the first RL step's policy is the reference: its k3 KL is 0
    assert trainer.step(multi_turn_groups())["kl"] == 0.0
    # a resumed run has no warm-start: the checkpoint brings the reference back
    trainer.save(tmp_path / "ckpt")
    resumed = TorchTrainer(tiny_model_dir, TrainerConfig(micro_batch_size=4), AlgorithmConfig(kl_coef=0.1),
                           ModelConfig(), seed=0)
    resumed.load(tmp_path / "ckpt")
    for name, p in resumed.ref_model.named_parameters():
        torch.testing.assert_close(p, ref[name], rtol=0, atol=0, msg=name)
