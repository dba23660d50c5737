"""Prefix KV cache of the `hf` engine (what vLLM calls automatic prefix caching).

A multi-turn episode sends its whole history again every turn: prompt, the model's last
answer, the new observation. Re-computing the KV of that history is most of the engine's
prefill work. The engine remembers the KV of every request it finished (prompt + answer,
one row per layer) and a new request whose prompt starts with a remembered sequence only
computes the rest: the next turn of an episode reuses its history, a new episode the
shared instructions (the longest common prefix counts, not only whole entries).

Entries are LRU-evicted past `max_tokens`; an entry that a newer one extends is dropped
(an episode's chain of turns keeps one entry). The cache is cleared when the engine
loads new weights: KV computed by the old weights would mix two policies into one
sample's log-probs.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [1, kv_heads, n, head_dim]


@dataclass
class _Entry:
    tokens: np.ndarray
    kv: KV


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    m = min(len(a), len(b))
    same = a[:m] == b[:m]
    return m if same.all() else int(same.argmin())


class PrefixCache:
    def __init__(self, max_tokens: int, min_tokens: int = 64):
        self.max_tokens = max_tokens
        # a shorter match saves less than its bookkeeping costs (measured: short shared instructions
        # of a single-turn task, ~30 tokens, made the engine slower)
        self.min_tokens = min_tokens
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._size = 0
        self._next_key = 0
        self.stats = {"lookups": 0, "hits": 0, "hit_tokens": 0, "prompt_tokens": 0}

    def __len__(self) -> int:
        return len(self._entries)

    def longest(self, prompt: list[int]) -> tuple[int, KV]:
        """The longest remembered prefix of `prompt` (never all of it: the last prompt token is
        always computed, its logits sample the first new token) and its KV; (0, []) if none."""
        self.stats["lookups"] += 1
        self.stats["prompt_tokens"] += len(prompt)
        want = np.asarray(prompt[:-1], dtype=np.int64)
        best, best_key = 0, None
        for key, entry in self._entries.items():
            n = common_prefix(entry.tokens, want)
            if n > best:
                best, best_key = n, key
        if best < self.min_tokens:
            return 0, []
        self._entries.move_to_end(best_key)
        self.stats["hits"] += 1
        self.stats["hit_tokens"] += best
        return best, [(k[:, :, :best], v[:, :, :best]) for k, v in self._entries[best_key].kv]

    def insert(self, tokens: list[int], kv: KV) -> None:
        if len(tokens) < self.min_tokens or len(tokens) > self.max_tokens:
            return
        new = np.asarray(tokens, dtype=np.int64)
        for key in [k for k, e in self._entries.items() if len(e.tokens) <= len(new)
                    and common_prefix(e.tokens, new) == len(e.tokens)]:
            self._drop(key)  # the new entry covers it
        self._entries[self._next_key] = _Entry(new, kv)
        self._next_key += 1
        self._size += len(new)
        while self._size > self.max_tokens:
            self._drop(next(iter(self._entries)))

    def clear(self) -> None:
        self._entries.clear()
        self._size = 0

    def _drop(self, key: int) -> None:
        self._size -= len(self._entries.pop(key).tokens)
