"""The calculator tool-use env: tool calls in the chat-template convention, plain-text fallback."""

import gymnasium
import pytest

import envs  # noqa: F401
from envs.tool_use import evaluate


def _env():
    return gymnasium.make("roll_agent/Calculator-v0")


def test_expert_solves_with_one_tool_call():
    for seed in range(10):
        env = _env()
        _, info = env.reset(seed=seed)
        assert info["tools"][0]["function"]["name"] == "calculator"
        obs, reward, term, _, info = env.step(env.unwrapped.expert_action())
        assert obs.startswith("calculator result:") and not term
        obs, reward, term, _, info = env.step(env.unwrapped.expert_action())
        assert term and reward == 1.0 and info["success"]


def test_plain_text_fallback_and_wrong_answer():
    env = _env()
    obs, _ = env.reset(seed=1)
    expression = env.unwrapped._expression
    obs, *_ = env.step(f"let me compute. calculate: {expression}")
    assert obs == f"calculator result: {evaluate(expression)}"
    _, reward, term, _, info = env.step("answer: 1")
    assert term and reward == 0.0 and not info["success"]


@pytest.mark.parametrize("bad", ['<tool_call>{"name": "calculator", "arguments": {', "<tool_call>not json</tool_call>",
                                 '<tool_call>{"name": "rm", "arguments": {}}</tool_call>', "", "42"])
def test_broken_tool_calls_are_invalid(bad):
    env = _env()
    env.reset(seed=0)
    _, _, term, _, info = env.step(bad)
    assert info["invalid_action"] and not term


@pytest.mark.parametrize("expr", ["__import__('os')", "2**1000000", "a+1", "(1).real"])
def test_calculator_refuses_anything_but_arithmetic(expr):
    with pytest.raises(ValueError):
        evaluate(expr)
    env = _env()
    env.reset(seed=0)
    obs, *_ = env.step(f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{expr}"}}}}</tool_call>')
    assert obs.startswith("calculator error")


def _latency_env(**kwargs):
    return gymnasium.make("roll_agent/ToolLatencyCalculator-v0", **({"latency_min_s": 0.0, "latency_mean_s": 0.0,
                                                                      "latency_max_s": 0.0} | kwargs))


def test_tool_turn_then_final_answer():
    env = _latency_env()
    _, info = env.reset(seed=3)
    assert info["tools"][0]["function"]["name"] == "calculator"
    obs, reward, term, trunc, _ = env.step(env.unwrapped.expert_action())
    expected = evaluate(env.unwrapped._expression)
    assert obs == f"<tool_response>\ncalculator result: {expected}\n</tool_response>" and not (term or trunc)
    _, reward, term, _, info = env.step(env.unwrapped.expert_action())
    assert term and reward == 1.0 and info["success"]


def test_a_turn_without_tool_call_is_the_final_answer():
    env = _latency_env()
    env.reset(seed=3)
    _, reward, term, _, info = env.step("I think it is 5")
    assert term and reward == 0.0 and not info["success"]


def test_tool_calls_run_out_after_max_steps():
    env = _latency_env(max_steps=2)
    env.reset(seed=3)
    call = env.unwrapped.expert_action()
    assert not env.step(call)[3]
    _, reward, term, trunc, _ = env.step(call)
    assert trunc and not term and reward == 0.0


def test_tool_latency_is_long_tailed_within_bounds():
    import random

    from envs.tool_use import tool_latency

    rng = random.Random(0)
    draws = sorted(tool_latency(rng, 0.1, 0.2, 0.5) for _ in range(2000))
    assert draws[0] >= 0.1 and draws[-1] <= 0.5
    median, mean = draws[1000], sum(draws) / len(draws)
    assert median < mean  # a right tail
    assert draws[-1] == 0.5  # the cap is reached


def test_async_step_matches_step():
    import asyncio

    sync_env, async_env = _latency_env(), _latency_env()
    for env in (sync_env, async_env):
        env.reset(seed=5)
    for _ in range(2):
        action = sync_env.unwrapped.expert_action()
        assert asyncio.run(async_env.unwrapped.astep(action)) == sync_env.step(action)
