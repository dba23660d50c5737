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

Finding the entry: each entry is indexed by the chained hashes of its whole blocks of
`BLOCK` tokens (hash of block 0, of blocks 0-1, ...), as vLLM's prefix cache keys its KV
blocks. A lookup walks the prompt's chain to the deepest block some entry shares and
compares tokens only with the entries there: one for the next turn of an episode, instead
of every entry (a scan of all of them cost ~1 ms a request with 256 episodes in flight).
The match is still the exact longest common prefix: an entry sharing more tokens would
share a deeper block. A hash collision cannot give wrong KV: the tokens are compared.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [1, kv_heads, n, head_dim]


BLOCK = 16  # tokens per indexed block


@dataclass
class _Entry:
    tokens: np.ndarray
    kv: KV
    chain: list[int]  # chained hashes of its whole blocks

    @property
    def end(self) -> int:
        """The hash of its last whole block (0: it has none)."""
        return self.chain[-1] if self.chain else 0


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    m = min(len(a), len(b))
    same = a[:m] == b[:m]
    return m if same.all() else int(same.argmin())


def block_chain(tokens: np.ndarray, block: int) -> list[int]:
    """[hash(block 0), hash(blocks 0-1), ...] over the whole blocks of `tokens`."""
    ids, chain, h = tokens.tolist(), [], 0
    for i in range(0, len(ids) - block + 1, block):
        h = hash((h, *ids[i:i + block]))
        chain.append(h)
    return chain


class PrefixCache:
    def __init__(self, max_tokens: int, min_tokens: int = 64):
        self.max_tokens = max_tokens
        # a shorter match saves less than its bookkeeping costs (measured: short shared instructions
        # of a single-turn task, ~30 tokens, made the engine slower)
        self.min_tokens = min_tokens
        self.block = max(1, min(BLOCK, min_tokens))  # a match worth using spans a whole block
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._by_block: dict[int, dict[int, None]] = {}  # chained block hash: the entries sharing it
        self._by_end: dict[int, dict[int, None]] = {}  # an entry's last block hash: the entries ending there
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
        sharing: dict[int, None] = {}
        for h in block_chain(want, self.block):  # down to the deepest block an entry shares
            keys = self._by_block.get(h)
            if not keys:
                break
            sharing = keys
        best, best_key = 0, None
        for key in sharing:
            n = common_prefix(self._entries[key].tokens, want)
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
        chain = block_chain(new, self.block)
        # the entries the new one covers end at one of its blocks (or have none)
        ending = dict.fromkeys(k for h in [0, *chain] for k in self._by_end.get(h, ()))
        for key in [k for k in ending if len(self._entries[k].tokens) <= len(new)
                    and common_prefix(self._entries[k].tokens, new) == len(self._entries[k].tokens)]:
            self._drop(key)
        entry = _Entry(new, kv, chain)
        key = self._next_key
        self._next_key += 1
        self._entries[key] = entry
        for h in chain:
            self._by_block.setdefault(h, {})[key] = None
        self._by_end.setdefault(entry.end, {})[key] = None
        self._size += len(new)
        while self._size > self.max_tokens:
            self._drop(next(iter(self._entries)))

    def clear(self) -> None:
        self._entries.clear()
        self._by_block.clear()
        self._by_end.clear()
        self._size = 0

    def _drop(self, key: int) -> None:
        entry = self._entries.pop(key)
        self._size -= len(entry.tokens)
        for table, hashes in ((self._by_block, entry.chain), (self._by_end, [entry.end])):
            for h in hashes:
                keys = table.get(h)
                if keys is not None:
                    keys.pop(key, None)
                    if not keys:
                        del table[h]
