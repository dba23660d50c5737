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
