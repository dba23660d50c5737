"""Property-based fuzzing of what reads untrusted input: the action and tool-call parsers,
the envs' step functions, the chat framing, and the config loader. Bad input gets a
clear result (an invalid action, a ConfigError), never a crash of another kind.

(Patch application is fuzzed with the SWE env's own grading code.)"""

import string

import gymnasium
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import envs
from envs.text_adapter import parse_action
from envs.tool_use import CalculatorEnv, evaluate
from roll_agent.config import Config, ConfigError
from roll_agent.config_loader import load_config

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
# model output: any unicode, plus fragments that look like what parsers look for
TOOLISH = st.sampled_from(['<tool_call>', '</tool_call>', '{"name": "calculator", "arguments": {"expression": "',
                           '"}}', "<answer>", "</answer>", "answer:", "calculate:", "left", "UP", "down.", "(((",
                           "1e999", "9" * 60, "*", "//0", "\x00", "\u202e", "ſ", "🤖", "\n"])
MODEL_TEXT = st.lists(st.one_of(st.text(max_size=40), TOOLISH), max_size=30).map("".join)
TEXT_ENVS = [i for i in envs.registered_ids() if i.split("/")[1].split("-")[0] in
             ("FrozenLake", "Sokoban", "Taxi", "CliffWalking", "Blackjack", "Calculator")]


@FUZZ
@given(text=MODEL_TEXT, words=st.lists(st.text(string.ascii_letters, min_size=1, max_size=8), min_size=1, max_size=6))
def test_parse_action_returns_one_of_the_words_or_none(text, words):
    action = parse_action(text, words)
    assert action is None or action in {w.lower() for w in words}


@FUZZ
@given(expression=st.one_of(st.text(max_size=220), st.text("0123456789+-*/%(). e", max_size=220)))
def test_calculator_expressions_fail_only_with_the_errors_the_env_reports(expression):
    try:
        evaluate(expression)
    except (ValueError, SyntaxError, ZeroDivisionError, OverflowError):
        pass


@pytest.mark.parametrize("env_id", TEXT_ENVS)
@settings(max_examples=15, deadline=None)
@given(actions=st.lists(MODEL_TEXT, min_size=1, max_size=6))
def test_env_steps_take_any_text(env_id, actions):
    env = gymnasium.make(env_id, disable_env_checker=True)
    try:
        env.reset(seed=0)
        for action in actions:
            obs, reward, terminated, truncated, info = env.step(action)
            assert isinstance(obs, str) and isinstance(float(reward), float)
            if terminated or truncated:
                env.reset(seed=1)
    finally:
        env.close()


@FUZZ
@given(text=MODEL_TEXT)
def test_calculator_tool_call_parser_takes_any_text(text):
    expression = CalculatorEnv._tool_expression(text)
    assert expression is None or isinstance(expression, str)


@FUZZ
@given(data=st.data())
def test_chat_framing_takes_any_ids_and_any_observation(formatter, data):
    vocab = len(formatter.tokenizer)
    ids = data.draw(st.lists(st.integers(0, vocab - 1), max_size=200))
    assert isinstance(formatter.response_text(ids), str)
    obs = data.draw(MODEL_TEXT)
    turn = formatter.next_turn(obs, data.draw(st.booleans()))
    assert turn and all(isinstance(t, int) for t in turn)
    assert formatter.first_prompt(data.draw(MODEL_TEXT), obs)


# ---- config loader ---------------------------------------------------------------
def _paths(cls=Config, prefix=""):
    import dataclasses

    out = []
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        out.append(path)
        if dataclasses.is_dataclass(f.default_factory() if f.default_factory is not dataclasses.MISSING else None):
            out += _paths(f.default_factory().__class__, path + ".")
    return out


KEYS = st.one_of(st.sampled_from(_paths()), st.text(max_size=20),
                 st.builds(lambda a, b: f"{a}.{b}", st.sampled_from(_paths()), st.text(max_size=10)))
VALUES = st.one_of(st.text(max_size=20), st.integers(-10**20, 10**20).map(str), st.floats().map(str),
                   st.sampled_from(["", "null", "true", "[1, 2", "{a: 1}", "[]", "${oc.env:NOPE}", "${x}", "-1", "0",
                                    "1e999", "nan", "'quoted", "[{id: roll_agent/Simulated-v0}]"]))


@FUZZ
@given(items=st.lists(st.tuples(KEYS, VALUES), max_size=4), bare=st.lists(st.text(max_size=10), max_size=1))
def test_config_overrides_load_or_raise_config_error(items, bare):
    overrides = [f"{k}={v}" for k, v in items] + bare
    try:
        cfg = load_config(None, overrides)
    except ConfigError as exc:
        assert str(exc)
        return
    assert isinstance(cfg, Config)


@FUZZ
@given(text=st.one_of(st.text(max_size=200), st.builds(lambda k, v: f"{k}: {v}\n", KEYS, VALUES),
                      st.builds(lambda k, v: f"rollout:\n  {k}: {v}\n", KEYS, VALUES)))
def test_config_files_load_or_raise_config_error(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("cfg") / "c.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        cfg = load_config(str(path))
    except ConfigError as exc:
        assert str(exc)
        return
    assert isinstance(cfg, Config)
