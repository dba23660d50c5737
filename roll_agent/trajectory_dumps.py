"""Rollout dumps: what the policy said and what was trained, episode by episode.

`logging.trajectories` picks, every `every` steps, `groups` of the step's batch (the same
groups for a given step in every run with that config) and, at each evaluation, its episodes,
and appends them to `output_dir/trajectories/step_<N>.jsonl.gz` (one JSON object per episode;
gzip members appended, so a step's training and evaluation episodes share its file). Each
record: the env id and tag, seed, group, status, reward, the turns as text (the prompt, each
model answer with its reward, each observation), and the token view of what was trained:
token ids and their text, loss mask, per-token policy versions, the sampler's (behaviour)
log-probs and the trainer's log-probs of the step that consumed it (pi_old: the policy the
step started from, captured by the update's own forward passes). An agent episode's further
segments come as `segments`; a SWE episode's patch and grade are in `info`.

Records are built and written on a background thread, off the training loop; the folder is
capped at `max_mb` (the oldest steps' files are dropped). `python -m roll_agent.view RUN_DIR`
shows them; `read_dumps(RUN_DIR)` loads them.
"""

from __future__ import annotations

import gzip
import json
import logging
import random
import re
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from roll_agent.config import TrajectoryLogConfig
from roll_agent.rollout.chat import ChatFormatter
from roll_agent.types import Group, Trajectory

log = logging.getLogger(__name__)

FILE = re.compile(r"step_(\d+)\.jsonl\.gz$")


class TrajectoryDumps:
    def __init__(self, output_dir: Path, cfg: TrajectoryLogConfig, formatter: ChatFormatter, first_step: int = 0):
        """`first_step`: the step a resumed run starts from: dumps of later steps (redone now) are
        dropped, as metrics.jsonl drops their rows; a fresh run (0) starts an empty folder."""
        self.dir = output_dir / "trajectories"
        self.cfg = cfg
        self.formatter = formatter
        for step, path in _files(self.dir):
            if not first_step or step > first_step:
                path.unlink()
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="trajectory-dumps")
        self._pending: list[Future] = []

    def pick(self, step: int, batch: list[Group]) -> list[int]:
        """Which samples of the batch that trains step `step` to dump: indices into its episodes'
        `samples()` in order (what `Trainer.step(capture=...)` takes); [] when this step has none."""
        if not self.cfg.every or step % self.cfg.every or not batch:
            return []
        chosen = set(random.Random(step).sample(range(len(batch)), min(self.cfg.groups, len(batch))))
        picked, index = [], 0
        for g, group in enumerate(batch):
            for traj in group.trajectories:
                for _ in traj.samples():
                    if g in chosen:
                        picked.append(index)
                    index += 1
        return picked

    def train(self, step: int, batch: list[Group], picked: list[int], trainer_logprobs: dict) -> list[dict]:
        """Dump the picked samples' episodes of the batch that trained step `step`; returns
        one summary row per episode (the trackers' rollout table)."""
        episodes, index, wanted = [], 0, set(picked)
        for group in batch:
            for traj in group.trajectories:
                indices = list(range(index, index + len(traj.samples())))
                index += len(indices)
                if indices[0] in wanted:
                    episodes.append((traj, [trainer_logprobs.get(i) for i in indices]))
        return self._write(step, "train", episodes)

    def evaluation(self, step: int, trajs: list[Trajectory]) -> list[dict]:
        if not self.cfg.eval:
            return []
        return self._write(step, "eval", [(t, [None] * len(t.samples())) for t in trajs])

    def _write(self, step: int, kind: str, episodes: list[tuple[Trajectory, list]]) -> list[dict]:
        if not episodes:
            return []
        self._pending = [f for f in self._pending if not f.done()]
        self._pending.append(self._writer.submit(self._append, step, kind, episodes))
        return [summary(step, kind, traj) for traj, _ in episodes]

    def _append(self, step: int, kind: str, episodes: list[tuple[Trajectory, list]]) -> None:
        try:
            lines = [json.dumps(record(step, kind, traj, lps, self.formatter)) for traj, lps in episodes]
            self.dir.mkdir(parents=True, exist_ok=True)
            with gzip.open(self.dir / f"step_{step}.jsonl.gz", "at", compresslevel=6) as f:
                f.write("".join(line + "\n" for line in lines))
            self._cap(keep=step)
        except Exception:  # a dump never ends the run
            log.exception("writing the trajectories of step %d failed", step)

    def _cap(self, keep: int) -> None:
        files = _files(self.dir)
        total = sum(p.stat().st_size for _, p in files)
        for step, path in files:
            if total <= self.cfg.max_mb * 2**20 or step == keep:
                break
            total -= path.stat().st_size
            path.unlink()

    def close(self) -> None:
        """Wait for the writes in flight."""
        self._writer.shutdown(wait=True)


def record(step: int, kind: str, traj: Trajectory, trainer_logprobs: list, formatter: ChatFormatter) -> dict:
    out = {"step": step, "kind": kind, "env_id": traj.env_id, "env_tag": traj.env_tag, "seed": traj.seed,
           "group_id": traj.group_id, "status": traj.status.value, "success": traj.success,
           "reward": traj.reward, "error": traj.error, "num_turns": traj.num_turns,
           "start_version": traj.start_version, "train_version": step - 1 if kind == "train" else step,
           "timing": traj.timing, "metrics": traj.metrics, "info": traj.info,
           **_sample(traj, trainer_logprobs[0], formatter)}
    out["segments"] = [_sample(seg, lps, formatter) for seg, lps in zip(traj.segments, trainer_logprobs[1:])]
    return out


def _sample(traj: Trajectory, trainer_logprobs: list[float] | None, formatter: ChatFormatter) -> dict:
    tok = formatter.tokenizer
    return {"turns": turns(traj, formatter),
            "token_ids": traj.token_ids, "tokens": tok.batch_decode([[i] for i in traj.token_ids]),
            "loss_mask": traj.loss_mask, "versions": traj.versions,
            "logprobs": [round(x, 5) for x in traj.logprobs],
            "trainer_logprobs": None if trainer_logprobs is None else [round(x, 5) for x in trainer_logprobs]}


def turns(traj: Trajectory, formatter: ChatFormatter) -> list[dict]:
    """The sample as text: the prompt, then each model answer (with its turn's reward) and the
    observation that followed, split where the loss mask changes."""
    runs: list[tuple[int, list[int]]] = []
    for token, mask in zip(traj.token_ids, traj.loss_mask):
        if runs and runs[-1][0] == mask:
            runs[-1][1].append(token)
        else:
            runs.append((mask, [token]))
    out, answer = [], 0
    for k, (mask, ids) in enumerate(runs):
        if mask:
            reward = traj.step_rewards[answer] if answer < len(traj.step_rewards) else None
            out.append({"role": "model", "text": formatter.response_text(ids), "reward": reward})
            answer += 1
        else:
            out.append({"role": "prompt" if k == 0 else "env", "text": formatter.tokenizer.decode(ids)})
    return out


def summary(step: int, kind: str, traj: Trajectory) -> dict:
    """One row of the trackers' rollout table."""
    return {"step": step, "kind": kind, "env_tag": traj.env_tag, "seed": traj.seed, "group_id": traj.group_id,
            "status": traj.status.value, "reward": traj.reward, "success": traj.success,
            "turns": traj.num_turns, "tokens": len(traj.token_ids), "segments": len(traj.segments)}


def read_dumps(run_dir: Path) -> list[dict]:
    """Every dumped episode of a run, oldest step first."""
    episodes = []
    for _, path in _files(Path(run_dir) / "trajectories"):
        try:
            with gzip.open(path, "rt") as f:
                for line in f:
                    episodes.append(json.loads(line))
        except (OSError, EOFError, json.JSONDecodeError) as exc:  # cut short by a killed run: what came before
            log.warning("%s ends early: %s", path, exc)
    return episodes


def _files(folder: Path) -> list[tuple[int, Path]]:
    """(step, path) of the dump files in `folder`, oldest step first."""
    if not folder.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in folder.iterdir() if (m := FILE.search(p.name)))
