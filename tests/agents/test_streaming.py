"""Streaming (`stream: true`) as the engine samples, and top_logprobs: the real `openai` SDK against
the real stack on the scripted engine. What a streamed client accumulates is the non-streamed
answer, the one the session records."""

import dataclasses
import json
import time

import openai
import pytest

from roll_agent.config import EngineConfig, EnvSpec, ModelConfig, RolloutConfig, ScriptedEngineConfig
from roll_agent.proxy.engines.openai import OpenAIEngine
from roll_agent.rollout.stack import build_rollout
from tests.agents.conftest import TOOL_CALL, TOOLS, session_of, stack_for
from tests.conftest import run

ASK = [{"role": "user", "content": "Say something."}]
TEXT = "left right up down. Answer with any text."  # 17 tokens of the test tokenizer


def continuing(formatter, text: str):
    """A script answering `text` (then the end of turn), that continues a re-issued request where it
    stopped: it returns the answer's tokens the prompt does not already end with."""
    answer = formatter.encode(text) + [formatter.end_of_turn_id]

    def script(prompt_ids: list[int]) -> list[int]:
        done = next(n for n in range(len(answer), -1, -1) if n == 0 or prompt_ids[-n:] == answer[:n])
        return answer[done:]
    return script


def answer_text(formatter, session) -> str:
    """The text of the session's last recorded answer (its sampled tokens)."""
    traj = session.segments[-1].traj
    turn = session.traj.turns[-1]
    return formatter.response_text(traj.token_ids[turn.start:turn.end])


def contents(chunks) -> list[str]:
    return [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]


def test_content_streams_while_the_engine_samples(formatter):
    stack = stack_for(formatter, continuing(formatter, TEXT), engine_cfg=ScriptedEngineConfig(token_latency_s=0.1))
    engine, ends = stack.proxy.engines[0], []
    generate = engine.generate

    async def timed(*args, **kwargs):
        out = await generate(*args, **kwargs)
        ends.append(time.monotonic())
        return out
    engine.generate = timed

    async def go():
        async with session_of(stack) as (session, url):
            client = openai.AsyncOpenAI(base_url=url, api_key="x")
            stream = await client.chat.completions.create(model="m", messages=ASK, stream=True, logprobs=True,
                                                          stream_options={"include_usage": True})
            arrivals = [(time.monotonic(), chunk) async for chunk in stream]
            await client.close()
            return arrivals, session

    arrivals, session = run(go())
    chunks = [chunk for _, chunk in arrivals]
    pieces = contents(chunks)
    assert "".join(pieces) == TEXT == answer_text(formatter, session)
    assert len(pieces) >= 10  # token by token, not one piece at the end
    first = next(t for t, c in arrivals if c.choices and c.choices[0].delta.content)
    assert first < ends[0] - 1.0  # ~1.7 s of sampling: the first words came at its start
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert not chunks[-1].choices and chunks[-1].usage.completion_tokens == len(formatter.encode(TEXT)) + 1
    assert len({c.id for c in chunks}) == 1
    # each shown token's log-prob, in order: the recorded ones but the end-of-turn token's
    entries = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    traj = session.traj
    assert [e.logprob for e in entries] == [lp for lp, m in zip(traj.logprobs, traj.loss_mask) if m][:-1]
    assert "".join(e.token for e in entries) == TEXT


def test_a_tool_call_streams_as_tool_call_deltas_that_accumulate_to_the_answer(formatter):
    stack = stack_for(formatter, continuing(formatter, "Let me add.\n" + TOOL_CALL),
                      engine_cfg=ScriptedEngineConfig(token_latency_s=0.002))

    async def go():
        async with session_of(stack) as (session, url):
            client = openai.AsyncOpenAI(base_url=url, api_key="x")
            whole = await client.chat.completions.create(model="m", messages=ASK, tools=TOOLS)
            async with client.chat.completions.stream(model="m", messages=ASK, tools=TOOLS) as stream:
                chunks = [event.chunk async for event in stream if event.type == "chunk"]
                streamed = await stream.get_final_completion()
            # the accumulated answer, sent back with the tool's result, continues its sample
            message = streamed.choices[0].message
            history = ASK + [{"role": "assistant", "content": message.content,
                              "tool_calls": [c.model_dump(exclude={"function": {"parsed_arguments"}})
                                             for c in message.tool_calls]},
                             {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "3"}]
            await client.chat.completions.create(model="m", messages=history, tools=TOOLS)
            await client.close()
            return whole, chunks, streamed, session

    whole, chunks, streamed, session = run(go())
    want, got = whole.choices[0], streamed.choices[0]
    assert got.message.content == want.message.content == "Let me add."
    assert got.finish_reason == want.finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in got.message.tool_calls] == \
        [(c.function.name, c.function.arguments) for c in want.message.tool_calls]
    assert json.loads(got.message.tool_calls[0].function.arguments) == {"a": 1, "b": 2}
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert not any("<" in (d.content or "") for d in deltas)  # no raw <tool_call> text as content
    calls = [d.tool_calls[0] for d in deltas if d.tool_calls]
    assert calls[0].id and calls[0].type == "function" and calls[0].function.name == "add"
    assert all(c.id is None and c.function.name is None for c in calls[1:])
    assert "".join(c.function.arguments for c in calls) == want.message.tool_calls[0].function.arguments
    first_call = next(i for i, d in enumerate(deltas) if d.tool_calls)
    assert all(not d.content for d in deltas[first_call:])  # the text before the call came first
    assert len(contents(chunks)) > 1  # and as it was sampled
    # the streamed answer's ids were recorded: the agent sending it back extended its sample
    assert session.extended == 1 and session.fork_reasons["unknown_assistant_message"] == 0


@pytest.mark.parametrize("stops", [["STOP"], ["STOPPED"], ["right STOP", "STOP"]])
def test_stop_strings_hold_back_what_may_begin_one(formatter, stops):
    """The agent never sees text past a stop string: the streamed text is the non-streamed answer."""
    text = "left right STOP up down"
    stack = stack_for(formatter, continuing(formatter, text), engine_cfg=ScriptedEngineConfig(token_latency_s=0.01))

    async def go():
        async with session_of(stack) as (_, url):
            client = openai.AsyncOpenAI(base_url=url, api_key="x")
            whole = await client.chat.completions.create(model="m", messages=ASK, stop=stops)
            stream = await client.chat.completions.create(model="m", messages=ASK, stop=stops, stream=True)
            chunks = [chunk async for chunk in stream]
            await client.close()
            return whole, chunks

    whole, chunks = run(go())
    assert "".join(contents(chunks)) == whole.choices[0].message.content == \
        {"STOP": "left right ", "STOPPED": text, "right STOP": "left "}[stops[0]]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason


def test_a_weight_update_mid_stream_neither_repeats_nor_drops_text(formatter):
    stack = stack_for(formatter, continuing(formatter, TEXT), engine_cfg=ScriptedEngineConfig(token_latency_s=0.05))

    async def go():
        async with session_of(stack) as (session, url):
            client = openai.AsyncOpenAI(base_url=url, api_key="x")
            stream = await client.chat.completions.create(model="m", messages=ASK, stream=True)
            pieces = []
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    pieces.append(chunk.choices[0].delta.content)
                    if len(pieces) == 3:  # the controller's update: suspend -> push -> resume
                        await stack.proxy.suspend()
                        await stack.proxy.push_weights(1)
                        await stack.proxy.resume()
            await client.close()
            return pieces, session

    pieces, session = run(go())
    assert "".join(pieces) == answer_text(formatter, session) == TEXT
    versions = [v for v, m in zip(session.traj.versions, session.traj.loss_mask) if m]
    assert versions[0] == 0 and versions[-1] == 1  # the answer spans the update
    assert stack.proxy.stats["reissues"] == 1


@pytest.mark.parametrize("whole_from", ["engine", "proxy"])
def test_an_answer_that_arrives_whole_still_streams_correctly(formatter, whole_from):
    """From an engine that does not stream, or a proxy in another process (Ray), which gets no token
    sink: the answer (multi-byte text here) is one content delta, then the finish reason."""
    text = "héllo wörld"
    stack = stack_for(formatter, continuing(formatter, text))
    if whole_from == "engine":
        engine = stack.proxy.engines[0]
        engine_generate = engine.generate
        engine.generate = lambda prompt_ids, sampling, request_id, on_tokens=None: engine_generate(
            prompt_ids, sampling, request_id)
    else:
        proxy_generate = stack.proxy.generate
        stack.proxy.generate = lambda request: proxy_generate(dataclasses.replace(request, on_tokens=None))

    async def go():
        async with session_of(stack) as (session, url):
            client = openai.AsyncOpenAI(base_url=url, api_key="x")
            stream = await client.chat.completions.create(model="m", messages=ASK, stream=True)
            chunks = [chunk async for chunk in stream]
            await client.close()
            return chunks, session

    chunks, session = run(go())
    assert contents(chunks) == [text] and answer_text(formatter, session) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


def test_an_episode_ending_mid_stream_is_an_error_event_and_nothing_is_recorded(formatter):
    stack = stack_for(formatter, continuing(formatter, TEXT), engine_cfg=ScriptedEngineConfig(token_latency_s=0.05))

    async def go():
        async with session_of(stack) as (session, url):
            client = openai.AsyncOpenAI(base_url=url, api_key="x")
            stream = await client.chat.completions.create(model="m", messages=ASK, stream=True)
            pieces = []
            with pytest.raises(openai.APIError, match="episode ended during this request"):
                async for chunk in stream:
                    pieces += contents([chunk])
                    if pieces:
                        stack.services.endpoint.close_session(session)  # a redundant episode cancelled
            await client.close()
            return pieces, session

    pieces, session = run(go())
    assert pieces and session.calls == 0 and not stack.proxy._inflight
    assert stack.services.endpoint.stats["ended"] == 1 and stack.services.endpoint.stats["errors"] == 0


def test_multibyte_text_streams_whole_characters(formatter):
    text = "héllo wörld"
    stack = stack_for(formatter, continuing(formatter, text), engine_cfg=ScriptedEngineConfig(token_latency_s=0.01))

    async def go():
        async with session_of(stack) as (_, url):
            client = openai.AsyncOpenAI(base_url=url, api_key="x")
            stream = await client.chat.completions.create(model="m", messages=ASK, stream=True)
            chunks = [chunk async for chunk in stream]
            await client.close()
            return chunks

    pieces = contents(run(go()))
    assert "".join(pieces) == text and len(pieces) > 1
    assert not any("\ufffd" in piece for piece in pieces)


def test_top_logprobs_give_k_alternatives_per_token_streamed_or_not(formatter):
    stack = stack_for(formatter, continuing(formatter, TEXT), engine_cfg=ScriptedEngineConfig(token_latency_s=0.005))

    async def go():
        async with session_of(stack) as (_, url):
            client = openai.AsyncOpenAI(base_url=url, api_key="x")
            whole = await client.chat.completions.create(model="m", messages=ASK, logprobs=True, top_logprobs=3)
            stream = await client.chat.completions.create(model="m", messages=ASK, logprobs=True, top_logprobs=3,
                                                          stream=True)
            chunks = [chunk async for chunk in stream]
            await client.close()
            return whole, chunks

    whole, chunks = run(go())
    entries = whole.choices[0].logprobs.content
    assert "".join(e.token for e in entries) == TEXT
    for entry in entries:
        assert len(entry.top_logprobs) == 3
        assert [a.logprob for a in entry.top_logprobs] == sorted((a.logprob for a in entry.top_logprobs), reverse=True)
        assert all(a.logprob == entry.logprob for a in entry.top_logprobs if a.token == entry.token)
        assert any(a.token == entry.token for a in entry.top_logprobs)  # the scripted engine samples its likeliest
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in entries]


def test_completions_logprobs_k_give_legacy_top_logprobs_and_stream(formatter):
    stack = stack_for(formatter, continuing(formatter, TEXT), engine_cfg=ScriptedEngineConfig(token_latency_s=0.005))

    async def go():
        async with session_of(stack) as (_, url):
            client = openai.AsyncOpenAI(base_url=url, api_key="x")
            whole = await client.completions.create(model="m", prompt="hello", max_tokens=64, logprobs=2)
            stream = await client.completions.create(model="m", prompt="hello", max_tokens=64, logprobs=2,
                                                     stream=True, echo=True)
            chunks = [chunk async for chunk in stream]
            await client.close()
            return whole, chunks

    whole, chunks = run(go())
    choice = whole.choices[0]
    assert choice.text == TEXT
    top = choice.logprobs.top_logprobs
    assert top is not None and len(top) == len(choice.logprobs.tokens)
    assert all(len(alternatives) == 2 and alternatives[token] == logprob for alternatives, token, logprob
               in zip(top, choice.logprobs.tokens, choice.logprobs.token_logprobs))
    texts = [c.choices[0].text for c in chunks]
    assert texts[0] == "hello" and "".join(texts[1:]) == TEXT and len(texts) > 3
    streamed_top = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.top_logprobs]
    assert streamed_top == top
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_an_engine_that_cannot_give_top_logprobs_is_a_400_naming_them(formatter, tiny_model_dir):
    engine = OpenAIEngine(tiny_model_dir, EngineConfig(type="openai"), ModelConfig())  # no server needed: it refuses
    rollout = RolloutConfig(max_new_tokens=16, max_context_tokens=1024)
    stack = build_rollout(formatter, rollout, [EnvSpec()], [engine])

    async def go():
        async with session_of(stack) as (session, url):
            client = openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0)
            errors = []
            for stream in (False, True):
                with pytest.raises(openai.BadRequestError) as caught:
                    await client.chat.completions.create(model="m", messages=ASK, logprobs=True, top_logprobs=3,
                                                         stream=stream)
                errors.append(caught.value)
            with pytest.raises(openai.BadRequestError) as caught:
                await client.chat.completions.create(model="m", messages=ASK, top_logprobs=3)
            errors.append(caught.value)
            await client.close()
            return errors, session

    errors, session = run(go())
    for error in errors[:2]:
        assert error.body["param"] == "top_logprobs" and "engine.type=openai" in error.body["message"]
    assert errors[2].body["param"] == "top_logprobs" and "logprobs: true" in errors[2].body["message"]
    assert session.calls == 0  # nothing of a refused request is recorded
