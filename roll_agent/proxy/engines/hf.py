"""The transformers engine: batches concurrent requests, decodes with a KV cache off
the event loop, and returns the log-prob of every sampled token.

Requests that arrive while a batch decodes wait for the next batch. Abort is checked
between tokens, so a suspend for a weight update returns partial outputs within one
decode step.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Iterable

import torch

from roll_agent.config import EngineConfig, ModelConfig
from roll_agent.modeling import load_policy, sync_parameters
from roll_agent.types import EngineOutput, SamplingParams


@dataclass
class _Pending:
    prompt_ids: list[int]
    sampling: SamplingParams
    request_id: str
    future: asyncio.Future
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str = ""


class HFEngine:
    def __init__(self, model_path: str, cfg: EngineConfig, model_cfg: ModelConfig, seed: int = 0):
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.model = load_policy(model_path, model_cfg, cfg.device).eval()
        self.pad_id = self.model.config.pad_token_id or 0
        self.version = 0
        self._params = dict(sync_parameters(self.model, model_cfg))
        self._generator = torch.Generator(device=self.device).manual_seed(seed)
        self._queue: list[_Pending] = []
        self._aborted: set[str] = set()
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._worker: asyncio.Task | None = None
        self._lock = threading.Lock()  # weights vs decode

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, request_id: str) -> EngineOutput:
        self._ensure_worker()
        item = _Pending(list(prompt_ids), sampling, request_id, asyncio.get_running_loop().create_future())
        self._queue.append(item)
        self._idle.clear()
        self._wakeup.set()
        try:
            return await item.future
        except asyncio.CancelledError:
            self._aborted.add(request_id)
            raise

    def _ensure_worker(self) -> None:
        """Start the batching loop on the running event loop (again, if an earlier loop ended)."""
        loop = asyncio.get_running_loop()
        if self._worker is not None and not self._worker.done() and self._worker.get_loop() is loop:
            return
        self._wakeup, self._idle = asyncio.Event(), asyncio.Event()
        self._idle.set()
        self._worker = loop.create_task(self._serve())

    async def abort(self, request_id: str) -> None:
        self._aborted.add(request_id)
        for item in list(self._queue):
            if item.request_id == request_id:
                self._queue.remove(item)
                self._finish(item, "abort")

    async def wait_idle(self) -> None:
        await self._idle.wait()

    def _finish(self, item: _Pending, reason: str) -> None:
        self._aborted.discard(item.request_id)
        if not item.future.done():
            item.future.set_result(EngineOutput(item.tokens, item.logprobs, reason))

    async def _serve(self) -> None:
        while True:
            if not self._queue:
                self._idle.set()
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            batch, self._queue = self._queue[: self.cfg.max_batch_size], self._queue[self.cfg.max_batch_size:]
            try:
                await asyncio.to_thread(self._decode, batch)
                for item in batch:
                    self._finish(item, item.finish or "abort")
            except Exception as exc:  # an engine failure fails its requests, not the engine
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(exc)

    @torch.inference_mode()
    def _decode(self, batch: list[_Pending]) -> None:
        with self._lock:
            self._decode_locked(batch)

    def _decode_locked(self, batch: list[_Pending]) -> None:
        dev = self.device
        lengths = [len(b.prompt_ids) for b in batch]
        width = max(lengths)
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, item in enumerate(batch):
            ids[i, width - lengths[i]:] = torch.tensor(item.prompt_ids)
            mask[i, width - lengths[i]:] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        temps = torch.tensor([max(b.sampling.temperature, 1e-5) for b in batch], device=dev)[:, None]
        greedy = torch.tensor([b.sampling.greedy for b in batch], device=dev)
        top_p = torch.tensor([b.sampling.top_p for b in batch], device=dev)[:, None]
        budget = max(b.sampling.max_new_tokens for b in batch)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
        cache, logits = out.past_key_values, out.logits[:, -1].float()
        active = [True] * len(batch)
        for _ in range(budget):
            tokens, logprobs = self._sample(logits, temps, greedy, top_p)
            for i, item in enumerate(batch):
                if not active[i]:
                    continue
                if item.request_id in self._aborted:
                    active[i], item.finish = False, "abort"
                    continue
                tok = int(tokens[i])
                item.tokens.append(tok)
                item.logprobs.append(float(logprobs[i]))
                if tok in item.sampling.stop_token_ids:
                    active[i], item.finish = False, "stop"
                elif len(item.tokens) >= item.sampling.max_new_tokens:
                    active[i], item.finish = False, "length"
            if not any(active):
                break
            mask = torch.cat([mask, torch.ones((len(batch), 1), dtype=mask.dtype, device=dev)], dim=1)
            pos = pos[:, -1:] + 1
            out = self.model(input_ids=tokens[:, None], attention_mask=mask, position_ids=pos,
                             past_key_values=cache, use_cache=True)
            cache, logits = out.past_key_values, out.logits[:, -1].float()

    def _sample(self, logits, temps, greedy, top_p):
        scaled = torch.log_softmax(logits / temps, dim=-1)
        probs = scaled.exp()
        if bool((top_p < 1.0).any()):
            sorted_p, order = probs.sort(dim=-1, descending=True)
            drop = sorted_p.cumsum(-1) - sorted_p > top_p
            sorted_p = sorted_p.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        sampled = torch.multinomial(probs, 1, generator=self._generator).squeeze(-1)
        tokens = torch.where(greedy, logits.argmax(-1), sampled)
        return tokens, scaled.gather(-1, tokens[:, None]).squeeze(-1)

    async def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        await self.wait_idle()
        with self._lock, torch.no_grad():
            for name, tensor in named_tensors:
                param = self._params.get(name)
                if param is None:
                    raise KeyError(f"Engine has no parameter '{name}': trainer and engine models differ")
                param.copy_(tensor.to(param.device, param.dtype))
        self.version = version

    async def close(self) -> None:
        for item in self._queue:
            self._finish(item, "abort")
        self._queue.clear()
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except (asyncio.CancelledError, Exception):
                pass
            self._worker = None
