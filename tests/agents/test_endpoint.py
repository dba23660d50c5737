"""The OpenAI-compatible endpoint, driven by the real `openai` SDK and raw HTTP: tool calls,
streaming, token-exact sessions (extend vs fork), and bad input that gets a clear error while
the server goes on."""

import asyncio
import json

import httpx
import openai
import pytest

from roll_agent.config import ScriptedEngineConfig
from tests.agents.conftest import TOOLS, answering, session_of, stack_for, tool_then_answer
from tests.conftest import run

SEEN: list[list[int]] = []  # the prompts the engine was given, in order


def recording(formatter, answer):
    script = answering(formatter, answer)

    def record(prompt_ids):
        SEEN.append(list(prompt_ids))
        return script(prompt_ids)
    return record


def assert_segments_are_what_the_engine_saw(session):
    """Every segment's tokens are one of the engine's prompts followed by the answer it sampled."""
    for segment in session.segments:
        ids = segment.traj.token_ids
        prompt = next(p for p in reversed(SEEN) if ids[:len(p)] == p and len(p) < len(ids))
        answer = ids[len(prompt):]
        assert segment.traj.loss_mask[len(prompt):] == [1] * len(answer)
        assert all(v >= 0 for v in segment.traj.versions[len(prompt):])


def test_openai_sdk_chat_with_a_tool_round_trip_and_streaming(formatter):
    SEEN.clear()
    stack = stack_for(formatter, recording(formatter, tool_then_answer))

    async def go():
        async with session_of(stack) as (session, url):
            client = openai.AsyncOpenAI(base_url=url, api_key="not-needed-the-url-names-the-session")
            models = await client.models.list()
            messages = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "What is 1+2?"}]
            first = await client.chat.completions.create(model="any", messages=messages, tools=TOOLS, logprobs=True)
            call = first.choices[0].message.tool_calls[0]
            messages += [first.choices[0].message.model_dump(exclude_none=True),
                         {"role": "tool", "tool_call_id": call.id, "content": "3"}]
            stream = await client.chat.completions.create(model="any", messages=messages, tools=TOOLS, stream=True,
                                                          stream_options={"include_usage": True})
            chunks = [chunk async for chunk in stream]
            await client.close()
            return models, first, chunks, session

    models, first, chunks, session = run(go())
    assert [m.id for m in models.data] == ["roll_agent"]
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls[0].function.name == "add"
    assert json.loads(choice.message.tool_calls[0].function.arguments) == {"a": 1, "b": 2}
    assert len(choice.logprobs.content) == first.usage.completion_tokens - 1  # the stop token is not shown
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "The sum is 3."
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage.completion_tokens > 0 and not chunks[-1].choices
    # the tool result extended the first call's segment: one sample, exactly what the engine saw
    assert (session.calls, len(session.segments), session.extended, session.forked) == (2, 1, 1, 0)
    assert session.segments[0].traj.token_ids[:len(SEEN[-1])] == SEEN[-1]
    assert_segments_are_what_the_engine_saw(session)


def test_a_history_editing_agent_forks_and_every_segment_is_what_the_model_saw(formatter):
    SEEN.clear()
    stack = stack_for(formatter, recording(formatter, lambda text: f"answer {text.count('<|im_start|>')}"))

    async def go():
        async with session_of(stack) as (session, url):
            client = openai.AsyncOpenAI(base_url=url, api_key="x")
            history = [{"role": "user", "content": "first question"}]
            for question in ("second question", "third question"):
                reply = await client.chat.completions.create(model="m", messages=history)
                history += [{"role": "assistant", "content": reply.choices[0].message.content},
                            {"role": "user", "content": question}]
            # the agent summarises: the first exchange is dropped
            edited = history[2:]
            await client.chat.completions.create(model="m", messages=edited)
            await client.close()
            return session

    session = run(go())
    assert session.calls == 3 and session.extended == 1 and session.forked == 1
    assert len(session.segments) == 2 and session.traj.segments == [session.segments[1].traj]
    assert_segments_are_what_the_engine_saw(session)
    # each segment ends exactly as the engine's last prompt on it plus the answer sampled for it
    first, second = (s.traj.token_ids for s in session.segments)
    assert first[:len(SEEN[1])] == SEEN[1] and second[:len(SEEN[2])] == SEEN[2]
    assert session.retokenize_mismatches == 0
    # each call is a turn of the episode, in order, on the sample it extended or forked
    turns = session.traj.turns
    assert [t.sample for t in turns] == [0, 0, 1]
    for k, sample in enumerate(session.traj.samples()):
        spans = [(t.start, t.end) for t in turns if t.sample == k]
        mask = sample.loss_mask
        assert all(set(mask[a:b]) == {1} for a, b in spans) and sum(b - a for a, b in spans) == sum(mask)
    assert len({t.state_key for t in turns}) == 3  # three different prompts


def test_the_session_key_as_api_key_and_errors_for_unknown_or_missing_keys(formatter):
    stack = stack_for(formatter, answering(formatter, lambda _: "hi"))

    async def go():
        async with session_of(stack) as (session, _):
            base = stack.services.endpoint.base_url
            ok = openai.AsyncOpenAI(base_url=base, api_key=session.key)
            reply = await ok.chat.completions.create(model="m", messages=[{"role": "user", "content": "hello"}])
            wrong = openai.AsyncOpenAI(base_url=base, api_key="ra-no-such-session")
            with pytest.raises(openai.NotFoundError, match="Unknown session"):
                await wrong.chat.completions.create(model="m", messages=[{"role": "user", "content": "hello"}])
            async with httpx.AsyncClient() as raw:
                missing = await raw.post(f"{base}/chat/completions", json={"messages": []})
            await ok.close()
            await wrong.close()
            return reply, missing

    reply, missing = run(go())
    assert reply.choices[0].message.content == "hi"
    assert missing.status_code == 401 and "session key" in missing.json()["error"]["message"]


def test_bad_requests_get_openai_errors_and_the_server_goes_on(formatter):
    stack = stack_for(formatter, answering(formatter, lambda _: "fine"))

    async def go():
        async with session_of(stack) as (session, url):
            async with httpx.AsyncClient(timeout=30) as raw:
                post = lambda body, **kw: raw.post(f"{url}/chat/completions", **kw)  # noqa: E731
                answers = {
                    "malformed": await post(None, content=b'{"messages": [', headers={"content-type": "application/json"}),
                    "wrong type": await raw.post(f"{url}/chat/completions", json={
                        "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}),
                    "bad role": await raw.post(f"{url}/chat/completions", json={
                        "messages": [{"role": "wizard", "content": "x"}]}),
                    "no messages": await raw.post(f"{url}/chat/completions", json={"messages": []}),
                    "10 MB": await raw.post(f"{url}/chat/completions", json={
                        "messages": [{"role": "user", "content": "x" * (10 * 2**20)}]}),
                    "unknown fields ignored": await raw.post(f"{url}/chat/completions", json={
                        "messages": [{"role": "user", "content": "x"}], "user": "me", "store": False,
                        "metadata": {"a": "b"}}),
                }
                after = await raw.post(f"{url}/chat/completions", json={"messages": [{"role": "user", "content": "y"}]})
            return answers, after, session

    answers, after, session = run(go())
    assert answers["malformed"].status_code == 400
    assert "not valid JSON" in answers["malformed"].json()["error"]["message"]
    wrong = answers["wrong type"].json()["error"]
    assert answers["wrong type"].status_code == 400 and wrong["param"] == "temperature"
    assert answers["bad role"].status_code == 400 and "messages.0.role" in answers["bad role"].json()["error"]["param"]
    assert answers["no messages"].status_code == 400
    assert answers["10 MB"].status_code == 413 and "max_request_mb" in answers["10 MB"].json()["error"]["message"]
    assert answers["unknown fields ignored"].status_code == 200
    assert after.status_code == 200 and after.json()["choices"][0]["message"]["content"] == "fine"
    assert session.calls == 2  # only the two good requests were recorded


def test_a_client_that_goes_away_has_its_request_aborted(formatter):
    slow = ScriptedEngineConfig(latency_s=30.0)
    stack = stack_for(formatter, answering(formatter, lambda _: "late"), engine_cfg=slow)

    async def go():
        async with session_of(stack) as (session, url):
            async with httpx.AsyncClient(timeout=0.5) as raw:
                with pytest.raises(httpx.ReadTimeout):
                    await raw.post(f"{url}/chat/completions", json={
                        "messages": [{"role": "user", "content": "x"}], "stream": True})
            for _ in range(200):  # the server notices the disconnect and aborts the engine's request
                if stack.proxy.engines[0].aborted_ids:
                    break
                await asyncio.sleep(0.05)
            return stack.proxy.engines[0].aborted_ids, session, len(stack.proxy._inflight)

    aborted, session, inflight = run(go())
    assert aborted and inflight == 0
    assert session.calls == 0 and not session.segments[0:]  # nothing of the abandoned call is recorded


def test_completions_with_text_and_token_prompts_and_503_while_shutting_down(formatter):
    SEEN.clear()
    stack = stack_for(formatter, recording(formatter, lambda _: " world"))

    async def go():
        async with session_of(stack) as (session, url):
            client = openai.AsyncOpenAI(base_url=url, api_key="x")
            text = await client.completions.create(model="m", prompt="hello", max_tokens=16, logprobs=1)
            ids = session.segments[0].traj.token_ids + formatter.encode(" again")
            more = await client.completions.create(model="m", prompt=ids, max_tokens=16)
            await stack.services.endpoint.close()  # shutting down: new requests are refused, not dropped
            async with httpx.AsyncClient() as raw:
                try:
                    late = await raw.post(f"{url}/completions", json={"prompt": "x"})
                except httpx.HTTPError as exc:  # the server may already be gone
                    late = exc
            await client.close()
            return text, more, session, late

    text, more, session, late = run(go())
    assert text.choices[0].text == " world" and len(text.choices[0].logprobs.tokens) > 0
    assert more.choices[0].text == " world"
    # the token-id prompt started with the first call's tokens: one segment, extended
    assert (session.calls, len(session.segments), session.extended) == (2, 1, 1)
    assert session.segments[0].traj.token_ids[:len(SEEN[-1])] == SEEN[-1]
    if isinstance(late, httpx.Response):
        assert late.status_code == 503 and "shutting down" in late.json()["error"]["message"]


def test_an_unexpected_failure_is_a_json_500_and_the_connection_stays_usable(formatter):
    """A user's tool parser that raises: the request gets an OpenAI-style 500 naming the error
    (not uvicorn's plain-text page), and the next request on the same connection is answered."""
    from roll_agent.config import EndpointConfig

    endpoint = EndpointConfig(tool_parser="tests.agents.agents_for_tests:broken_tool_parser")
    stack = stack_for(formatter, answering(formatter, lambda _: "fine"), endpoint=endpoint)

    async def go():
        async with session_of(stack) as (session, url):
            async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=1)) as raw:
                body = {"messages": [{"role": "user", "content": "x"}]}
                failed = await raw.post(f"{url}/chat/completions", json={**body, "tools": TOOLS})
                after = await raw.post(f"{url}/chat/completions", json=body)  # no tools: no parser
            return failed, after

    failed, after = run(go())
    assert failed.status_code == 500
    error = failed.json()["error"]
    assert error["type"] == "server_error" and "KeyError" in error["message"]
    assert after.status_code == 200 and after.json()["choices"][0]["message"]["content"] == "fine"
