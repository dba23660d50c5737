"""Message-level token reuse (roll_agent/agents/token_reuse.py): what ordinary agents do to the
model's answers before sending them back (text before a tool call, JSON re-serialised, a newline
between parallel calls, smolagents' "Calling tools:" / "Observation:" convention, a special token
dropped) keeps an episode one sample, with the tiny model's ChatML template and real
Qwen2.5-style and Qwen3-style templates (tokenizers built here from the templates' text); an
agent that edits its history still forks. Every sample is exactly what the engine was given plus
what it sampled."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from roll_agent.rollout.chat import ChatFormatter
from roll_agent.tiny_model import build_tokenizer
from tests.agents.conftest import TOOLS, session_of, stack_for
from tests.conftest import run

TEMPLATES = Path(__file__).parent / "templates"
CORPUS = ["What is 25+17? Let me add the numbers.", "The sum is 42. Done.", '{"name": "add", "arguments": {"a": 1}}',
          "Calling tools: Observation: You add numbers."] * 20
THINK = "<think>\nI add the numbers.\n</think>\n\n"  # what a Qwen3 model writes first


def call(a: int, b: int, compact: bool = False) -> str:
    arguments = json.dumps({"a": a, "b": b}, separators=(",", ":") if compact else None)
    return f'<tool_call>\n{{"name": "add", "arguments": {arguments}}}\n</tool_call>'


# what the model samples for the first call, per variant; then "The sum is 42.", then "Done."
FIRST = {
    "clean": call(25, 17),
    "text_before_tool_call": "Let me add.\n" + call(25, 17),
    "compact_json": call(25, 17, compact=True),
    "parallel_calls_newline": call(25, 17) + "\n" + call(1, 2),
    "smolagents": "Let me add.\n" + call(25, 17),
    "dropped_special_token": call(25, 17),
    # the client keeps no ids of ours: its own call ids, compact JSON, padded content, thinking stripped
    "client_normalised": "Let me add.\n" + call(25, 17),
}


@pytest.fixture(scope="module", params=["chatml", "qwen2_5", "qwen3"])
def template(request):
    """(name, formatter): a tokenizer with the template's special tokens and its chat template."""
    tokenizer = build_tokenizer(CORPUS, vocab_size=320)  # ChatML: the tiny model's template
    if request.param != "chatml":
        tokenizer.add_tokens(["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>",
                              "</think>"])  # as in Qwen's tokenizers: added tokens, not special ones
        tokenizer.chat_template = (TEMPLATES / f"{request.param}.jinja").read_text()
    return request.param, ChatFormatter(tokenizer)


def scripted(formatter, answers: list[str], seen: list[tuple[list[int], list[int]]]):
    """The engine's script: the k-th prompt gets `answers[k]` and the turn's stop token; each
    (prompt, sampled) pair is recorded in `seen`."""
    def script(prompt_ids: list[int]) -> list[int]:
        sampled = formatter.encode(answers[min(len(seen), len(answers) - 1)]) + [formatter.end_of_turn_id]
        seen.append((list(prompt_ids), sampled))
        return sampled
    return script


def play(formatter, answers: list[str], agent, engine_cfg=None) -> tuple:
    seen: list = []
    stack = stack_for(formatter, scripted(formatter, answers, seen), engine_cfg=engine_cfg)

    async def go():
        async with session_of(stack) as (session, url):
            client = openai.AsyncOpenAI(base_url=url, api_key="x")
            replies = await agent(client)
            await client.close()
            return session, replies

    session, replies = run(go())
    return session, replies, seen


def assert_samples_are_what_the_engine_saw(session, seen) -> None:
    """Each call is one turn: its sample starts with the prompt the engine was given and what it
    sampled, its span is the sampled tokens, and a sample ends with its last call's; the loss
    mask is 1 on the spans only."""
    samples = session.traj.samples()
    assert len(session.traj.turns) == len(seen) == session.calls
    unmatched = list(seen)
    for turn in session.traj.turns:
        ids = samples[turn.sample].token_ids
        prompt, sampled = next(c for c in unmatched if ids[:turn.end] == c[0] + c[1] and turn.start == len(c[0]))
        assert turn.end == len(prompt) + len(sampled)
        unmatched.remove((prompt, sampled))
    for k, sample in enumerate(samples):
        spans = [(t.start, t.end) for t in session.traj.turns if t.sample == k]
        assert spans and spans[-1][1] == len(sample.token_ids) and len(spans) == sample.num_turns
        assert sample.loss_mask == [int(any(a <= i < b for a, b in spans)) for i in range(len(sample.token_ids))]
    assert len(session.segments) == len(samples)


def openai_agent(variant: str):
    """Three calls: the tool call, the tool's result, a follow-up question; the history sent back
    as the openai SDK returns it, or in smolagents' convention."""
    async def agent(client) -> list:
        messages = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "What is 25+17?"}]
        replies = []
        for _ in range(3):
            reply = (await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)).choices[0]
            replies.append(reply)
            message = reply.message
            if variant == "smolagents":  # memory.py ActionStep.to_messages, merged by get_clean_message_list
                calls = [{"id": c.id, "type": "function",
                          "function": {"name": c.function.name, "arguments": json.loads(c.function.arguments)}}
                         for c in message.tool_calls or []]
                text = (message.content or "").strip()
                if calls:
                    text = (text + "\n" if message.content is not None else "") + "Calling tools:\n" + str(calls)
                messages.append({"role": "assistant", "content": [{"type": "text", "text": text}]})
                results = [{"role": "user", "content": [{"type": "text", "text": "Observation:\n42"}]}] if calls else []
            elif variant == "client_normalised":
                content = (message.content or "").split("</think>")[-1]
                compact = lambda arguments: json.dumps(json.loads(arguments), separators=(",", ":"))  # noqa: E731
                calls = [{"id": f"own_{k}", "type": "function",
                          "function": {"name": c.function.name, "arguments": compact(c.function.arguments)}}
                         for k, c in enumerate(message.tool_calls or [])]
                messages.append({"role": "assistant", "content": f"  {content.strip()}\n",
                                 **({"tool_calls": calls} if calls else {})})
                results = [{"role": "tool", "tool_call_id": c["id"], "content": "42"} for c in calls]
            else:
                messages.append(message.model_dump(exclude_none=True))
                results = [{"role": "tool", "tool_call_id": c.id, "content": "42"} for c in message.tool_calls or []]
            messages += results or [{"role": "user", "content": "Thanks. And 42+1?"}]
        return replies
    return agent


@pytest.mark.parametrize("variant", list(FIRST))
def test_an_agent_that_sends_the_answers_back_its_own_way_stays_one_sample(template, variant):
    name, formatter = template
    think = THINK if name == "qwen3" else ""
    second = "The sum<|endoftext|> is 42." if variant == "dropped_special_token" else "The sum is 42."
    answers = [think + FIRST[variant], think + second, think + "Done."]
    session, replies, seen = play(formatter, answers, openai_agent(variant))

    assert replies[0].finish_reason == "tool_calls"
    assert len(replies[0].message.tool_calls) == (2 if variant == "parallel_calls_newline" else 1)
    if variant == "dropped_special_token":
        assert replies[1].message.content.endswith("The sum is 42.")  # the agent never sees the token
    metrics = session.metrics()
    assert (session.calls, len(session.segments), session.extended, session.forked) == (3, 1, 2, 0)
    assert metrics["agent_forked"] == 0 and not any(v for k, v in metrics.items() if k.startswith("agent_forked_"))
    assert_samples_are_what_the_engine_saw(session, seen)
    # each prompt continues the previous prompt and what was sampled for it, token for token
    for (prompt, sampled), (following, _) in zip(seen, seen[1:]):
        assert following[:len(prompt) + len(sampled)] == prompt + sampled


def test_the_clean_case_reuses_exactly_what_the_template_renders(template):
    """Where the template renders the history exactly as sampled (ChatML, Qwen2.5), reuse changes
    nothing: the history tokenized afresh is what the model saw. Qwen3's drops the earlier
    thinking once a new user turn comes: tokenized afresh it differs, reused it is one sample."""
    name, formatter = template
    think = THINK if name == "qwen3" else ""
    answers = [think + FIRST["clean"], think + "The sum is 42.", think + "Done."]
    session, _, _ = play(formatter, answers, openai_agent("clean"))
    assert session.forked == 0
    assert session.retokenize_mismatches == (1 if name == "qwen3" else 0)


def editing_agent(edit: str):
    """Two calls with the history kept, then a third on an edited history."""
    async def agent(client) -> list:
        messages = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "What is 25+17?"}]
        replies = []
        for _ in range(2):
            reply = (await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)).choices[0]
            replies.append(reply)
            messages.append(reply.message.model_dump(exclude_none=True))
            calls = reply.message.tool_calls or []
            messages += [{"role": "tool", "tool_call_id": c.id, "content": "42"} for c in calls]
        messages.append({"role": "user", "content": "Thanks. And 42+1?"})
        if edit == "dropped_exchange":  # the tool call and its result are dropped, the answer kept
            messages = messages[:2] + messages[4:]
        elif edit == "rewritten_answer":  # the model's last answer replaced by the agent's own words
            messages[4] = {"role": "assistant", "content": "42"}
        else:  # summarised: a fresh history
            messages = [messages[0], {"role": "user", "content": "25+17 is 42. And 42+1?"}]
        replies.append((await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)).choices[0])
        return replies
    return agent


@pytest.mark.parametrize(("edit", "reason"), [("dropped_exchange", "history_edited"), ("summarised", "history_edited"),
                                              ("rewritten_answer", "unknown_assistant_message")])
def test_an_agent_that_edits_its_history_forks_and_says_why(template, edit, reason):
    name, formatter = template
    think = THINK if name == "qwen3" else ""
    answers = [think + FIRST["clean"], think + "The sum is 42.", think + "43."]
    session, _, seen = play(formatter, answers, editing_agent(edit))
    metrics = session.metrics()
    assert (session.calls, len(session.segments), session.extended, session.forked) == (3, 2, 1, 1)
    assert metrics[f"agent_forked_{reason}"] == 1 and dict(session.fork_reasons) == {reason: 1}
    assert session.traj.segments == [session.segments[1].traj]
    assert_samples_are_what_the_engine_saw(session, seen)
    assert [t.sample for t in session.traj.turns] == [0, 0, 1]


def test_two_calls_in_flight_on_one_history_fork_as_concurrent(formatter):
    """The second of two concurrent calls continuing the same answer cannot extend the segment
    the first one holds: it forks, counted as concurrent."""
    import asyncio

    from roll_agent.config import ScriptedEngineConfig

    async def agent(client) -> list:
        messages = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "What is 25+17?"}]
        first = (await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)).choices[0]
        messages += [first.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": first.message.tool_calls[0].id, "content": "42"}]
        both = await asyncio.gather(*[client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
                                      for _ in range(2)])
        return [first, *both]

    session, _, seen = play(formatter, [FIRST["clean"], "The sum is 42."], agent, ScriptedEngineConfig(latency_s=0.2))
    assert (session.calls, len(session.segments), session.extended, session.forked) == (3, 2, 1, 1)
    assert dict(session.fork_reasons) == {"concurrent": 1}
    assert_samples_are_what_the_engine_saw(session, seen)
