"""The transformers engine: batches concurrent requests, decodes with a KV cache off
the event loop, and returns the log-prob of every sampled token.

Continuous batching: each iteration of the serving loop advances the running batch by
one token; requests that arrived meanwhile are prefilled together and folded into the
running KV cache (left-padded to one length), finished rows are dropped, so a request
never waits for others' batch to end and returns as soon as it stops. (Caches other than
plain full-attention ones, e.g. sliding-window layers, run as separate batches.) Abort is
checked every token, so a suspend for a weight update returns partial outputs within
one decode step. A prompt that starts with tokens the engine already computed (the
episode's earlier turns, shared instructions) reuses their KV (`prefix_cache.py`).
Each step's new tokens go to their request's `on_tokens` on the event loop; top-k
alternatives (`sampling.top_logprobs`) come from the same log-softmax of logits / temperature
as the sampled tokens' log-probs.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Iterable

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicCache, DynamicLayer

from roll_agent.config import EngineConfig, ModelConfig
from roll_agent.modeling import load_policy, logits_to_keep_kwargs, sync_parameters
from roll_agent.proxy.engines.prefix_cache import KV, PrefixCache
from roll_agent.types import EngineOutput, SamplingParams, TokenSink


@dataclass
class _Pending:
    prompt_ids: list[int]
    sampling: SamplingParams
    request_id: str
    future: asyncio.Future
    on_tokens: TokenSink | None = None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)  # per token, when sampling.top_logprobs
    reported: int = 0  # tokens given to on_tokens so far
    finish: str = ""
    cached: tuple[int, KV] | None = None  # a remembered prefix of the prompt: its length and KV

    def report(self) -> None:
        """Give on_tokens the tokens sampled since the last report."""
        if self.on_tokens is not None and len(self.tokens) > self.reported:
            n, self.reported = self.reported, len(self.tokens)
            self.on_tokens(self.tokens[n:], self.logprobs[n:], self.top[n:] if self.sampling.top_logprobs else None)


@dataclass
class _Batch:
    """Requests decoded together: one left-padded KV cache, one forward per step."""

    items: list[_Pending]
    state: dict = field(default_factory=dict)  # cache, mask, pos, logits, sampling tensors



class HFEngine:
    alive = True
    restartable = False  # a crash takes it out of routing for good

    def __init__(self, model_path: str, cfg: EngineConfig, model_cfg: ModelConfig, seed: int = 0):
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.model = load_policy(model_path, model_cfg, cfg.device).eval()
        self.pad_id = self.model.config.pad_token_id or 0
        self.version = 0
        self._params = dict(sync_parameters(self.model, model_cfg))
        self._generator = torch.Generator(device=self.device).manual_seed(seed)
        self._queue: list[_Pending] = []
        self._running: list[_Batch] = []
        self._aborted: set[str] = set()
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._worker: asyncio.Task | None = None
        self._lock = threading.Lock()  # weights vs decode
        self._plain = _plain_cache(self.model.config)  # rows of its KV can be copied, stacked, reused
        tokens = cfg.prefix_cache_tokens
        if tokens is None:  # as much KV as kv_cache_space_gib holds (0 means vLLM's own sizing: 1 GiB here)
            tokens = self._tokens_in(cfg.kv_cache_space_gib or 1.0)
        self.prefix_cache = PrefixCache(tokens) if tokens and self._plain else None

    @torch.inference_mode()
    def _tokens_in(self, gib: float) -> int:
        """How many tokens of this model's KV fit in `gib` GiB (measured on one token's cache)."""
        if not self._plain:
            return 0
        out = self.model(input_ids=torch.tensor([[self.pad_id]], device=self.device), use_cache=True)
        per_token = sum(layer.keys.nbytes + layer.values.nbytes for layer in out.past_key_values.layers)
        return int(gib * 2**30 // per_token)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, request_id: str,
                       on_tokens: TokenSink | None = None) -> EngineOutput:
        self._ensure_worker()
        item = _Pending(list(prompt_ids), sampling, request_id, asyncio.get_running_loop().create_future(), on_tokens)
        self._queue.append(item)
        self._idle.clear()
        self._wakeup.set()
        try:
            return await item.future
        except asyncio.CancelledError:
            self._aborted.add(request_id)
            raise

    def _ensure_worker(self) -> None:
        """Start the serving loop on the running event loop (again, if an earlier loop ended)."""
        loop = asyncio.get_running_loop()
        if self._worker is not None and not self._worker.done() and self._worker.get_loop() is loop:
            return
        self._wakeup, self._idle = asyncio.Event(), asyncio.Event()
        self._idle.set()
        self._running = []
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
            top = item.top if item.sampling.top_logprobs else None
            item.future.set_result(EngineOutput(item.tokens, item.logprobs, reason, top))

    def _admit(self) -> None:
        """Start a new batch from the queue, within max_batch_size rows in flight."""
        in_flight = sum(1 for b in self._running for item in b.items if not item.finish)
        room = self.cfg.max_batch_size - in_flight
        if self._queue and room > 0:
            batch, self._queue = self._queue[:room], self._queue[room:]
            if self.prefix_cache is not None:
                for item in batch:
                    n, kv = self.prefix_cache.longest(item.prompt_ids)
                    item.cached = (n, kv) if n else None
            self._running.append(_Batch(batch))

    async def _serve(self) -> None:
        while True:
            self._admit()
            if not self._running:
                self._idle.set()
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            try:
                finished, self._running = await asyncio.to_thread(self._step_all, self._running)
            except Exception as exc:  # an engine failure fails its requests, not the engine
                for batch in self._running:
                    for item in batch.items:
                        if not item.future.done():
                            item.future.set_exception(exc)
                self._running = []
                continue
            for item in finished + [item for batch in self._running for item in batch.items]:
                item.report()
            for item in finished:
                self._finish(item, item.finish)

    @torch.inference_mode()
    def _step_all(self, batches: list[_Batch]) -> tuple[list[_Pending], list[_Batch]]:
        """Advance every batch by one token; drop finished rows; fold new batches into the first."""
        with self._lock:
            for batch in batches:
                self._step(batch)
            finished = [item for b in batches for item in b.items if item.finish]
            running: list[_Batch] = []
            for batch in batches:
                self._remember(batch)
                _prune(batch)
                if not batch.items:
                    continue
                if running and _mergeable(running[0], batch):
                    _merge(running[0], batch)
                else:
                    running.append(batch)
        return finished, running

    def _step(self, batch: _Batch) -> None:
        """One forward (the prefill for a new batch), then sample one token per live request."""
        st = batch.state
        if not st:
            self._prefill(batch)
        else:
            st["mask"] = torch.cat([st["mask"], torch.ones_like(st["mask"][:, :1])], dim=1)
            st["pos"] = st["pos"] + 1
            out = self.model(input_ids=st["tokens"][:, None], attention_mask=st["mask"], position_ids=st["pos"],
                             past_key_values=st["cache"], use_cache=True)
            st["cache"], st["logits"] = out.past_key_values, out.logits[:, -1].float()
        k = max(item.sampling.top_logprobs for item in batch.items)
        tokens, logprobs, top = self._sample(st["logits"], st["temps"], st["greedy"], st["top_p"], k)
        st["tokens"] = tokens
        for i, (item, tok, logprob) in enumerate(zip(batch.items, tokens.tolist(), logprobs.tolist())):
            if item.finish:
                continue
            if item.request_id in self._aborted:
                item.finish = "abort"
                continue
            item.tokens.append(tok)
            item.logprobs.append(logprob)
            if item.sampling.top_logprobs:
                item.top.append(top[i][:item.sampling.top_logprobs])
            if tok in item.sampling.stop_token_ids:
                item.finish = "stop"
            elif len(item.tokens) >= item.sampling.max_new_tokens:
                item.finish = "length"

    def _prefill(self, batch: _Batch) -> None:
        """One forward over the new requests' distinct prompts, batched: row i's remembered prefix
        (n_i tokens of KV, possibly none) is left-padded to the longest one, its remaining tokens
        (s_i) to the longest rest; the attention mask hides both pads, positions are per row.
        Requests with the same prompt (a GRPO group's envs start one task together) share its
        row: computed once, then copied to each of them before sampling."""
        dev, every = self.device, batch.items
        items, rows, row_of = [], [], {}  # the distinct prompts; each request's row among them
        for item in every:
            key = tuple(item.prompt_ids) if self._plain else id(item)
            if key not in row_of:
                row_of[key] = len(items)
                items.append(item)
            rows.append(row_of[key])
        cached = [item.cached or (0, []) for item in items]
        for item in every:
            item.cached = None
        known = max(n for n, _ in cached)
        rests = [item.prompt_ids[n:] for item, (n, _) in zip(items, cached)]
        width = max(len(r) for r in rests)
        ids = torch.full((len(items), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(items), known + width), dtype=torch.long)
        pos = torch.zeros((len(items), width), dtype=torch.long)
        for i, ((n, _), rest) in enumerate(zip(cached, rests)):
            ids[i, width - len(rest):] = torch.tensor(rest)
            mask[i, known - n:known] = 1
            mask[i, known + width - len(rest):] = 1
            pos[i, width - len(rest):] = torch.arange(n, n + len(rest))
        ids, mask, pos = ids.to(dev), mask.to(dev), pos.to(dev)
        kwargs = {"past_key_values": self._stacked_prefixes(cached, known)} if known else {}
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                         **kwargs, **logits_to_keep_kwargs(self.model, 1))  # only the last position samples
        cache, logits, pos = out.past_key_values, out.logits[:, -1].float(), pos[:, -1:]
        if len(items) < len(every):
            idx = torch.tensor(rows, device=dev)
            for layer in cache.layers:
                layer.keys, layer.values = layer.keys.index_select(0, idx), layer.values.index_select(0, idx)
            logits, mask, pos = logits.index_select(0, idx), mask.index_select(0, idx), pos.index_select(0, idx)
        batch.state.update(
            cache=cache, logits=logits, mask=mask, pos=pos,
            temps=torch.tensor([max(b.sampling.temperature, 1e-5) for b in every], device=dev)[:, None],
            greedy=torch.tensor([b.sampling.greedy for b in every], device=dev),
            top_p=torch.tensor([b.sampling.top_p for b in every], device=dev)[:, None])

    def _stacked_prefixes(self, cached: list[tuple[int, KV]], known: int) -> DynamicCache:
        """The rows' remembered KV, each left-padded (zeros, masked) to `known` positions."""
        some = next(kv for n, kv in cached if n)
        cache = DynamicCache(config=self.model.config)
        for layer, (k0, v0) in enumerate(some):
            keys = k0.new_zeros((len(cached), k0.shape[1], known, k0.shape[3]))
            values = v0.new_zeros((len(cached), v0.shape[1], known, v0.shape[3]))
            for i, (n, kv) in enumerate(cached):
                if n:
                    keys[i, :, known - n:] = kv[layer][0][0]
                    values[i, :, known - n:] = kv[layer][1][0]
            cache.update(keys.to(self.device), values.to(self.device), layer)
        return cache

    def _sample(self, logits, temps, greedy, top_p, k: int = 0):
        """Per row: a token, its log-prob under softmax(logits / temperature) and, for k > 0, the k
        likeliest tokens' (ids, log-probs) under the same distribution."""
        scaled = torch.log_softmax(logits / temps, dim=-1)
        probs = scaled.exp()
        if bool((top_p < 1.0).any()):
            sorted_p, order = probs.sort(dim=-1, descending=True)
            drop = sorted_p.cumsum(-1) - sorted_p > top_p
            sorted_p = sorted_p.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        sampled = torch.multinomial(probs, 1, generator=self._generator).squeeze(-1)
        tokens = torch.where(greedy, logits.argmax(-1), sampled)
        top = None
        if k:
            values, ids = scaled.topk(k, dim=-1)
            top = [list(zip(row_ids, row_values)) for row_ids, row_values in zip(ids.tolist(), values.tolist())]
        return tokens, scaled.gather(-1, tokens[:, None]).squeeze(-1), top

    def _remember(self, batch: _Batch) -> None:
        """Keep the KV of requests that just finished (prompt + answer; the last sampled token was
        never fed) for a later prompt that starts with them."""
        if self.prefix_cache is None:
            return
        st = batch.state
        for i, item in enumerate(batch.items):
            if item.finish in ("stop", "length"):
                tokens = item.prompt_ids + item.tokens[:-1]
                where = st["mask"][i].nonzero().squeeze(-1)  # the row's tokens, in order, between pads
                if len(where) != len(tokens):
                    continue
                self.prefix_cache.insert(tokens, [(layer.keys[i:i + 1, :, where], layer.values[i:i + 1, :, where])
                                                  for layer in st["cache"].layers])

    async def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        await self.wait_idle()
        if self.prefix_cache is not None:
            self.prefix_cache.clear()  # KV of the old weights must not mix into new samples
        with self._lock, torch.no_grad():
            for name, tensor in named_tensors:
                param = self._params.get(name)
                if param is None:
                    raise KeyError(f"Engine has no parameter '{name}': trainer and engine models differ")
                param.copy_(tensor.to(param.device, param.dtype))
        self.version = version

    async def close(self) -> None:
        for item in self._queue + [i for b in self._running for i in b.items]:
            self._finish(item, "abort")
        self._queue.clear()
        self._running = []
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except (asyncio.CancelledError, Exception):
                pass
            self._worker = None


# Row-wise state of a batch: indexed by _prune, concatenated by _merge.
_ROWS = ("mask", "pos", "tokens", "temps", "greedy", "top_p")


def _prune(batch: _Batch) -> None:
    """Drop finished rows (and KV columns that only padded them): later steps compute live rows only."""
    keep = [i for i, item in enumerate(batch.items) if not item.finish]
    if len(keep) == len(batch.items) or not keep:
        batch.items = [batch.items[i] for i in keep]
        return
    st, idx = batch.state, torch.tensor(keep, device=batch.state["mask"].device)
    batch.items = [batch.items[i] for i in keep]
    for key in _ROWS:
        st[key] = st[key].index_select(0, idx)
    layers = st["cache"].layers
    for layer in layers:
        layer.batch_select_indices(idx)
    lead = int((st["mask"].cumsum(1) == 0).sum(1).min())  # left padding no remaining row needs
    if lead and all(type(layer) is DynamicLayer for layer in layers):
        st["mask"] = st["mask"][:, lead:]
        for layer in layers:
            layer.keys, layer.values = layer.keys[:, :, lead:], layer.values[:, :, lead:]


def _plain_cache(config) -> bool:
    """Whether the model's KV cache is plain full attention (remembered rows can be reused)."""
    return all(type(layer) is DynamicLayer for layer in DynamicCache(config=config).layers)


def _mergeable(a: _Batch, b: _Batch) -> bool:
    """Plain (full-attention) KV caches can be left-padded to one length and stacked."""
    return all(type(layer) is DynamicLayer for layer in (*a.state["cache"].layers, *b.state["cache"].layers))


def _merge(a: _Batch, b: _Batch) -> None:
    """Fold batch b into a: one forward per step for both (continuous batching)."""
    sa, sb = a.state, b.state
    width = max(sa["mask"].shape[1], sb["mask"].shape[1])

    def left_pad(t: torch.Tensor, dim_from_end: int) -> torch.Tensor:
        missing = width - t.shape[-dim_from_end]
        return F.pad(t, (0, 0) * (dim_from_end - 1) + (missing, 0)) if missing else t

    for la, lb in zip(sa["cache"].layers, sb["cache"].layers):
        la.keys = torch.cat([left_pad(la.keys, 2), left_pad(lb.keys, 2)])
        la.values = torch.cat([left_pad(la.values, 2), left_pad(lb.values, 2)])
    sa["mask"] = torch.cat([left_pad(sa["mask"], 1), left_pad(sb["mask"], 1)])
    for key in _ROWS[1:]:
        sa[key] = torch.cat([sa[key], sb[key]])
    a.items = a.items + b.items
