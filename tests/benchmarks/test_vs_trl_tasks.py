"""The head-to-head's task adapters (no TRL needed): TRL sees the same prompts, tool and rewards as roll_agent."""

import asyncio

import pytest
from transformers.utils import get_json_schema

from benchmarks.vs_trl import tasks
from envs.tool_use import LATENCY_TOOL_SCHEMA, TOOL_INSTRUCTIONS


def test_reverse_reward_is_the_env_reward():
    seeds = tasks.train_seeds(3, seed=1)
    env = tasks.make(tasks.SINGLE_TURN)
    answers = []
    for s in seeds:
        env.reset(seed=s)
        answers.append(env.unwrapped.expert_action())
    completions = [[{"role": "assistant", "content": a}] for a in answers]
    assert tasks.reverse_reward(completions, seed=seeds) == [1.0, 1.0, 1.0]
    assert tasks.reverse_reward([[{"role": "assistant", "content": "x"}]], seed=seeds[:1]) == [0.0]


def test_prompt_rows_carry_the_env_instructions_and_observation():
    row = tasks.prompt_row(tasks.SINGLE_TURN, 5)
    obs, info = tasks.make(tasks.SINGLE_TURN).reset(seed=5)
    assert row["prompt"] == [{"role": "system", "content": info["instructions"]}, {"role": "user", "content": obs}]
    tool_row = tasks.prompt_row(tasks.MULTI_TURN, 5)
    assert tool_row["prompt"][0]["content"] == TOOL_INSTRUCTIONS and tool_row["prompt"][1]["content"] == ""


def test_tool_environment_matches_the_env():
    tool_env = tasks.CalculatorToolEnv()
    assert get_json_schema(tool_env.calculator) == LATENCY_TOOL_SCHEMA  # what TRL renders from the method
    obs = tool_env.reset(seed=11)
    expression = tool_env.env._expression
    assert expression in obs
    result = asyncio.run(tool_env.calculator(expression))
    assert result == f"calculator result: {tool_env.env._answer}"
    right = [{"role": "assistant", "content": f"<answer>{tool_env.env._answer}</answer>"}]
    out_of_calls = [{"role": "assistant", "content": "", "tool_calls": [{"type": "function"}]}]
    rewards = tasks.calculator_reward([right, out_of_calls, []], environments=[tool_env] * 3)
    assert rewards == [1.0, 0.0, 0.0]


def test_tool_conversation_renders_as_roll_agent_frames_it(tokenizer, formatter):
    """A tool-calling trainer's conversation (tools in the template, a `tool` message) and roll_agent's
    token framing (env observation as the next user turn) give the model the same text."""
    env = tasks.make(tasks.MULTI_TURN, **tasks.NO_LATENCY)
    obs, info = env.reset(seed=3)
    call = env.unwrapped.expert_action()
    tool_obs = env.step(call)[0]
    ours = formatter.first_prompt(info["instructions"], obs, info["tools"]) + formatter.encode(call) + \
        [formatter.end_of_turn_id] + formatter.next_turn(tool_obs, response_ended_with_stop=True)
    arguments = {"expression": env.unwrapped._expression}
    conversation = [
        {"role": "system", "content": info["instructions"]}, {"role": "user", "content": obs},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": arguments}}]},
        {"role": "tool", "name": "calculator", "content": tool_obs.split("\n")[1]},
    ]
    theirs = tokenizer.apply_chat_template(conversation, tools=info["tools"], tokenize=False,
                                           add_generation_prompt=True)
    assert tokenizer.decode(ours) == theirs


def test_paired_difference_is_the_mean_gap_over_the_same_seeds_with_its_standard_error():
    from benchmarks.vs_trl.run import paired_difference

    diff, se = paired_difference({1: 1.0, 2: 0.5, 3: 0.0}, {3: 0.0, 1: 0.5, 2: 0.5})
    assert diff == pytest.approx(0.5 / 3)  # per seed: 0.5, 0, 0
    assert se == pytest.approx((((0.5 - 1 / 6) ** 2 + 2 * (1 / 6) ** 2) / 2) ** 0.5 / 3 ** 0.5)


def test_reward_difference_averages_seed_pairs_with_the_spread_between_pairs():
    from benchmarks.vs_trl.run import paired_difference, reward_difference

    ours = [{"eval_rewards": {1: 1.0, 2: 0.5}}, {"eval_rewards": {1: 0.5, 2: 0.5}}, {"eval_rewards": {1: 1.0, 2: 1.0}}]
    theirs = [{"eval_rewards": {1: 0.5, 2: 0.5}}, {"eval_rewards": {2: 0.5, 1: 1.0}}, {"eval_rewards": {1: 1.0, 2: 1.0}}]
    diff, se = reward_difference(ours, theirs)
    pairs = [0.25, -0.25, 0.0]  # each pair's mean gap over the eval seeds
    assert diff == pytest.approx(0.0)
    assert se == pytest.approx((sum(d * d for d in pairs) / 2) ** 0.5 / 3 ** 0.5)
    # one pair: the eval seeds' spread, as paired_difference gives it
    assert reward_difference(ours[:1], theirs[:1]) == paired_difference(ours[0]["eval_rewards"], theirs[0]["eval_rewards"])
    with pytest.raises(ValueError):
        reward_difference(ours, theirs[:2])  # every run needs its partner


def test_seed_means_averages_each_seeds_repeated_runs_per_eval_seed():
    from benchmarks.vs_trl.run import reward_difference, seed_means

    runs = [{"eval_rewards": {1: 1.0, 2: 0.0}}, {"eval_rewards": {1: 0.5, 2: 1.0}},  # seed 0, two runs
            {"eval_rewards": {1: 0.0, 2: 0.0}}, {"eval_rewards": {1: 1.0, 2: 0.5}}]  # seed 1
    merged = seed_means(runs, 2)
    assert merged == [{"eval_rewards": {1: 0.75, 2: 0.5}}, {"eval_rewards": {1: 0.5, 2: 0.25}}]
    assert seed_means(runs, 1) == runs
    theirs = [{"eval_rewards": {1: 0.75, 2: 0.5}}, {"eval_rewards": {1: 0.25, 2: 0.5}}]
    assert reward_difference(merged, theirs) == pytest.approx((0.0, 0.0))  # pairs 0 and 0


def test_combine_sums_samples_and_seconds_and_averages_rewards():
    from benchmarks.vs_trl.run import combine

    runs = [{"samples": 100, "seconds": 2.0, "tool_calls": 1.0, "tokens_per_sample": 5.0, "train_reward": 0.5,
             "eval_reward": 0.92, "cpu": {"seconds": 3.0, "wall_s": 1.5, "samples": 90}},
            {"samples": 100, "seconds": 3.0, "tool_calls": 0.0, "tokens_per_sample": 7.0, "train_reward": 0.7,
             "eval_reward": 0.96, "cpu": {"seconds": 3.0, "wall_s": 2.5, "samples": 90}}]
    row = combine(runs)
    assert row["samples_per_s"] == pytest.approx(200 / 5.0)  # not the mean of 50 and 33.3
    assert row["cores"] == pytest.approx(6.0 / 4.0) and row["cpu_s_per_sample"] == pytest.approx(6.0 / 180)
    assert row["eval_reward"] == pytest.approx(0.94) and row["tokens_per_sample"] == pytest.approx(6.0)
    assert row["runs"] is runs
