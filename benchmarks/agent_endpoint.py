"""The agent endpoint's cost, side by side in one run, on the scripted engine.

1. Latency per call: N sequential chat calls through the endpoint over loopback, on the same
   event loop as the server, against N calls of `LLMProxy.generate` with the same prompt tokens,
   the three alternating. The difference of the medians (and of the 99th percentiles) is what
   the endpoint adds per call: chat-template rendering, the session's token bookkeeping, JSON and
   HTTP. Two clients, both kept alive: a minimal HTTP/1.1 client (JSON-encodes the body, writes
   the request, reads the status line, headers and body: the headline, what the endpoint itself
   adds) and httpx (the openai SDK's transport, whose own per-request work, ~2 ms here, an SDK
   agent pays against any server; the SDK's own request building comes on top of both).
2. Throughput: `--sessions` (default 256) concurrent agent episodes through the endpoint (a
   three-call agent written with the openai SDK: each call sends its history plus one new user
   turn) against the same three-turn task played as a native env (roll_agent/Simulated-v0: three
   observations, three answers), both by the real GroupScheduler in groups of 8, batches taken
   as soon as they are ready. Episodes/s at zero model latency (pure overhead, the worst case
   for the endpoint), at `--model-latency-s` per call (sleeping, no CPU), and with the default
   run's real model: the tiny Qwen2 (random weights) on the hf engine, which uses the CPU the
   agents' HTTP work also needs (the headline: what a user's run on this machine gets).
3. Token reuse: the share of calls that extend their episode's sample (instead of forking a new
   one) for agents that send the model's answers back their own way: a smolagents-style agent
   (tool calls written back as assistant text "Calling tools: [...]", results as user
   "Observation: ...") and an openai-SDK agent whose model writes text before its tool calls,
   beside the plain three-turn agent; `--reuse-episodes` sessions each, on the scripted engine.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/agent_endpoint.py [--calls 500 --sessions 256 --batches 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import build_stack, consume, make_formatter, result_line, sim_spec, table  # noqa: E402
from roll_agent.config import EndpointConfig, EnvSpec, RolloutConfig, ScriptedEngineConfig  # noqa: E402
from roll_agent.agents.workers import default_agent_workers  # noqa: E402
from roll_agent.types import GenerateRequest, SamplingParams, Trajectory  # noqa: E402

TURNS = 3


async def three_turn_agent(task: dict, client) -> float:
    """The agent arm's agent: three calls, the history growing by one answer and one user turn each."""
    messages = [{"role": "system", "content": "Answer with any text. This env is simulated."},
                {"role": "user", "content": f"task {task['id']} step 0"}]
    for step in range(1, TURNS + 1):
        reply = await client.chat.completions.create(model="m", messages=messages)
        messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                     {"role": "user", "content": f"task {task['id']} step {step}"}]
    return 1.0


TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]
TOOL_ANSWER = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a":1,"b":2}}\n</tool_call>'


async def text_before_tool_call_agent(task: dict, client) -> float:
    """An openai-SDK tool loop; the model writes a sentence before each tool call."""
    messages = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": f"task {task['id']}"}]
    for _ in range(TURNS):
        message = (await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)).choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        messages += [{"role": "tool", "tool_call_id": c.id, "content": "3"} for c in message.tool_calls]
    return 1.0


async def smolagents_style_agent(task: dict, client) -> float:
    """smolagents' ToolCallingAgent memory: the model's text, then its tool calls written back as
    assistant text, the results as a user "Observation:" (memory.py ActionStep.to_messages, roles
    merged by get_clean_message_list)."""
    messages = [{"role": "system", "content": "You add numbers."},
                {"role": "user", "content": f"New task:\n{task['id']}"}]
    for _ in range(TURNS):
        message = (await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)).choices[0].message
        calls = [{"id": c.id, "type": "function", "function": {"name": c.function.name,
                                                                "arguments": json.loads(c.function.arguments)}}
                 for c in message.tool_calls or []]
        text = (message.content or "").strip()
        if calls:
            text = (text + "\n" if message.content is not None else "") + "Calling tools:\n" + str(calls)
        messages.append({"role": "assistant", "content": [{"type": "text", "text": text}]})
        if not calls:
            break
        messages.append({"role": "user", "content": [{"type": "text", "text": "Observation:\n3"}]})
    return 1.0


async def token_reuse(formatter, agent, episodes: int) -> dict:
    """`episodes` concurrent sessions of `agent` against a model that calls the tool until it has
    TURNS - 1 results, then answers: how many of their calls extended their sample."""
    def script(prompt_ids: list[int]) -> list[int]:
        text = formatter.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        results = text.count("<tool_response>") + text.count("Observation:")
        answer = TOOL_ANSWER if results < TURNS - 1 else "The sum is 3."
        return formatter.encode(answer) + [formatter.end_of_turn_id]

    import openai

    from roll_agent.proxy.engines.scripted import ScriptedEngine
    from roll_agent.rollout.stack import build_rollout

    rollout = RolloutConfig(max_new_tokens=256, max_context_tokens=4096, max_turns=TURNS + 1)
    stack = build_rollout(formatter, rollout, [sim_spec()], [ScriptedEngine(ScriptedEngineConfig(), script=script)])
    try:
        await stack.services.endpoint.start()
        sessions = [stack.services.endpoint.open_session(f"reuse-{i}", Trajectory()) for i in range(episodes)]
        clients = [openai.AsyncOpenAI(base_url=stack.services.endpoint.session_url(s), api_key="x") for s in sessions]
        await asyncio.gather(*[agent({"id": i}, c) for i, c in enumerate(clients)])
        await asyncio.gather(*[c.close() for c in clients])
        total = lambda key: sum(s.metrics()[key] for s in sessions)  # noqa: E731
        calls = total("agent_calls")
        return {"extend_share": total("agent_extended") / calls, "fork_share": total("agent_forked") / calls,
                "segments_per_episode": total("agent_segments") / episodes,
                "retokenize_mismatch_share": total("agent_retokenize_mismatches") / calls}
    finally:
        await stack.close()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class MinimalClient:
    """Kept-alive HTTP/1.1 over one asyncio stream: POST a JSON body, read a Content-Length answer."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str):
        self.reader, self.writer, self.host = reader, writer, host

    @classmethod
    async def connect(cls, host: str, port: int) -> "MinimalClient":
        return cls(*await asyncio.open_connection(host, port), host)

    async def post(self, path: str, body: dict) -> tuple[int, bytes]:
        data = json.dumps(body).encode()
        self.writer.write(f"POST {path} HTTP/1.1\r\nhost: {self.host}\r\ncontent-type: application/json\r\n"
                          f"content-length: {len(data)}\r\n\r\n".encode() + data)
        head = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in head[1:] if line)
        return int(head[0].split()[1]), await self.reader.readexactly(int(headers["content-length"]))

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


async def latency(formatter, calls: int) -> dict:
    import httpx

    warmup = 20  # iterations left out of the figures
    # two endpoint calls an iteration, all in one session
    rollout = RolloutConfig(max_new_tokens=4, max_context_tokens=4096, max_turns=2 * (calls + warmup) + 10)
    stack = build_stack(formatter, rollout, [sim_spec()], ScriptedEngineConfig(response_tokens=4), num_engines=1)
    try:
        await stack.services.endpoint.start()
        session = stack.services.endpoint.open_session("bench", Trajectory())
        url = stack.services.endpoint.session_url(session) + "/chat/completions"
        body = {"model": "m", "messages": [{"role": "system", "content": "Answer with any text."},
                                           {"role": "user", "content": "task 1 step 0"}]}
        text = formatter.tokenizer.apply_chat_template(body["messages"], tokenize=False, add_generation_prompt=True)
        ids = formatter.encode(text)
        sampling = SamplingParams(max_new_tokens=4, stop_token_ids=formatter.stop_token_ids)
        direct, minimal, through_httpx = [], [], []
        raw = await MinimalClient.connect(stack.services.endpoint.cfg.host, stack.services.endpoint.port)
        path = urlsplit(url).path
        async with httpx.AsyncClient() as client:
            for i in range(calls + warmup):  # the three alternate
                t0 = time.perf_counter()
                await stack.proxy.generate(GenerateRequest(list(ids), sampling, "bench-direct"))
                t1 = time.perf_counter()
                status, text = await raw.post(path, body)
                t2 = time.perf_counter()
                answer = await client.post(url, json=body)
                t3 = time.perf_counter()
                assert status == 200, text
                assert answer.status_code == 200, answer.text
                if i >= warmup:
                    direct.append(t1 - t0)
                    minimal.append(t2 - t1)
                    through_httpx.append(t3 - t2)
        await raw.close()
        ms = {name: (1e3 * statistics.median(values), 1e3 * percentile(values, 0.99))
              for name, values in (("direct", direct), ("endpoint", minimal), ("endpoint_httpx", through_httpx))}
        return {**{f"{name}_p{q}_ms": v for name, pair in ms.items() for q, v in zip((50, 99), pair)},
                "server_p50_ms": 1e3 * statistics.median(stack.services.endpoint.latency_s[2 * warmup:])}
    finally:
        await stack.close()


def tiny_model(out: Path):
    """The default run's model architecture (random weights) with the benchmark's tokenizer."""
    from roll_agent.config import TinyModelConfig
    from roll_agent.tiny_model import build_tiny_model

    corpus = lambda: ["Answer with any text. This env is simulated.", "task 123456 step 7", "left right up down"] * 20  # noqa: E731
    return build_tiny_model(out, TinyModelConfig(), corpus)


async def throughput(formatter, arm: str, sessions: int, batches: int, latency_s: float, tasks: Path,
                     model: Path | None = None, agent_workers: int | None = None) -> dict:
    """`agent_workers`: endpoint.agent_workers for the agent arm (None: the default)."""
    groups = sessions // 8
    rollout = RolloutConfig(async_ratio=2, num_env_groups=groups, groups_per_batch=groups, group_size=8,
                            group_size_redundancy=0, max_turns=TURNS, max_new_tokens=8 if model else 4,
                            max_context_tokens=2048, prepare_next_reset=False)
    if arm == "native":
        spec = sim_spec(latency="none", episode_len=TURNS)
    else:
        spec = EnvSpec(id="roll_agent/Agent-v0", kwargs={"agent": "benchmarks.agent_endpoint:three_turn_agent",
                                                         "tasks": str(tasks), "timeout_s": 600})
    endpoint = EndpointConfig(agent_workers=agent_workers)
    if model is not None:
        from roll_agent.config import EngineConfig, ModelConfig, ProxyConfig
        from roll_agent.proxy.engines import make_engines
        from roll_agent.rollout.stack import build_rollout

        engines = make_engines(EngineConfig(type="hf"), ModelConfig(), str(model))
        stack = build_rollout(formatter, rollout, [spec], engines, ProxyConfig(), endpoint_cfg=endpoint)
    else:
        stack = build_stack(formatter, rollout, [spec], ScriptedEngineConfig(response_tokens=4, latency_s=latency_s),
                            endpoint=endpoint)
    episodes = []
    seconds, fills = await consume(stack, batches + 1, lambda v, batch: episodes.append(
        sum(len(g.trajectories) for g in batch)))
    steady = seconds - fills[0]  # the first batch builds the envs (and starts the endpoint): apart
    return {"episodes_per_s": sum(episodes[1:]) / steady, "episodes": sum(episodes[1:]), "seconds": steady,
            "errors": stack.services.endpoint.stats["errors"], "error_codes": dict(stack.services.endpoint.error_codes)}


async def main(args) -> None:
    formatter = make_formatter()
    lat = await latency(formatter, args.calls)
    print(table([("LLMProxy.generate", lat["direct_p50_ms"], lat["direct_p99_ms"]),
                 ("endpoint, minimal HTTP client", lat["endpoint_p50_ms"], lat["endpoint_p99_ms"]),
                 ("endpoint, httpx client", lat["endpoint_httpx_p50_ms"], lat["endpoint_httpx_p99_ms"])],
                ("per call", "p50 ms", "p99 ms")))
    added = {f"{key}{client}": lat[f"endpoint{client}_{key}_ms"] - lat[f"direct_{key}_ms"]
             for key in ("p50", "p99") for client in ("", "_httpx")}
    print(f"added by the endpoint: p50 {added['p50']:.2f} ms, p99 {added['p99']:.2f} ms "
          f"(server side alone, p50: {lat['server_p50_ms']:.2f} ms; target p50 <= 2 ms); with httpx as the "
          f"client: p50 {added['p50_httpx']:.2f} ms, p99 {added['p99_httpx']:.2f} ms\n", flush=True)
    reuse = {name: await token_reuse(formatter, agent, args.reuse_episodes) for name, agent in (
        ("plain three-turn agent", three_turn_agent), ("text before tool call", text_before_tool_call_agent),
        ("smolagents-style", smolagents_style_agent))}
    print(table([(name, r["extend_share"], r["fork_share"], r["segments_per_episode"], r["retokenize_mismatch_share"])
                 for name, r in reuse.items()],
                ("agent", "extend share", "fork share", "samples/episode", "re-tokenized differs")) + "\n", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        tasks = Path(tmp) / "tasks.jsonl"
        tasks.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(1000)))
        rows, ratios = [], {}
        model = tiny_model(Path(tmp) / "model")
        from roll_agent.rollout.chat import ChatFormatter
        from transformers import AutoTokenizer

        arms = [("tiny model (hf)", 0.0, model), ("scripted, 0 ms", 0.0, None),
                (f"scripted, {args.model_latency_s * 1e3:.0f} ms", args.model_latency_s, None)]
        for name, latency_s, path in arms:
            fmt = ChatFormatter(AutoTokenizer.from_pretrained(path)) if path else formatter
            native = await throughput(fmt, "native", args.sessions, args.batches, latency_s, tasks, path)
            agent = await throughput(fmt, "agent", args.sessions, args.batches, latency_s, tasks, path)
            ratios[name] = agent["episodes_per_s"] / native["episodes_per_s"]
            rows += [(f"native env, {name}", native["episodes_per_s"], native["episodes"], 0),
                     (f"agent via endpoint, {name}", agent["episodes_per_s"], agent["episodes"], agent["errors"])]
            print(f"{args.sessions} sessions, {name}: agent/native {ratios[name]:.2f}x", flush=True)
            if path is not None:  # the same with the agents in this process (endpoint.agent_workers=0)
                here = await throughput(fmt, "agent", args.sessions, args.batches, latency_s, tasks, path, 0)
                ratios["in process"] = here["episodes_per_s"] / native["episodes_per_s"]
                rows.append((f"agent via endpoint, {name}, agents in this process", here["episodes_per_s"],
                             here["episodes"], here["errors"]))
                print(f"{args.sessions} sessions, {name}, agents in this process: agent/native "
                      f"{ratios['in process']:.2f}x", flush=True)
    print(table(rows, ("arm", "episodes/s", "episodes", "endpoint errors")))
    names = [name for name, _, _ in arms]
    print(result_line(agent_vs_native=ratios[names[0]], added_p50_ms=added["p50"], added_p99_ms=added["p99"],
                      added_p50_ms_httpx=added["p50_httpx"], added_p99_ms_httpx=added["p99_httpx"],
                      server_p50_ms=lat["server_p50_ms"], sessions=args.sessions,
                      agent_vs_native_in_process=ratios["in process"], agent_workers=default_agent_workers(None),
                      agent_vs_native_scripted=ratios[names[1]], agent_vs_native_scripted_latency=ratios[names[2]],
                      model_latency_ms=args.model_latency_s * 1e3,
                      extend_share_text_before_tool_call=reuse["text before tool call"]["extend_share"],
                      extend_share_smolagents=reuse["smolagents-style"]["extend_share"],
                      fork_share_text_before_tool_call=reuse["text before tool call"]["fork_share"],
                      fork_share_smolagents=reuse["smolagents-style"]["fork_share"]))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--sessions", type=int, default=256)
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--model-latency-s", type=float, default=0.05)
    parser.add_argument("--reuse-episodes", type=int, default=32)
    asyncio.run(main(parser.parse_args()))
