"""The transformers engine: log-probs match a plain forward pass; abort; weight updates."""

import asyncio

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from roll_agent.config import EngineConfig, ModelConfig
from roll_agent.proxy.engines.hf import HFEngine
from roll_agent.types import SamplingParams
from tests.conftest import run
from tests.proxy.top_logprobs import assert_top_logprobs_match_forward


def _forward_logprobs(model, prompt, generated, temperature):
    ids = torch.tensor([prompt + generated])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1] / temperature
    return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(generated)[:, None]).squeeze(-1)


def test_engine_logprobs_match_transformers_forward(tiny_model_dir):
    engine = HFEngine(tiny_model_dir, EngineConfig(), ModelConfig(), seed=0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    prompts = [[5, 9, 11, 20, 33], [7, 8], [40, 41, 42, 43, 44, 45, 46, 47]]  # ragged: left padding in one batch

    async def go():
        sampling = SamplingParams(max_new_tokens=12, temperature=0.8)
        return await asyncio.gather(*(engine.generate(p, sampling, f"r{i}") for i, p in enumerate(prompts)))

    outs = run(go())
    for prompt, out in zip(prompts, outs):
        assert len(out.token_ids) == 12 and out.finish_reason == "length"
        ref = _forward_logprobs(model, prompt, out.token_ids, 0.8)
        diff = (ref - torch.tensor(out.logprobs)).abs().mean().item()
        assert diff <= 1e-3, diff


def test_greedy_matches_argmax_and_stop_tokens_end_requests(tiny_model_dir):
    engine = HFEngine(tiny_model_dir, EngineConfig(), ModelConfig(), seed=0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    prompt = [3, 4, 5, 6]

    out = run(engine.generate(prompt, SamplingParams(max_new_tokens=6, greedy=True), "g"))
    ids = list(prompt)
    for _ in range(6):
        with torch.no_grad():
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    assert out.token_ids == ids[len(prompt):]
    stop = out.token_ids[2]
    out2 = run(engine.generate(prompt, SamplingParams(max_new_tokens=6, greedy=True, stop_token_ids=(stop,)), "s"))
    assert out2.finish_reason == "stop" and out2.token_ids[-1] == stop
    assert len(out2.token_ids) == out.token_ids.index(stop) + 1


def test_load_weights_changes_outputs_and_version(tiny_model_dir):
    engine = HFEngine(tiny_model_dir, EngineConfig(), ModelConfig(), seed=0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)

    async def go():
        sampling = SamplingParams(max_new_tokens=5, greedy=True)
        before = await engine.generate([1, 2, 3], sampling, "a")
        await engine.load_weights(model.named_parameters(), version=3)
        after = await engine.generate([1, 2, 3], sampling, "b")
        return before, after

    before, after = run(go())
    assert engine.version == 3
    assert before.logprobs != after.logprobs
    for (name, p), q in zip(model.named_parameters(), engine.model.parameters()):
        assert torch.equal(p, q), name


def test_abort_returns_partial_output(tiny_model_dir):
    engine = HFEngine(tiny_model_dir, EngineConfig(), ModelConfig(), seed=0)

    async def go():
        task = asyncio.create_task(engine.generate([1, 2, 3], SamplingParams(max_new_tokens=2000), "long"))
        await asyncio.sleep(0.2)
        await engine.abort("long")
        return await task

    out = run(go())
    assert out.finish_reason == "abort"
    assert 0 < len(out.token_ids) < 2000
    assert len(out.logprobs) == len(out.token_ids)


def test_requests_joining_a_running_batch_get_exact_logprobs(tiny_model_dir):
    """Arrivals mid-decode are folded into the running KV cache (left-padded), finished rows
    are pruned: every request's log-probs still equal a plain forward pass."""
    engine = HFEngine(tiny_model_dir, EngineConfig(), ModelConfig(), seed=0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    long_prompt, short_prompts = [1, 2, 3], [[4, 5, 6, 7, 8, 9, 10, 11, 12, 13], [14, 15]]

    async def go():
        sampling = SamplingParams(max_new_tokens=40, temperature=0.9)
        long = asyncio.create_task(engine.generate(long_prompt, sampling, "long"))
        while not engine._running or not engine._running[0].items[0].tokens:
            await asyncio.sleep(0.005)
        shorts = await asyncio.gather(*(engine.generate(p, SamplingParams(max_new_tokens=4, temperature=0.9),
                                                        f"s{i}") for i, p in enumerate(short_prompts)))
        return await long, shorts

    long, shorts = run(go())
    assert len(long.token_ids) == 40
    for prompt, out in [(long_prompt, long), *zip(short_prompts, shorts)]:
        ref = _forward_logprobs(model, prompt, out.token_ids, 0.9)
        assert (ref - torch.tensor(out.logprobs)).abs().max().item() <= 1e-3


def test_request_arriving_mid_decode_joins_without_waiting_for_the_running_batch(tiny_model_dir):
    engine = HFEngine(tiny_model_dir, EngineConfig(), ModelConfig(), seed=0)

    async def go():
        long = asyncio.create_task(engine.generate([1, 2, 3], SamplingParams(max_new_tokens=100_000), "long"))
        while not engine._running:
            await asyncio.sleep(0.01)
        short = await engine.generate([4, 5], SamplingParams(max_new_tokens=3), "short")
        still_running = not long.done()
        await engine.abort("long")
        return short, still_running, await long

    short, still_running, long = run(go())
    assert short.finish_reason == "length" and len(short.token_ids) == 3
    assert still_running
    assert long.finish_reason == "abort" and len(long.token_ids) >= 3


def test_next_turn_reuses_the_remembered_prefix_with_exact_logprobs(tiny_model_dir):
    """Turn 2 of an episode (its turn 1 + answer + observation) computes only the new tokens, a
    second episode reuses the shared instructions, and requests with different remembered
    prefixes (or none) share one prefill: outputs equal an engine without the cache."""
    cached = HFEngine(tiny_model_dir, EngineConfig(), ModelConfig(), seed=0)
    plain = HFEngine(tiny_model_dir, EngineConfig(prefix_cache_tokens=0), ModelConfig(), seed=0)
    assert cached.prefix_cache is not None and plain.prefix_cache is None
    instructions = list(range(30, 110))  # 80 tokens: past the cache's minimum match (64)
    greedy = SamplingParams(max_new_tokens=6, greedy=True)

    async def episodes(engine):
        outs = []
        for obs in ([5, 6, 7], [8, 9]):  # the second episode shares only the instructions
            first = await engine.generate(instructions + obs, greedy, "t1")
            second = await engine.generate(instructions + obs + first.token_ids + [90, 91, 92], greedy, "t2")
            outs += [first, second]
        # one prefill for: a third turn (long prefix), a new episode (instructions), an unrelated prompt
        turn3 = instructions + [5, 6, 7] + outs[0].token_ids + [90, 91, 92] + outs[1].token_ids + [93]
        outs += await asyncio.gather(engine.generate(turn3, greedy, "a"),
                                     engine.generate(instructions + [10, 11, 12, 13], greedy, "b"),
                                     engine.generate([7, 8, 9], greedy, "c"))
        return outs

    want, got = run(episodes(plain)), run(episodes(cached))
    for a, b in zip(want, got):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(torch.tensor(b.logprobs), torch.tensor(a.logprobs), rtol=0, atol=1e-4)
    stats = cached.prefix_cache.stats
    # each later turn reuses its history but the last answer token (never fed); a new episode the
    # instructions; the first request and the unrelated prompt find nothing
    assert stats["lookups"] == 7 and stats["hits"] == 5
    assert stats["hit_tokens"] == (83 + 5) + 80 + (82 + 5) + (83 + 6 + 3 + 5) + 80

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    run(cached.load_weights(list(model.named_parameters()), 1))
    assert len(cached.prefix_cache) == 0  # KV of the old weights is never reused


def test_the_prefix_cache_holds_kv_cache_space_gib_of_kv_by_default(tiny_model_dir):
    """Sized in memory, not tokens: a multi-turn env's episodes (72 envs x ~3,000 tokens on
    ALFWorld) must all fit, or each turn re-computes its history."""
    config = AutoConfig.from_pretrained(tiny_model_dir)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_token = config.num_hidden_layers * 2 * config.num_key_value_heads * head_dim * 4  # keys + values, fp32
    for gib, want in ((1.0, 2**30 // per_token), (0.0, 2**30 // per_token), (0.01, int(0.01 * 2**30) // per_token)):
        engine = HFEngine(tiny_model_dir, EngineConfig(kv_cache_space_gib=gib), ModelConfig(), seed=0)
        assert engine.prefix_cache.max_tokens == want, gib
    assert HFEngine(tiny_model_dir, EngineConfig(prefix_cache_tokens=5000), ModelConfig()).prefix_cache.max_tokens == 5000


def test_requests_with_one_prompt_share_its_prefill_with_exact_logprobs(tiny_model_dir):
    """A group's envs ask with the same prompt at once: its prefill row is computed once and
    copied; each request still samples on its own, with the log-probs of a plain forward pass."""
    engine = HFEngine(tiny_model_dir, EngineConfig(), ModelConfig(), seed=0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    shared, other = [5, 9, 11, 20, 33, 7, 8], [40, 41, 42]
    prompts = [shared] * 5 + [other, shared]
    forwards = []
    real = engine.model.forward

    def counting(*args, **kwargs):
        forwards.append(kwargs["input_ids"].shape)
        return real(*args, **kwargs)

    engine.model.forward = counting

    async def go():
        sampling = SamplingParams(max_new_tokens=10, temperature=1.0)
        return await asyncio.gather(*(engine.generate(p, sampling, f"r{i}") for i, p in enumerate(prompts)))

    outs = run(go())
    assert forwards[0] == (2, len(shared))  # the prefill: two distinct prompts
    assert len({tuple(o.token_ids) for o in outs}) > 1  # copies sample independently
    for prompt, out in zip(prompts, outs):
        ref = _forward_logprobs(model, prompt, out.token_ids, 1.0)
        diff = (ref - torch.tensor(out.logprobs)).abs().max().item()
        assert diff <= 1e-3, diff


def test_top_logprobs_are_the_forwards_likeliest_tokens_and_tokens_stream_per_step(tiny_model_dir):
    """top_logprobs=3 at temperature 0.8: each token's alternatives are the top 3 of a transformers
    forward's log_softmax(logits / 0.8) at its position, the sampled token's log-prob among them
    where it is one; each decode step hands its token to on_tokens as it is sampled."""
    engine = HFEngine(tiny_model_dir, EngineConfig(), ModelConfig(), seed=0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    prompt, streamed = [5, 9, 11, 20, 33], []
    sampling = SamplingParams(max_new_tokens=10, temperature=0.8, top_logprobs=3)
    out = run(engine.generate(prompt, sampling, "top", on_tokens=lambda *run_: streamed.append(run_)))
    assert len(out.token_ids) == 10
    assert_top_logprobs_match_forward(model, prompt, out, k=3, temperature=0.8, atol=1e-3, sampled_atol=1e-6)
    assert [run_[0] for run_ in streamed] == [[t] for t in out.token_ids]  # one token per step, in order
    assert [a for run_ in streamed for a in run_[2]] == out.top_logprobs
