"""The hf engine's prefix cache index (roll_agent/proxy/engines/prefix_cache.py) finds what a
scan of every entry finds: the exact longest common prefix, and drops what a new entry covers."""

import random

import numpy as np
import torch

from roll_agent.proxy.engines.prefix_cache import BLOCK, PrefixCache, common_prefix


def kv_of(tokens: list[int]):
    """One layer's keys and values whose positions hold the token ids (so a slice shows what it covers)."""
    t = torch.tensor(tokens, dtype=torch.float32).view(1, 1, -1, 1)
    return [(t, t.clone())]


def scan(entries: list[list[int]], prompt: list[int], min_tokens: int) -> int:
    want = np.asarray(prompt[:-1])
    best = max((common_prefix(np.asarray(e), want) for e in entries), default=0)
    return best if best >= min_tokens else 0


def test_lookups_and_inserts_match_a_scan_of_every_entry():
    rng = random.Random(0)
    cache = PrefixCache(max_tokens=10**9)
    entries: list[list[int]] = []  # what the cache should hold
    trunks = [[rng.randrange(50) for _ in range(rng.randrange(60, 140))] for _ in range(4)]  # shared instructions
    for _ in range(400):
        trunk = rng.choice(trunks)
        if entries and rng.random() < 0.5:  # an episode's next turn: a remembered sequence, extended
            base = rng.choice(entries)
        else:  # a new episode: some of the instructions, then its own tokens
            base = trunk[:rng.randrange(len(trunk) + 1)]
        prompt = base[:rng.randrange(len(base) // 2, len(base) + 1)] + [rng.randrange(50) for _ in range(rng.randrange(1, 40))]
        n, kv = cache.longest(prompt)
        assert n == scan(entries, prompt, cache.min_tokens)
        if n:
            assert kv[0][0].flatten().tolist() == prompt[:n]  # the KV of exactly those tokens
        seq = prompt + [rng.randrange(50) for _ in range(rng.randrange(1, 10))]  # its answer
        cache.insert(seq, kv_of(seq))
        if len(seq) >= cache.min_tokens:  # shorter ones are not worth remembering
            entries = [e for e in entries if not (len(e) <= len(seq) and seq[:len(e)] == e)] + [seq]
        assert sorted(e.tokens.tolist() for e in cache._entries.values()) == sorted(entries)
    assert cache.stats["hits"] > 100  # the sequence above exercised the index, not only misses


def test_eviction_and_clear_leave_no_index_behind():
    cache = PrefixCache(max_tokens=500)
    for i in range(40):
        seq = [i] * (BLOCK * 5 + i % 7)
        cache.insert(seq, kv_of(seq))
    assert cache._size <= 500 and len(cache) == len({e.tokens[0] for e in cache._entries.values()})
    held = {h for e in cache._entries.values() for h in e.chain}
    assert set(cache._by_block) == held  # evicted entries' blocks are gone from the index
    assert cache.longest([39] * 90 + [1])[0] == BLOCK * 5 + 39 % 7 and cache.longest([0] * 90 + [1])[0] == 0  # 0 was evicted
    cache.clear()
    assert len(cache) == 0 and not cache._by_block and not cache._by_end
