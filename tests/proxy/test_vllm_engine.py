"""The vLLM engine: log-probs match a plain transformers forward pass; abort returns
partial output; in-place weight reloads; the proxy's suspend/update/resume; close()
leaves no processes. Skipped where vLLM is not installed (the `vllm` extra).

One engine serves the whole module (vLLM takes ~20-40 s to start on CPU). Every test
runs in its own event loop (`run`), so this also checks that the engine works across
loops. Tests that depend on the weights load them first.
"""

import asyncio
import shutil
import time

import pytest
import torch

vllm = pytest.importorskip("vllm")
psutil = pytest.importorskip("psutil")

from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from roll_agent.config import EngineConfig, ModelConfig  # noqa: E402
from roll_agent.proxy.engines import make_engines  # noqa: E402
from roll_agent.proxy.engines.vllm import VLLMEngine  # noqa: E402
from roll_agent.proxy.llm_proxy import LLMProxy  # noqa: E402
from roll_agent.sync.inprocess import InProcessSync  # noqa: E402
from roll_agent.types import GenerateRequest, SamplingParams  # noqa: E402
from tests.conftest import run  # noqa: E402
from tests.proxy.top_logprobs import assert_top_logprobs_match_forward  # noqa: E402

pytestmark = pytest.mark.slow

CFG = EngineConfig(type="vllm", kv_cache_space_gib=1.0, enforce_eager=True)


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir, tmp_path_factory):
    """`tiny_model_dir`, or on CPU the same model with head_dim 32: vLLM's CPU attention
    has no kernel for the fixture's head_dim 16 (32 is the smallest it supports)."""
    if not _on_cpu():
        return tiny_model_dir
    out = tmp_path_factory.mktemp("tiny_model_hd32")
    shutil.copytree(tiny_model_dir, out, dirs_exist_ok=True)
    config = AutoConfig.from_pretrained(tiny_model_dir)
    config.num_attention_heads, config.num_key_value_heads = 2, 1
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out)
    return str(out)


@pytest.fixture(scope="module")
def original(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def perturbed(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():  # embeddings included: they are tied to lm_head
            p.add_(torch.randn(p.shape, generator=gen) * 0.5)
    return model


@pytest.fixture(scope="module")
def engine(model_dir):
    start = time.perf_counter()
    (eng,) = make_engines(CFG, ModelConfig(), model_dir, seed=0)
    print(f"vLLM engine started in {time.perf_counter() - start:.1f}s")
    yield eng
    run(eng.close())


def _logprobs(model, prompt, generated, temperature=1.0):
    ids = torch.tensor([prompt + generated])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(generated)[:, None]).squeeze(-1)


def _mean_diff(model, prompt, out, temperature=1.0) -> float:
    ref = _logprobs(model, prompt, out.token_ids, temperature)
    return (ref - torch.tensor(out.logprobs)).abs().mean().item()


async def _until_generating(engine, min_tokens: int = 1) -> None:
    """Until a request in flight has sampled `min_tokens` (a loaded machine may take seconds to
    produce the first one; the bound is only against a hang)."""
    deadline = time.monotonic() + 120
    while not any(len(r.tokens) >= min_tokens for r in list(engine._requests.values())):
        assert time.monotonic() < deadline, "no request produced tokens in 120 s"
        await asyncio.sleep(0.05)


def _load(engine, model, version):
    run(engine.load_weights(list(model.named_parameters()), version))


def test_refuses_a_head_dim_the_cpu_build_cannot_run(tiny_model_dir):
    if not _on_cpu():
        pytest.skip("CPU build only")
    with pytest.raises(ValueError, match="head_dim=16"):
        VLLMEngine(tiny_model_dir, CFG, ModelConfig())


def test_logprobs_match_transformers_forward(engine, original):
    _load(engine, original, 0)
    prompts = [[5, 9, 11, 20, 33], [7, 8], [40, 41, 42, 43, 44, 45, 46, 47]]

    async def go():
        sampling = SamplingParams(max_new_tokens=12, temperature=0.8)
        return await asyncio.gather(*(engine.generate(p, sampling, f"lp{i}") for i, p in enumerate(prompts)))

    for prompt, out in zip(prompts, run(go())):
        assert len(out.token_ids) == len(out.logprobs) == 12 and out.finish_reason == "length"
        assert _mean_diff(original, prompt, out, 0.8) <= 1e-3


def test_greedy_matches_argmax_and_stop_tokens_end_requests(engine, original):
    _load(engine, original, 0)
    prompt = [3, 4, 5, 6]
    out = run(engine.generate(prompt, SamplingParams(max_new_tokens=6, greedy=True), "g"))
    ids = list(prompt)
    for _ in range(6):
        with torch.no_grad():
            ids.append(int(original(torch.tensor([ids])).logits[0, -1].argmax()))
    assert out.token_ids == ids[len(prompt):]
    assert _mean_diff(original, prompt, out) <= 1e-3  # greedy: log-probs at temperature 1
    stop = out.token_ids[2]
    out2 = run(engine.generate(prompt, SamplingParams(max_new_tokens=6, greedy=True, stop_token_ids=(stop,)), "s"))
    assert out2.finish_reason == "stop" and out2.token_ids[-1] == stop
    assert len(out2.token_ids) == out.token_ids.index(stop) + 1


def test_top_logprobs_are_the_forwards_likeliest_tokens_and_tokens_stream(engine, original):
    """top_logprobs=3: each token's alternatives are the top 3 of log_softmax(logits / temperature),
    the sampled token's log-prob among them where it is one; tokens reach on_tokens as vLLM streams them."""
    _load(engine, original, 0)
    prompt, streamed = [5, 9, 11, 20, 33], []
    sampling = SamplingParams(max_new_tokens=10, temperature=0.8, top_logprobs=3)
    out = run(engine.generate(prompt, sampling, "top", on_tokens=lambda *run_: streamed.append(run_)))
    assert len(out.token_ids) == 10
    assert_top_logprobs_match_forward(original, prompt, out, k=3, temperature=0.8, atol=1e-2, sampled_atol=1e-5)
    assert [t for run_ in streamed for t in run_[0]] == out.token_ids
    assert [a for run_ in streamed for a in run_[2]] == out.top_logprobs


def test_abort_returns_partial_output_promptly(engine, original):
    _load(engine, original, 0)

    async def go():
        task = asyncio.create_task(engine.generate([1, 2, 3], SamplingParams(max_new_tokens=2000), "long"))
        await _until_generating(engine)
        start = time.perf_counter()
        await engine.abort("long")
        out = await task
        # an abort that arrives before vLLM has seen the request
        early = asyncio.create_task(engine.generate([1, 2, 3], SamplingParams(max_new_tokens=2000), "early"))
        await asyncio.sleep(0)
        await engine.abort("early")
        return out, time.perf_counter() - start, await early

    out, seconds, early = run(go())
    assert out.finish_reason == "abort"
    assert 0 < len(out.token_ids) < 2000 and len(out.logprobs) == len(out.token_ids)
    assert seconds < 5.0  # not the 2000 tokens: a bound that holds on a loaded machine
    assert _mean_diff(original, [1, 2, 3], out) <= 1e-3
    assert early.finish_reason == "abort" and len(early.token_ids) < 2000


def test_cancelled_caller_aborts_its_request(engine):
    async def go():
        task = asyncio.create_task(engine.generate([1, 2, 3], SamplingParams(max_new_tokens=2000), "cancelled"))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(100):  # vLLM drops the request once the cancellation reaches its loop
            if engine._llm.get_num_unfinished_requests() == 0:
                return True
            await asyncio.sleep(0.01)
        return False

    assert run(go())
    assert not engine._requests


def test_load_weights_changes_outputs_and_resets_the_prefix_cache(engine, original, perturbed):
    _load(engine, original, 0)
    # long enough to fill whole KV blocks, which the prefix cache would reuse
    prompt = [3 + (i * 37) % 390 for i in range(300)]
    greedy = SamplingParams(max_new_tokens=8, greedy=True)
    sampled = SamplingParams(max_new_tokens=16, temperature=0.7)

    async def go():
        before = await engine.generate(prompt, greedy, "before")
        await engine.load_weights(perturbed.named_parameters(), version=3)
        after = await engine.generate(prompt, greedy, "after")  # same prompt: cached KV must not be reused
        again = await engine.generate(prompt[:50], sampled, "again")
        return before, after, again

    before, after, again = run(go())
    assert engine.version == 3
    assert before.logprobs != after.logprobs
    assert _mean_diff(original, prompt, before) <= 1e-3
    assert _mean_diff(perturbed, prompt, after) <= 1e-3
    assert _mean_diff(perturbed, prompt[:50], again, 0.7) <= 1e-3


def test_load_weights_rejects_unknown_names_and_keeps_serving(engine, original):
    _load(engine, original, 0)
    with pytest.raises(KeyError, match="no parameter"):
        run(engine.load_weights([("model.not_a_layer.weight", torch.zeros(2))], version=9))
    assert engine.version == 0
    out = run(engine.generate([5, 9, 11], SamplingParams(max_new_tokens=8, temperature=0.8), "still"))
    assert _mean_diff(original, [5, 9, 11], out, 0.8) <= 1e-3


def test_proxy_suspend_update_resume_switches_weights_mid_request(engine, original, perturbed):
    _load(engine, original, 0)
    proxy = LLMProxy([engine], weight_sync=InProcessSync(perturbed.named_parameters))
    prompt = [5, 6, 7, 8]

    async def go():
        call = asyncio.create_task(proxy.generate(GenerateRequest(prompt, SamplingParams(max_new_tokens=1500))))
        await _until_generating(engine, 10)  # the switch lands mid-request
        await proxy.suspend()
        await proxy.push_weights(1)
        await proxy.resume()
        return await call

    result = run(go(), timeout=120)
    assert len(result.token_ids) == len(result.logprobs) == len(result.versions) == 1500
    assert set(result.versions) == {0, 1} and result.num_reissues >= 1
    assert result.versions == sorted(result.versions)
    ref_old = _logprobs(original, prompt, result.token_ids)
    ref_new = _logprobs(perturbed, prompt, result.token_ids)
    ref = torch.where(torch.tensor(result.versions) == 0, ref_old, ref_new)
    assert (ref - torch.tensor(result.logprobs)).abs().mean().item() <= 1e-3


def test_close_aborts_in_flight_requests_and_leaves_no_processes(engine):
    pids = set(engine._engine_pids)
    assert pids, "vLLM should run its engine core in child processes"

    async def go():
        task = asyncio.create_task(engine.generate([1, 2, 3], SamplingParams(max_new_tokens=5000), "at-close"))
        await asyncio.sleep(0.3)
        await engine.close()
        return await task

    out = run(go())
    assert out.finish_reason == "abort" and len(out.token_ids) == len(out.logprobs) < 5000
    alive = [p for p in psutil.Process().children(recursive=True)
             if p.pid in pids or p.name().startswith("VLLM")]
    assert not alive, alive
    with pytest.raises(RuntimeError, match="closed"):
        run(engine.generate([1, 2], SamplingParams(max_new_tokens=2), "after-close"))
