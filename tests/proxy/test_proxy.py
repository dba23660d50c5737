"""LLMProxy: suspend/update/resume is invisible to callers; routing; abort."""

import asyncio

import pytest

from roll_agent.config import ProxyConfig, ScriptedEngineConfig
from roll_agent.proxy.engines.scripted import ScriptedEngine
from roll_agent.proxy.llm_proxy import LLMProxy
from roll_agent.types import GenerateRequest, SamplingParams
from tests.conftest import run

STOP = 2


def _request(i: int, env: str = "") -> GenerateRequest:
    return GenerateRequest([5, 6, 7, i], SamplingParams(max_new_tokens=40, stop_token_ids=(STOP,)), env_id=env or f"env{i}")


@pytest.mark.parametrize("mode", ["abort", "drain"])
def test_suspend_mid_generation_loses_and_duplicates_nothing(mode):
    cfg = ScriptedEngineConfig(response_tokens=12, token_latency_s=0.004)

    async def go():
        # reference: the same requests with no weight update
        ref = LLMProxy([ScriptedEngine(cfg, seed=0)])
        expected = await asyncio.gather(*(ref.generate(_request(i)) for i in range(8)))
        proxy = LLMProxy([ScriptedEngine(cfg, seed=0), ScriptedEngine(cfg, seed=0)], ProxyConfig(suspend_mode=mode))
        calls = [asyncio.create_task(proxy.generate(_request(i))) for i in range(8)]
        await asyncio.sleep(0.015)
        await proxy.suspend()
        assert not proxy._inflight
        await proxy.push_weights(1)
        await proxy.resume()
        return expected, await asyncio.gather(*calls)

    expected, results = run(go())
    for want, got in zip(expected, results):
        assert got.token_ids == want.token_ids  # re-issued from the prefix: nothing lost or duplicated
        assert got.finish_reason == want.finish_reason
        assert len(got.versions) == len(got.token_ids) == len(got.logprobs)
        assert got.versions == sorted(got.versions)
    if mode == "abort":
        both = [r for r in results if set(r.versions) == {0, 1}]
        assert both, "some requests must carry tokens of both versions"
        assert all(r.num_reissues >= 1 for r in both)
        # log-probs come from the engine that generated each token
        for r in both:
            first_new = r.versions.index(1)
            assert r.logprobs[first_new] < r.logprobs[first_new - 1] + 1  # finite, recorded
    else:
        assert all(set(r.versions) == {0} for r in results)


def test_push_weights_requires_suspend_and_one_update_waits_for_another():
    async def go():
        proxy = LLMProxy([ScriptedEngine()])
        with pytest.raises(RuntimeError, match="suspend"):
            await proxy.push_weights(1)
        await proxy.suspend()
        second = asyncio.create_task(proxy.suspend())  # e.g. a restarted engine's push: waits its turn
        await asyncio.sleep(0.01)
        assert not second.done()
        await proxy.push_weights(1)
        await proxy.resume()
        await asyncio.wait_for(second, 1)
        await proxy.push_weights(2)
        await proxy.resume()
        return proxy

    proxy = run(go())
    assert proxy.version == proxy.engines[0].version == 2


def test_an_engine_that_died_idle_fails_the_push_and_is_restarted_with_the_new_weights():
    engines = [ScriptedEngine(seed=0), ScriptedEngine(ScriptedEngineConfig(restart_s=0.01), seed=1)]
    proxy = LLMProxy(engines)

    async def go():
        engines[1].alive = False  # it died between requests: the proxy learns of it at the push
        await proxy.suspend()
        report = await proxy.push_weights(3)
        await proxy.resume()
        while proxy._restarts:
            await asyncio.sleep(0.005)
        return report, await proxy.generate(_request(0, env="after"))

    report, result = run(go())
    assert proxy.version == engines[0].version == engines[1].version == 3
    assert engines[1].restarts == 1
    assert {k: proxy.stats[k] for k in ("sync_retries", "engine_crashes", "engine_restarts")} == \
        {"sync_retries": 1, "engine_crashes": 1, "engine_restarts": 1}
    assert report["seconds"] >= 0 and len(result.token_ids) > 0


def test_routing_is_least_loaded_then_sticky():
    async def go():
        engines = [ScriptedEngine(ScriptedEngineConfig(latency_s=0.05)) for _ in range(3)]
        proxy = LLMProxy(engines, ProxyConfig(sticky_slack=1))
        first = [asyncio.create_task(proxy.generate(_request(i, env=f"e{i}"))) for i in range(3)]
        await asyncio.sleep(0.01)
        assert proxy._load == [1, 1, 1]  # least loaded spreads the first three
        await asyncio.gather(*first)
        homes = dict(proxy._sticky)
        again = [asyncio.create_task(proxy.generate(_request(i, env=f"e{i}"))) for i in range(3)]
        await asyncio.gather(*again)
        assert proxy._sticky == homes  # each env went back to its engine
        served = [e.requests_served for e in engines]
        assert served == [2, 2, 2]

    run(go())


def test_cancelling_the_caller_aborts_the_engine_request():
    async def go():
        engine = ScriptedEngine(ScriptedEngineConfig(response_tokens=30, token_latency_s=0.01))
        proxy = LLMProxy([engine])
        task = asyncio.create_task(proxy.generate(_request(1)))
        await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert engine.aborted_ids and not proxy._inflight

    run(go())


def _streamed(i: int, seen: list, top: int = 0) -> GenerateRequest:
    request = _request(i)
    request.sampling.top_logprobs = top
    request.on_tokens = lambda ids, logprobs, alternatives: seen.append((ids, logprobs, alternatives))
    return request


def test_a_streamed_request_gets_each_token_once_in_order_across_a_suspend():
    cfg = ScriptedEngineConfig(response_tokens=12, token_latency_s=0.004)

    async def go():
        expected = await LLMProxy([ScriptedEngine(cfg)]).generate(_request(3))
        proxy = LLMProxy([ScriptedEngine(cfg)])
        seen: list = []
        call = asyncio.create_task(proxy.generate(_streamed(3, seen, top=2)))
        while len(seen) < 3:
            await asyncio.sleep(0.001)
        await proxy.suspend()
        await proxy.push_weights(1)
        await proxy.resume()
        return expected, await call, seen

    expected, result, seen = run(go())
    assert len(seen) == len(result.token_ids) > 3  # one run per token: the scripted engine streams
    assert [t for ids, _, _ in seen for t in ids] == result.token_ids == expected.token_ids
    assert [lp for _, lps, _ in seen for lp in lps] == result.logprobs
    assert [a for _, _, alts in seen for a in alts] == result.top_logprobs
    assert all(len(alts) == 2 and alts[0][0] == t for t, alts in zip(result.token_ids, result.top_logprobs))
    assert set(result.versions) == {0, 1} and result.num_reissues == 1


class _StreamsThenFails(ScriptedEngine):
    """Streams two tokens, then fails the request."""

    async def generate(self, prompt_ids, sampling, request_id, on_tokens=None):
        on_tokens([11, 12], [-1.0, -1.0], None)
        raise RuntimeError("the engine failed mid-answer")


def test_what_was_streamed_stays_in_the_answer_when_the_engine_then_fails():
    async def go():
        proxy = LLMProxy([_StreamsThenFails(), ScriptedEngine(script=lambda prompt: [20, 21, STOP])])
        seen: list = []
        return await proxy.generate(_streamed(0, seen)), seen

    result, seen = run(go())
    assert result.token_ids == [11, 12, 20, 21, STOP]  # re-issued on the other engine from what it had streamed
    assert [t for ids, _, _ in seen for t in ids] == result.token_ids
