"""The supervised warm-start ends by making the KL reference the warm-started policy:
RL's KL term anchors to the model RL starts from, not to the untrained one."""

import torch

from roll_agent.config import AlgorithmConfig, EnvSpec, ModelConfig, RolloutConfig, TrainerConfig, WarmupConfig
from roll_agent.rollout.chat import ChatFormatter
from roll_agent.train.trainer import TorchTrainer
from roll_agent.warmup import run_warmup
from tests.conftest import run
from tests.train.test_policy_step import multi_turn_groups


def test_warmup_moves_the_kl_reference_to_the_warm_started_policy(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    trainer = TorchTrainer(tiny_model_dir, TrainerConfig(micro_batch_size=4), AlgorithmConfig(kl_coef=0.1),
                           ModelConfig(), seed=0)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    formatter = ChatFormatter(AutoTokenizer.from_pretrained(tiny_model_dir))
    run(run_warmup(trainer, [EnvSpec()], formatter, WarmupConfig(sft_steps=2, episodes_per_step=4, lr=1e-2),
                   RolloutConfig(max_turns=3), seed=0))
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


def test_demonstrations_are_the_experts_actions_played_by_the_rollout_loop(tiny_model_dir):
    import random

    from transformers import AutoTokenizer

    from roll_agent.env_registry import make_env
    from roll_agent.types import Status
    from roll_agent.warmup import expert_manager

    formatter = ChatFormatter(AutoTokenizer.from_pretrained(tiny_model_dir))
    manager = expert_manager(EnvSpec(), formatter, RolloutConfig(max_turns=20), 0.0, random.Random(0))
    traj = run(manager.run_episode(seed=5))
    assert traj.status == Status.FINISHED and traj.success and traj.reward > 0
    env = make_env(EnvSpec())  # the same episode by hand: the expert's actions
    env.reset(seed=5)
    actions, done = [], False
    while not done:
        actions.append(env.unwrapped.expert_action())
        _, _, terminated, truncated, _ = env.step(actions[-1])
        done = terminated or truncated
    turns, ids = [], []  # the trained (loss-masked) token runs, one per turn
    for token, mask in zip(traj.token_ids, traj.loss_mask):
        if mask:
            ids.append(token)
        elif ids:
            turns.append(ids)
            ids = []
    turns += [ids] if ids else []
    assert [formatter.response_text(t) for t in turns] == actions
    assert traj.num_turns == len(actions) and set(traj.logprobs) == {0.0}
    run(manager.close())


def test_demonstrations_in_env_worker_processes_equal_those_played_here(tiny_model_dir):
    """Envs that live in worker processes (ALFWorld, TextWorld, or `workers: N`) give the
    warm-start the same demonstrations: the expert answers from its worker."""
    import random

    from transformers import AutoTokenizer

    from roll_agent.rollout.env_workers import EnvWorkers
    from roll_agent.types import Status
    from roll_agent.warmup import expert_manager

    formatter = ChatFormatter(AutoTokenizer.from_pretrained(tiny_model_dir))
    cfg = RolloutConfig(max_turns=20)
    workers = EnvWorkers()
    here = expert_manager(EnvSpec(), formatter, cfg, 0.3, random.Random(1))
    there = expert_manager(EnvSpec(workers=1), formatter, cfg, 0.3, random.Random(1), workers)
    try:
        for seed in (5, 6):
            a, b = run(here.run_episode(seed)), run(there.run_episode(seed))
            assert type(there.env).__name__ == "WorkerEnv"
            assert a.status == b.status and a.status in (Status.FINISHED, Status.TRUNCATED) and a.num_turns > 1
            assert (a.token_ids, a.loss_mask, a.reward) == (b.token_ids, b.loss_mask, b.reward)
    finally:
        run(here.close())
        run(there.close())
        workers.close()


def test_expert_actions_cut_at_the_token_budget_are_counted_and_named(tiny_model_dir, caplog):
    """A demonstration longer than rollout.max_new_tokens is cut where the model's turn would
    be: the warm-start says so (the model would learn unfinished actions) and names the fix."""
    from transformers import AutoTokenizer

    trainer = TorchTrainer(tiny_model_dir, TrainerConfig(micro_batch_size=4), AlgorithmConfig(), ModelConfig(), seed=0)
    formatter = ChatFormatter(AutoTokenizer.from_pretrained(tiny_model_dir))
    tool_env = EnvSpec(id="roll_agent/Calculator-v0")  # its expert's first action is a JSON tool call
    rows, warned = {}, {}
    for budget in (8, 512):
        rows[budget] = []
        caplog.clear()
        run(run_warmup(trainer, [tool_env], formatter, WarmupConfig(sft_steps=2, episodes_per_step=2, lr=1e-3),
                       RolloutConfig(max_turns=3, max_new_tokens=budget), seed=0, log_row=rows[budget].append))
        warned[budget] = [r.getMessage() for r in caplog.records if "cut at rollout.max_new_tokens" in r.getMessage()]
    assert len(warned[8]) == 1 and "rollout.max_new_tokens=8 " in warned[8][0]  # once per warm-start, not per step
    assert all(r["demo_actions_truncated"] >= 2 for r in rows[8])  # every demo's tool call
    assert warned[512] == [] and [r["demo_actions_truncated"] for r in rows[512]] == [0, 0]
    assert all(r["demo_success_rate"] == 1.0 for r in rows[512])


def test_the_warm_start_plays_in_the_runs_env_workers_and_leaves_them_running(tiny_model_dir):
    from transformers import AutoTokenizer

    from roll_agent.rollout.env_workers import EnvWorkers

    trainer = TorchTrainer(tiny_model_dir, TrainerConfig(micro_batch_size=4), AlgorithmConfig(), ModelConfig(), seed=0)
    formatter = ChatFormatter(AutoTokenizer.from_pretrained(tiny_model_dir))
    spec = EnvSpec(workers=1)
    workers = EnvWorkers()
    try:
        workers.start([spec])  # as the local runtime does
        (worker,) = workers.pool(spec).workers
        calls, call = [], worker.call
        worker.call = lambda op, key, *args: calls.append(op) or call(op, key, *args)
        run(run_warmup(trainer, [spec], formatter, WarmupConfig(sft_steps=1, episodes_per_step=2, lr=1e-3),
                       RolloutConfig(max_turns=3), seed=0, workers=workers))
        # its demonstrations ran there, and the rollout gets the worker as it was
        assert {"make", "reset", "step"} <= set(calls)
        assert worker.process.poll() is None and worker.hosted == 0
        assert workers.pool(spec).workers == [worker] and workers.restarts() == 0
    finally:
        workers.close()
