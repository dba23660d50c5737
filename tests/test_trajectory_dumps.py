"""Rollout dumps (roll_agent/trajectory_dumps.py): a run writes the episodes it trained, token for
token as the trainer got them, with the trainer's own log-probs; the folder keeps to its cap."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from roll_agent.config import TrajectoryLogConfig
from roll_agent.trajectory_dumps import TrajectoryDumps, read_dumps
from roll_agent.types import Group, Status, Trajectory


@pytest.mark.slow
def test_each_dumped_training_episode_is_the_sample_the_trainer_got(dumped_run):
    out, trained = dumped_run
    episodes = read_dumps(out)
    train_eps = [e for e in episodes if e["kind"] == "train"]
    assert sorted({e["step"] for e in train_eps}) == [1, 2]
    for e in train_eps:
        batch = trained[e["step"]]
        (traj,) = [t for g in batch for t in g.trajectories if (t.group_id, t.env_id) == (e["group_id"], e["env_id"])]
        assert e["token_ids"] == traj.token_ids and e["loss_mask"] == traj.loss_mask
        assert e["versions"] == traj.versions and e["seed"] == traj.seed and e["reward"] == traj.reward
        assert e["logprobs"] == pytest.approx(traj.logprobs, abs=1e-5)
        assert len(e["tokens"]) == len(e["token_ids"]) and e["train_version"] == e["step"] - 1
        # the turns are the sample's text: model answers where the mask is 1, in order
        assert [t["role"] for t in e["turns"]][0] == "prompt"
        assert sum(t["role"] == "model" for t in e["turns"]) == traj.num_turns
    # a batch's whole group is dumped (logging.trajectories.groups=1 of 1)
    for step in (1, 2):
        assert len([e for e in train_eps if e["step"] == step]) == len(trained[step][0].trajectories)
    evals = [e for e in episodes if e["kind"] == "eval"]
    assert sorted({e["step"] for e in evals}) == [0, 2] and all(e["trainer_logprobs"] is None for e in evals)


@pytest.mark.slow
def test_dumped_trainer_logprobs_are_the_policy_the_step_started_from(dumped_run):
    """Step 2 started from version 1 (checkpoints/step_000001): its log-probs of each dumped
    token, recomputed here with transformers, are the dumped trainer log-probs; and a token
    sampled at version 0 shows its age."""
    out, _ = dumped_run
    model = AutoModelForCausalLM.from_pretrained(out / "checkpoints" / "step_000001" / "model", dtype=torch.float32)
    model.eval()
    step2 = [e for e in read_dumps(out) if e["kind"] == "train" and e["step"] == 2]
    ages = set()
    for e in step2:
        ids = torch.tensor([e["token_ids"]])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None])[:, 0]
        mask = torch.tensor(e["loss_mask"][1:], dtype=torch.bool)
        got = torch.tensor(e["trainer_logprobs"][1:])
        assert mask.any()
        torch.testing.assert_close(got[mask], logp[mask], atol=2e-4, rtol=0)
        assert (got[~mask] == 0).all()
        ages |= {1 - v for v, m in zip(e["versions"], e["loss_mask"]) if m}
    assert ages <= {0, 1}


def _traj(n: int) -> Trajectory:
    traj = Trajectory(group_id=n, env_id=f"e{n}", env_tag="t", seed=n, status=Status.FINISHED)
    traj.append(list(range(5, 300)), generated=False)
    traj.append(list(range(10, 200)), generated=True, logprobs=[-0.5] * 190, versions=[0] * 190)
    traj.step_rewards.append(1.0)
    traj.num_turns = 1
    return traj


def test_the_folder_keeps_to_its_cap_dropping_the_oldest_steps(tmp_path, formatter):
    dumps = TrajectoryDumps(tmp_path, TrajectoryLogConfig(max_mb=0.01), formatter)  # ~10 kB
    for step in range(1, 8):
        batch = [Group(group_id=step, seed=step, env_tag="t", trajectories=[_traj(step), _traj(step + 100)])]
        picked = dumps.pick(step, batch)
        assert picked == [0, 1]  # one group of one: both its episodes
        rows = dumps.train(step, batch, picked, {0: [0.0] * 485})
        assert [r["seed"] for r in rows] == [step, step + 100]
    dumps.close()
    files = sorted((tmp_path / "trajectories").iterdir())
    sizes = sum(f.stat().st_size for f in files)
    assert "step_7.jsonl.gz" in {f.name for f in files}  # the newest is always kept
    assert len(files) < 7 and (sizes <= 0.01 * 2**20 or len(files) == 1)
    kept = read_dumps(tmp_path)
    assert {e["step"] for e in kept} == {int(f.name.split("_")[1].split(".")[0]) for f in files}
    assert [e["seed"] for e in kept[-2:]] == [7, 107]
    assert kept[-2]["trainer_logprobs"] == [0.0] * 485 and kept[-1]["trainer_logprobs"] is None
    assert kept[-2]["segments"] == [] and kept[-2]["turns"][1] == {"role": "model", "text": kept[-2]["turns"][1]["text"],
                                                                   "reward": 1.0}


def test_steps_between_dumps_and_groups_per_dump(tmp_path, formatter):
    dumps = TrajectoryDumps(tmp_path, TrajectoryLogConfig(every=2, groups=2), formatter)
    batch = [Group(group_id=g, seed=g, env_tag="t", trajectories=[_traj(g)]) for g in range(5)]
    assert dumps.pick(1, batch) == [] and dumps.pick(3, batch) == []
    picked = dumps.pick(4, batch)
    assert len(picked) == 2 and picked == dumps.pick(4, batch)  # the same groups for a step, every time
    assert TrajectoryDumps(tmp_path, TrajectoryLogConfig(every=0), formatter).pick(4, batch) == []
    dumps.close()


def test_a_resumed_run_drops_the_dumps_of_the_steps_it_redoes(tmp_path, formatter):
    folder = tmp_path / "trajectories"
    folder.mkdir()
    for step in (1, 2, 3):
        (folder / f"step_{step}.jsonl.gz").write_bytes(b"")
    TrajectoryDumps(tmp_path, TrajectoryLogConfig(), formatter, first_step=2).close()
    assert sorted(p.name for p in folder.iterdir()) == ["step_1.jsonl.gz", "step_2.jsonl.gz"]
    TrajectoryDumps(tmp_path, TrajectoryLogConfig(), formatter).close()  # a fresh run
    assert list(folder.iterdir()) == []
