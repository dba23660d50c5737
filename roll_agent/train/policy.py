"""What every trainer backend shares: batches, log-probs, the RL loss and its metrics,
the SFT step, RNG/version state. A backend (`torch`, `deepspeed`) provides the model,
`_backward`, `_apply_gradients`, `_param_groups` and checkpoint files.

`step(groups)` computes advantages, the current log-probs on loss-masked tokens,
the configured policy loss (plus optional KL and entropy terms), accumulates
gradients over micro-batches, clips, takes optimizer steps and bumps the version.
"""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Collection, Iterator

import numpy as np
import torch

from roll_agent.config import AlgorithmConfig, ConfigError, ModelConfig, TrainerConfig
from roll_agent.modeling import logits_to_keep_kwargs, sync_parameters
from roll_agent.train import algorithms as alg
from roll_agent.train.batch import TokenBatch, collate, episode_turns, token_advantages
from roll_agent.train.lr_schedule import lr_at
from roll_agent.types import Group, Trajectory


class PolicyTrainer:
    # set by the backend: `model` is the transformers (or peft) module, whose names the
    # engines share; `net` is what the forward pass is called on (the DeepSpeed engine
    # wraps `model`); `ref_model` is a frozen copy for the KL term (None: no KL, or LoRA)
    model: torch.nn.Module
    net: torch.nn.Module
    ref_model: torch.nn.Module | None = None
    _reference_moved = False  # reset_reference() made the current policy the reference
    _synced_params: list | None = None
    device: torch.device
    narrow_logits = True  # logits only from the earliest trained token on (False: every position)

    def __init__(self, cfg: TrainerConfig, algo: AlgorithmConfig, model_cfg: ModelConfig | None,
                 temperature: float, seed: int):
        if cfg.lr_schedule != "constant" and cfg.lr_decay_steps == 0:
            raise ConfigError(f"trainer.lr_schedule={cfg.lr_schedule} needs trainer.lr_decay_steps: a trainer built "
                              "outside run.py (train.trainer.trainer_for_run) must be given its decay horizon")
        self.cfg = cfg
        self.algo = algo
        self.model_cfg = model_cfg or ModelConfig()
        self.lora = self.model_cfg.lora.enabled
        self.temperature = temperature
        self.version = 0
        self._rng = random.Random(seed)
        self._captured: dict[int, list[float]] = {}  # step(capture=...)'s log-probs, filled by _micro_loss
        self._autocast_bf16 = cfg.dtype == "bfloat16"  # a backend that keeps bf16 weights turns it off

    # ---- backend hooks -------------------------------------------------------
    def _zero_grad(self) -> None:
        raise NotImplementedError

    def _backward(self, loss: torch.Tensor) -> None:
        raise NotImplementedError

    def _apply_gradients(self) -> float:
        """Clip and step; returns the gradient norm before clipping (0: the step was skipped)."""
        raise NotImplementedError

    def _param_groups(self) -> list[dict]:
        raise NotImplementedError

    def _prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.cfg.gradient_checkpointing:  # recompute activations in backward: long episodes fit
            model.config.use_cache = False
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return model

    # ---- batches -----------------------------------------------------------
    def batch(self, trajs: list[Trajectory], advantages: list[list[float]] | None = None) -> TokenBatch:
        """`trajs` (and their per-token advantages) collated on this trainer's device; positions
        before the earliest trained token are skipped when the model can compute logits for the
        last positions only."""
        narrow = self.narrow_logits and bool(logits_to_keep_kwargs(self.model, 1))
        return collate(trajs, skip_untrained=narrow, advantages=advantages).to(self.device)

    def logprobs(self, batch: TokenBatch, model: torch.nn.Module | None = None, with_entropy: bool = False):
        """Log-probs [n, batch.num_targets] of the targets under `model` (default: the policy being
        trained), and the entropy there (None unless asked; it joins the autograd graph only when
        the loss has an entropy term)."""
        model = self.net if model is None else model
        ids, start = batch.ids, batch.start
        kwargs = logits_to_keep_kwargs(self.model, ids.shape[1] - start) if start else {}
        # No attention mask: rows are right-padded, and under causal attention a real token never
        # attends to the padding after it, so its logits are the same without one; without a mask
        # SDPA takes its causal kernel (forward + backward 1.7x faster on 3,000-token ALFWorld rows)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self._autocast_bf16):
            logits = model(input_ids=ids, **kwargs).logits
        logits = logits[:, -(ids.shape[1] - start):-1].float()
        if self.temperature != 1.0:
            logits = logits / self.temperature
        logsm = torch.log_softmax(logits, dim=-1)
        logp = logsm.gather(-1, ids[:, start + 1:, None]).squeeze(-1)
        entropy = None
        if with_entropy:
            with torch.set_grad_enabled(torch.is_grad_enabled() and self.algo.entropy_coef != 0):
                entropy = alg.entropy_from_log_softmax(logsm)
        return logp, entropy

    def _micro_batches(self, items: list[int]) -> Iterator[list[int]]:
        size = self.cfg.micro_batch_size
        for i in range(0, len(items), size):
            yield items[i:i + size]

    # ---- RL step -----------------------------------------------------------
    def step(self, groups: list[Group], capture: Collection[int] = ()) -> dict:
        """One RL update on `groups`. `capture`: indices into the batch's samples (its episodes'
        `samples()` in order) whose per-token log-probs under this step's starting policy (pi_old)
        come back as `metrics["trainer_logprobs"]` ({index: one value per token, 0 where untrained}),
        for the rollout dumps; computed by the update's own forward passes, at no extra cost."""
        start = time.perf_counter()
        groups, capture, refused = self._refuse_out_of_vocab(groups, capture)
        self._captured = {i: [] for i in capture}
        lr = lr_at(self.cfg, self.version)
        for group in self._param_groups():
            group["lr"] = lr
        episodes = [t for g in groups for t in g.trajectories]
        trajs = [s for t in episodes for s in t.samples()]  # an agent episode may be several samples
        adv = self._advantages(groups, episodes)
        order = list(range(len(trajs)))
        self._rng.shuffle(order)
        k = self.cfg.updates_per_batch
        minis = [order[i::k] for i in range(k)]
        old = self._proximal_logps(trajs) if k > 1 else None
        sums: dict[str, float] = {}
        for mini in minis:
            self._update(trajs, mini, adv, old, sums)
        self.version += 1
        tokens = sum(t.num_generated_tokens for t in trajs)
        n = max(sums.pop("_mask_tokens", 0.0), 1.0)
        metrics = {key: value / n for key, value in sums.items() if not key.startswith("_")}
        metrics.update(lr=lr, grad_norm=sums["_grad_norm"] / k, skipped_updates=sums.get("_skipped_updates", 0.0),
                       train_tokens=float(tokens), time_train_s=time.perf_counter() - start,
                       advantage_abs_mean=_sample_mean_abs(trajs, adv))
        metrics["train_tokens_per_s"] = tokens / max(metrics["time_train_s"], 1e-9)
        if capture:
            metrics["trainer_logprobs"] = {capture[i]: values for i, values in self._captured.items()}
        if refused:
            metrics["refused_episodes"] = refused
        return metrics

    def _advantages(self, groups: list[Group], episodes: list[Trajectory]) -> list[list[float]]:
        """One advantage per token of every sample of the batch (roll_agent/train/algorithms.py:
        per turn, by `algorithm.advantage`; a turn's value on its sampled tokens)."""
        algo = self.algo
        turns = [episode_turns(t) for t in episodes]
        per_turn = alg.turn_advantages(
            torch.tensor([t.reward for t in episodes], dtype=torch.float32),
            torch.tensor([g.group_id for g in groups for _ in g.trajectories]),
            [[turn.reward for turn in ts] for ts in turns], [[turn.state_key for turn in ts] for ts in turns],
            algo.advantage, std_normalize=algo.std_normalize, gamma=algo.gamma, step_weight=algo.step_weight)
        return [row for t, ts, values in zip(episodes, turns, per_turn)
                for row in token_advantages(t, ts, values.tolist())]

    def _refuse_out_of_vocab(self, groups: list[Group], capture: Collection[int]):
        """`groups` without the episodes holding a token id the model has no embedding for (the
        agent endpoint refuses such ids at the door; this is the defence behind it: one such
        sample would fail the whole step), `capture` as {index among the kept samples: index in
        the batch}, and one line per refused episode saying why."""
        vocab = self.model.get_input_embeddings().num_embeddings
        wanted, mapping, refused, kept_groups = set(capture), {}, [], []
        old = new = 0  # sample indices in the batch and among the kept
        for group in groups:
            kept = []
            for traj in group.trajectories:
                n = len(traj.samples())
                bad = next((i for s in traj.samples() for i in s.token_ids if not 0 <= i < vocab), None)
                if bad is None:
                    mapping.update({new + k: old + k for k in range(n) if old + k in wanted})
                    kept.append(traj)
                    new += n
                else:
                    refused.append(f"group {traj.group_id} env {traj.env_id} (seed {traj.seed}): token id {bad} "
                                   f"is outside the model's vocabulary [0, {vocab})")
                old += n
            if kept:
                kept_groups.append(dataclasses.replace(group, trajectories=kept))
        return (kept_groups, mapping, refused) if refused else (groups, {j: j for j in capture}, [])

    @torch.no_grad()
    def _proximal_logps(self, trajs: list[Trajectory]) -> list[torch.Tensor]:
        """pi_old for decoupled PPO: the policy before this batch's first update."""
        out = []
        for idx in self._micro_batches(list(range(len(trajs)))):
            batch = self.batch([trajs[i] for i in idx])
            logp, _ = self.logprobs(batch)
            out += [(batch.start, row) for row in logp]
        return out

    def _update(self, trajs, mini: list[int], adv, old, sums: dict[str, float]) -> None:
        algo = self.algo
        total_tokens = sum(trajs[i].num_generated_tokens for i in mini)
        total_seqs = sum(1 for i in mini if trajs[i].num_generated_tokens > 0)
        # Every policy-loss term is scaled by the advantage: a sample whose advantage is 0 (its
        # group's rewards all equal) adds nothing to the gradient unless a KL or entropy term is on.
        # Such samples get a forward pass for the metrics only (no backward), the others are
        # trained in micro-batches of their own; the loss is normalised over the whole
        # mini-batch either way, so the update is the same. With no signal at all no optimizer
        # step is taken (one on zero gradients would still drift the weights through Adam's momentum).
        every_sample = algo.kl_coef > 0 or algo.entropy_coef != 0
        has_signal = [every_sample or any(a != 0.0 for a, m in zip(adv[i], trajs[i].loss_mask) if m) for i in mini]
        trained = [i for i, yes in zip(mini, has_signal) if yes]
        signal = bool(trained)
        self._zero_grad()
        for grad, rows in ((True, trained), (False, [i for i, yes in zip(mini, has_signal) if not yes])):
            for idx in self._micro_batches(rows):
                batch = self.batch([trajs[i] for i in idx], [adv[i] for i in idx])
                with torch.set_grad_enabled(grad):
                    loss = self._micro_loss(trajs, idx, batch, old, total_tokens, total_seqs, sums)
                if grad:
                    self._backward(loss)
        norm = self._apply_gradients() if signal else 0.0
        _add(sums, "_grad_norm", norm)
        if norm <= 0:
            _add(sums, "_skipped_updates", 1.0)

    def _micro_loss(self, trajs, idx, batch, old, total_tokens: int, total_seqs: int,
                    sums: dict[str, float]) -> torch.Tensor:
        algo = self.algo
        logp, entropy = self.logprobs(batch, with_entropy=True)
        mask = batch.loss_mask
        logp_old = logp.detach() if old is None else _stack_rows([old[i] for i in idx], batch.start, logp.shape[1])
        for row, i in enumerate(idx):
            if self._captured.get(i) == []:
                self._captured[i] = _per_token(logp_old[row], batch.start, trajs[i].loss_mask)
        advantages = batch.advantages
        rewards = torch.tensor([trajs[i].reward for i in idx], device=logp.device, dtype=logp.dtype)
        loss_tok, diag = alg.policy_loss(
            logp, logp_old, batch.behaviour_logprobs, advantages, mask, algo.loss,
            clip_low=algo.clip_low, clip_high=algo.clip_high, is_cap=algo.is_cap, rewards=rewards)
        total = loss_tok - algo.entropy_coef * entropy * mask
        kl = None
        if algo.kl_coef > 0:
            kl = alg.kl_k3(logp, self.reference_logprobs(batch)) * mask
            total = total + algo.kl_coef * kl
        share = (mask.sum() / max(total_tokens, 1)) if algo.aggregation == "token-mean" else \
            (float((mask.sum(-1) > 0).sum()) / max(total_seqs, 1))
        with torch.no_grad():
            _add(sums, "loss", float((loss_tok * mask).sum()))
            _add(sums, "entropy", float((entropy * mask).sum()))
            _add(sums, "is_weight_mean", float((diag["is_weight"] * mask).sum()))
            # |log pi_trainer - log mu_sampler| per trained token: ~1e-6 for on-policy samples when
            # the engines' weights equal the trainer's; grows with staleness or a sync that missed
            gap = torch.where(mask > 0, (logp.detach() - batch.behaviour_logprobs).abs(), 0.0)
            _add(sums, "logprob_diff_mean", float(gap.sum()))
            _add(sums, "clip_frac", float((diag["clipped"] * mask).sum()))
            if kl is not None:
                _add(sums, "kl", float(kl.sum()))
            _add(sums, "_mask_tokens", float(mask.sum()))
        return alg.aggregate(total, mask, algo.aggregation) * share

    @torch.no_grad()
    def reference_logprobs(self, batch: TokenBatch) -> torch.Tensor:
        """Log-probs of the targets under the KL reference."""
        if self.ref_model is not None:
            return self.logprobs(batch, self.ref_model)[0]
        with self.model.disable_adapter():  # LoRA: the reference is the frozen base
            return self.logprobs(batch)[0]

    # ---- supervised warm-start ---------------------------------------------
    def sft_step(self, trajs: list[Trajectory], lr: float) -> dict[str, float]:
        """One optimizer step of next-token NLL on the loss-masked (demonstrated) tokens."""
        for group in self._param_groups():
            group["lr"] = lr
        total = max(sum(t.num_generated_tokens for t in trajs), 1)
        self._zero_grad()
        nll_sum = 0.0
        for idx in self._micro_batches(list(range(len(trajs)))):
            batch = self.batch([trajs[i] for i in idx])
            logp, _ = self.logprobs(batch)
            nll = -(logp * batch.loss_mask).sum()
            self._backward(nll / total)
            nll_sum += nll.item()
        self._apply_gradients()  # (the next RL step sets its own lr)
        return {"sft_nll": nll_sum / total}

    def reset_reference(self) -> None:
        """The KL reference becomes the current policy: called when the supervised warm-start
        ends, so the KL term anchors RL to the model it starts from, not to the untrained one.
        Checkpoints then carry the reference (a resumed run has no warm-start to take it from).
        (Under LoRA the reference stays the adapter-disabled base.)"""
        if self.ref_model is None:
            return
        ref = dict(self.ref_model.named_parameters())
        with torch.no_grad():
            for name, tensor in self.named_weights():
                ref[name].copy_(tensor.to(ref[name].device, ref[name].dtype))
        self._reference_moved = True

    # ---- weights and checkpoints -------------------------------------------
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """What the engines need: every parameter, or only the adapters under LoRA."""
        for name, p in self._synced():
            yield name, p.detach()

    def _synced(self) -> list[tuple[str, torch.nn.Parameter]]:
        """`sync_parameters` of the model, listed once: the parameters are updated in place, and
        walking a peft model's module tree for their names costs more than copying the adapters."""
        if self._synced_params is None:
            self._synced_params = list(sync_parameters(self.model, self.model_cfg))
        return self._synced_params

    def _trainer_state(self) -> dict:
        return {
            "version": self.version,
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state(),
                    "trainer": self._rng.getstate()},
            # only a reference the warm-start moved: otherwise it is model.path's, rebuilt at start
            "reference": self.ref_model.state_dict() if self._reference_moved else None,
        }

    def _restore_trainer_state(self, state: dict) -> None:
        self.version = state["version"]
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        np.random.set_state(state["rng"]["numpy"])
        self._rng.setstate(state["rng"]["trainer"])
        if state.get("reference") is not None and self.ref_model is not None:
            self.ref_model.load_state_dict(state["reference"])
            self._reference_moved = True


def _stack_rows(rows: list[tuple[int, torch.Tensor]], start: int, width: int) -> torch.Tensor:
    """Per-token rows computed in other micro-batches (each `(its start, values)`), aligned to
    columns `start .. start + width` of this one."""
    out = torch.zeros((len(rows), width), device=rows[0][1].device)
    for i, (row_start, row) in enumerate(rows):
        # column j here is token position start + j, which is index j + lo of the row. lo < 0 when
        # this micro-batch starts earlier than the row's own did (a shorter prompt beside it):
        # the columns before the row's start are before its first trained token and stay 0.
        lo = start - row_start
        j0, j1 = max(0, -lo), min(width, row.shape[0] - lo)
        if j1 > j0:
            out[i, j0:j1] = row[j0 + lo:j1 + lo]
    return out


def _per_token(targets: torch.Tensor, start: int, loss_mask: list[int]) -> list[float]:
    """A row of target log-probs (target j is token start + 1 + j) as one value per token of the
    sample, 0 where the token is not trained."""
    n = len(loss_mask)
    full = torch.zeros(n)
    full[start + 1:] = targets[:n - 1 - start].detach().float().cpu()
    return (full * torch.tensor(loss_mask, dtype=torch.float32)).tolist()


def _sample_mean_abs(trajs: list[Trajectory], adv: list[list[float]]) -> float:
    """Mean over samples of the mean |advantage| of each sample's trained tokens."""
    per_sample = []
    for t, row in zip(trajs, adv):
        trained = [abs(a) for a, m in zip(row, t.loss_mask) if m]
        per_sample.append(sum(trained) / len(trained) if trained else 0.0)
    return sum(per_sample) / len(per_sample) if per_sample else 0.0


def _add(sums: dict[str, float], key: str, value: float) -> None:
    sums[key] = sums.get(key, 0.0) + value
