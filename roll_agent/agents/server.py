"""The OpenAI-compatible endpoint in front of the LLMProxy: roll_agent serves, the agent calls.

Starlette routes served by uvicorn on loopback, on the rollout's own event loop (the proxy is
an asyncio object there). Each agent episode is a `Session` with its own key, reached either
by its base URL `http://127.0.0.1:PORT/s/<key>/v1` or by the key as its API key on the plain
`/v1` base URL; every call of the session is recorded in order (roll_agent/agents/sessions.py).

    POST /v1/chat/completions   messages, tools, tool_choice, max_tokens / max_completion_tokens,
                                stop, logprobs, top_logprobs, stream (SSE, with a final usage chunk when asked)
    POST /v1/completions        a text or token-id prompt, logprobs (k alternatives), echo, stream
    GET  /v1/models

Streaming sends the answer as the engine samples it, through the proxy's token sink
(`GenerateRequest.on_tokens`; roll_agent/agents/streaming.py): content deltas as the text is
decided, tool calls as OpenAI tool-call deltas, then the finish reason and the usage, sent once
the session has recorded the answer. What the client accumulates is the non-streamed answer.

Sampling: a training episode samples at the rollout's temperature / top_p whatever the agent
asks (RL needs the policy's own distribution; `endpoint.honor_sampling` passes the agent's
temperature and top_p through instead), an evaluation episode greedily. Stop strings cut the
answer the agent sees; the tokens sampled past them stay recorded (the model saw them).

A weight update is invisible to agents: the proxy re-issues a request suspended mid-answer, so
it returns later with per-token versions showing the switch. Errors are OpenAI-style JSON:
400 for a malformed request or one the engine cannot serve (the field named), 401 without a
key, 404 for an unknown or ended session, 413 for a body over `endpoint.max_request_mb`, 503
while shutting down. A client that goes away has its request aborted in the engine.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections import Counter

from roll_agent.agents import openai_api as api
from roll_agent.agents.sessions import Call, Session
from roll_agent.agents.streaming import ChatStream, CompletionStream, Decoding, stop_decided
from roll_agent.agents.workers import AgentWorkers, default_agent_workers
from roll_agent.config import EndpointConfig, RolloutConfig
from roll_agent.protocols import Unsupported
from roll_agent.registry import TOOL_PARSERS
from roll_agent.types import GenerateRequest, GenerateResult, SamplingParams, TokenSink, Trajectory

log = logging.getLogger(__name__)


class AgentEndpoint:
    def __init__(self, proxy, formatter, rollout: RolloutConfig, cfg: EndpointConfig | None = None):
        self.proxy = proxy
        self.formatter = formatter
        self.tokenizer = formatter.tokenizer
        self.rollout = rollout
        self.cfg = cfg or EndpointConfig()
        self.parse_tools = TOOL_PARSERS.get(self.cfg.tool_parser)
        self.vocab_size = len(self.tokenizer)  # token ids an agent may send: [0, vocab_size)
        self.sessions: dict[str, Session] = {}
        self._ended: dict[str, None] = {}  # keys of sessions closed lately, oldest first
        self.port = 0
        self.stats = {"requests": 0, "errors": 0, "ended": 0}
        self.error_codes: Counter = Counter()  # errors answered, by code
        self.http_errors: Counter = Counter()  # errors answered, by class: agent_http_4xx, agent_http_5xx
        self._logged_reasons: set[tuple] = set()  # (status, code): each logged once as a warning
        self.latency_s: list[float] = []  # the endpoint's own time per answered call, outside the proxy
        self._server = None
        self._serving: asyncio.Task | None = None
        self._starting: asyncio.Lock | None = None
        self._closing = False
        n = default_agent_workers(self.cfg.agent_workers)
        self.workers = AgentWorkers(n) if n else None  # processes start on the first run

    # ---- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Serve on `endpoint.host:endpoint.port` (port 0: a free one), once; safe to call again."""
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._server is not None:
                return
            import uvicorn

            config = uvicorn.Config(self.app(), host=self.cfg.host, port=self.cfg.port, log_level="warning",
                                    lifespan="off", access_log=False, timeout_graceful_shutdown=1)
            server = uvicorn.Server(config)
            server.install_signal_handlers = lambda: None  # the run owns signals
            self._serving = asyncio.create_task(server.serve(), name="agent-endpoint")
            while not server.started:
                if self._serving.done():
                    self._serving.result()  # raises why it could not start (port in use, ...)
                    raise RuntimeError(f"the agent endpoint did not start on {self.cfg.host}:{self.cfg.port}")
                await asyncio.sleep(0.01)
            self._server = server
            self.port = server.servers[0].sockets[0].getsockname()[1]
            log.info("agent endpoint on %s", self.base_url)

    @property
    def base_url(self) -> str:
        return f"http://{self.cfg.host}:{self.port}/v1"

    def session_url(self, session: Session) -> str:
        return f"http://{self.cfg.host}:{self.port}/s/{session.key}/v1"

    async def close(self) -> None:
        self._closing = True
        if self.workers is not None:  # their runs are cancelled, their agents' connections closed
            await asyncio.to_thread(self.workers.close)
        for session in list(self.sessions.values()):
            session.close()
        if self._server is not None:
            self._server.should_exit = True
            await asyncio.gather(self._serving, return_exceptions=True)
            self._server = None

    # ---- sessions --------------------------------------------------------------------------
    def open_session(self, env_id: str, traj: Trajectory, greedy: bool = False) -> Session:
        session = Session(key=f"ra-{secrets.token_hex(16)}", env_id=env_id, traj=traj, formatter=self.formatter,
                          greedy=greedy, max_calls=self.rollout.max_turns)
        self.sessions[session.key] = session
        return session

    def close_session(self, session: Session) -> None:
        session.close()
        self.sessions.pop(session.key, None)
        self._ended[session.key] = None  # a request of it still on the wire is answered as ended, not unknown
        while len(self._ended) > 10_000:
            self._ended.pop(next(iter(self._ended)))

    # ---- the app ---------------------------------------------------------------------------
    def app(self):
        from starlette.applications import Starlette
        from starlette.routing import Route

        routes = []
        for prefix in ("/v1", "/s/{key}/v1"):
            routes += [Route(f"{prefix}/chat/completions", self._chat, methods=["POST"]),
                       Route(f"{prefix}/completions", self._completions, methods=["POST"]),
                       Route(f"{prefix}/models", self._models, methods=["GET"])]
        return Starlette(routes=routes)

    async def _models(self, request):
        from starlette.responses import JSONResponse

        return JSONResponse({"object": "list", "data": [
            {"id": self.cfg.model_name, "object": "model", "created": 0, "owned_by": "roll_agent"}]})

    async def _chat(self, request):
        return await self._serve(request, api.ChatRequest, self._answer_chat)

    async def _completions(self, request):
        return await self._serve(request, api.CompletionRequest, self._answer_completion)

    async def _serve(self, request, model, answer):
        from starlette.responses import JSONResponse

        self.stats["requests"] += 1
        session = None
        try:
            if self._closing:
                raise api.APIError(503, "The endpoint is shutting down.", "service_unavailable")
            session = self._session(request)
            body = await self._body(request)
            parsed = api.parse(model, body)
            return await answer(request, session, parsed)
        except Exception as exc:
            error = self._error(request, session, exc)
            return JSONResponse(error.body(), status_code=error.status)

    def _error(self, request, session: Session | None, exc: Exception) -> api.APIError:
        """The error answer for `exc` (in a stream: its error event), counted, its reason's first logged.
        Anything but an APIError is a bug or an input nothing foresaw: a JSON 500, the run goes on."""
        if not isinstance(exc, api.APIError):
            log.exception("agent endpoint: %s failed", request.url.path, exc_info=exc)
            exc = api.APIError(500, f"The endpoint failed on this request: {type(exc).__name__}: {exc}", "server_error")
        # a request cut by its episode's end (a redundant or stale episode cancelled) or by the
        # run's is no error: its agent is cancelled with it and sees no answer
        ended = exc.code == "session_ended" or self._closing
        self.stats["ended" if ended else "errors"] += 1
        if ended:
            return exc
        self.error_codes[exc.code or str(exc.status)] += 1
        self.http_errors[f"agent_http_{exc.status // 100}xx"] += 1
        reason = (exc.status, exc.code or exc.param or exc.type)
        first = reason not in self._logged_reasons
        self._logged_reasons.add(reason)
        log.log(logging.WARNING if first else logging.DEBUG,
                "agent endpoint answered %s to %s of session %s: %s%s", exc.status,
                "/v1" + request.url.path.rsplit("/v1", 1)[-1], session.env_id if session is not None else "(none)",
                exc.message, " (later answers for this reason are counted in metrics.jsonl, agent_http_*xx)" if first
                else "")
        return exc

    def _session(self, request) -> Session:
        key = request.path_params.get("key")
        if key is None:
            auth = request.headers.get("authorization", "")
            key = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
            if not key:
                raise api.APIError(401, "No session key: use the episode's base URL (.../s/<key>/v1) or its API key.",
                                   "authentication_error")
        session = self.sessions.get(key)
        if key in self._ended or (session is not None and session.closed):
            raise api.APIError(404, "The session's episode has ended.", "not_found_error", code="session_ended")
        if session is None:
            raise api.APIError(404, "Unknown session: the key is wrong, or its episode ended long ago.",
                               "not_found_error", code="session_not_found")
        return session

    async def _body(self, request) -> bytes:
        limit = int(self.cfg.max_request_mb * 2**20)
        too_big = api.APIError(413, f"The request body is over endpoint.max_request_mb={self.cfg.max_request_mb} MB.",
                               code="request_too_large")
        if int(request.headers.get("content-length") or 0) > limit:
            raise too_big
        from starlette.requests import ClientDisconnect

        chunks, size = [], 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise too_big
                chunks.append(chunk)
        except ClientDisconnect as exc:  # gone while sending: there is no one to answer
            raise api.APIError(499, "The client closed the connection.", code="client_closed") from exc
        return b"".join(chunks)

    # ---- answering -------------------------------------------------------------------------
    def _sampling(self, session: Session, req, prompt_len: int) -> SamplingParams:
        budget = self.rollout.max_context_tokens - prompt_len
        if budget <= 0:
            session.truncated = "context"
            raise api.APIError(400, f"The prompt is {prompt_len} tokens; rollout.max_context_tokens is "
                               f"{self.rollout.max_context_tokens}.", param="messages", code="context_length_exceeded")
        cap = self.rollout.max_new_tokens  # as for env episodes: what the run allows per answer
        honor = self.cfg.honor_sampling
        return SamplingParams(
            max_new_tokens=min(req.token_limit or cap, cap, budget),
            temperature=req.temperature if honor and req.temperature is not None else self.rollout.temperature,
            top_p=req.top_p if honor and req.top_p is not None else self.rollout.top_p,
            greedy=session.greedy or (honor and req.temperature == 0),
            stop_token_ids=self.formatter.stop_token_ids,
            top_logprobs=req.alternatives)

    def _check_calls(self, session: Session) -> None:
        if session.max_calls and session.calls >= session.max_calls:
            session.truncated = "turns"
            raise api.APIError(400, f"This episode has made rollout.max_turns={session.max_calls} model calls.",
                               code="max_turns_exceeded")

    async def _generate(self, request, session: Session, call: Call, sampling: SamplingParams,
                        on_tokens: TokenSink | None = None) -> GenerateResult:
        """The proxy's answer to `call`, recorded; the request is aborted if the client goes away."""
        gen = asyncio.create_task(self.proxy.generate(GenerateRequest(call.prompt_ids, sampling, session.env_id,
                                                                      on_tokens=on_tokens)))
        session.tasks.add(gen)
        gone = asyncio.create_task(_disconnected(request))
        try:
            await asyncio.wait({gen, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not gen.done():  # the client went away: the engine stops working on it
                gen.cancel()
                await asyncio.gather(gen, return_exceptions=True)
                if not session.closed:  # else its agent was cancelled with its episode (in a worker: later)
                    raise api.APIError(499, "The client closed the connection.", code="client_closed")
            if gen.cancelled():
                raise api.APIError(404, "The session's episode ended during this request.", "not_found_error",
                                   code="session_ended")
            if isinstance(exc := gen.exception(), Unsupported):  # what the engine cannot give
                raise api.APIError(400, exc.message, param=exc.param, code="unsupported_parameter")
            if exc is not None:
                raise api.APIError(500, f"Generation failed: {type(exc).__name__}: {exc}", "server_error")
            result = gen.result()
            session.finish(call, result)
            return result
        except BaseException:  # failed, or this handler cancelled (the server closing): nothing is recorded
            if not gen.done():
                gen.cancel()
            session.abandon(call)
            raise
        finally:
            session.tasks.discard(gen)
            gone.cancel()

    async def _stream(self, request, session: Session, call: Call, sampling: SamplingParams, req, stream, close,
                      setup_s: float = 0.0):
        """Answer `call` as server-sent events while the engine samples it. The response starts with
        the first tokens (a failure before them is an HTTP error, after them an error event); `stream`
        (roll_agent/agents/streaming.py) sends the text as far as it is decided, with the log-probs of
        the tokens it shows; `close(result)` gives the recorded answer's deltas left, its finish
        reason, usage and log-prob entries. An engine (or a proxy in another process) that does not
        stream gives the whole answer at the end: one delta."""
        arrived: asyncio.Queue = asyncio.Queue()  # runs of tokens as they are sampled; None once generation ended

        def ended(task: asyncio.Task) -> None:
            arrived.put_nowait(None)
            if not task.cancelled():
                task.exception()  # read here too: a stream its client left never reads it

        gen = asyncio.create_task(self._generate(request, session, call, sampling,
                                                 lambda *tokens: arrived.put_nowait(tokens)))
        gen.add_done_callback(ended)
        try:
            first = await arrived.get()
        except BaseException:  # this handler cancelled (the server closing)
            gen.cancel()
            raise
        if first is None:
            await gen  # failed: an HTTP error; else the answer came whole

        async def events():
            decoding, sent, stopped = Decoding(self.formatter), 0, False
            try:
                chunks, tokens = stream.start(), first
                while tokens is not None:
                    decoding.add(*tokens)
                    if not stopped:
                        upto, stopped = stop_decided(decoding.text, req.stops)
                        deltas = stream.update(decoding.text[:upto])
                        shown = decoding.shown(stream.released) if req.with_logprobs else sent
                        chunks += stream.chunks(deltas, [self._entry(*t) for t in zip(
                            decoding.ids[sent:shown], decoding.logprobs[sent:shown], decoding.top[sent:shown])])
                        sent = shown
                    if chunks:
                        yield _events(chunks)
                    chunks, tokens = [], await arrived.get()
                result = gen.result()
                t2 = time.perf_counter()
                deltas, finish, usage, entries = close(result)
                chunks += stream.chunks(deltas, (entries or [])[sent:])
                chunks += stream.last(finish, usage if req.include_usage else None)
                self.latency_s.append(setup_s + time.perf_counter() - t2)
                yield _events(chunks) + "data: [DONE]\n\n"
            except Exception as exc:
                yield _events([self._error(request, session, exc).body()])
            finally:
                if not gen.done():  # the client went away, or the server is closing
                    gen.cancel()

        from starlette.responses import StreamingResponse

        return StreamingResponse(events(), media_type="text/event-stream")

    async def _answer_chat(self, request, session: Session, req: api.ChatRequest):
        t0 = time.perf_counter()
        self._check_calls(session)
        messages, tools = req.template_messages(), req.template_tools()
        try:
            text = self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # the template rejects the conversation (roles out of order, ...)
            raise api.APIError(400, f"The chat template cannot render these messages: {exc}", param="messages") from exc
        call = session.begin_chat(messages, tools, text)
        try:
            sampling = self._sampling(session, req, len(call.prompt_ids))
        except api.APIError:
            session.abandon(call)
            raise
        parse = self.parse_tools if req.tool_choice != "none" and req.tools else None
        t1 = time.perf_counter()

        def answer(result: GenerateResult):
            content, finish, kept = self._cut(result, req.stops)
            calls = []
            if parse is not None:
                content, calls = parse(content)
            finish = "tool_calls" if calls else finish
            logprobs = self._logprobs(result, kept) if req.with_logprobs else None
            return content, calls, finish, _usage(call, result), logprobs

        if req.stream:
            stream = ChatStream(self.cfg.model_name, parse)

            def close(result: GenerateResult):
                content, calls, finish, usage, logprobs = answer(result)
                deltas, calls = stream.end(content, calls)
                session.answered(call, content, calls)  # recognised when the agent sends it back
                return deltas, finish, usage, logprobs

            return await self._stream(request, session, call, sampling, req, stream, close, t1 - t0)
        result = await self._generate(request, session, call, sampling)
        t2 = time.perf_counter()
        content, calls, finish, usage, logprobs = answer(result)
        session.answered(call, content, calls)  # recognised when the agent sends it back
        self.latency_s.append(time.perf_counter() - t2 + (t1 - t0))
        from starlette.responses import JSONResponse

        return JSONResponse(api.chat_response(self.cfg.model_name, content, calls, finish, usage, logprobs))

    async def _answer_completion(self, request, session: Session, req: api.CompletionRequest):
        self._check_calls(session)
        if isinstance(req.prompt, str):
            call = session.begin_text(req.prompt)
        else:
            self._check_token_ids(req.prompt)
            call = session.begin_ids(req.prompt)
        if not call.prompt_ids:
            session.abandon(call)
            raise api.APIError(400, "The prompt is empty.", param="prompt")
        try:
            sampling = self._sampling(session, req, len(call.prompt_ids))
        except api.APIError:
            session.abandon(call)
            raise

        def answer(result: GenerateResult):
            text, finish, kept = self._cut(result, req.stops)
            return text, finish, _usage(call, result), self._logprobs(result, kept) if req.with_logprobs else None

        if req.stream:
            stream = CompletionStream(self.cfg.model_name, call.text if req.echo else "", req.alternatives > 0)

            def close(result: GenerateResult):
                text, finish, usage, logprobs = answer(result)
                return stream.end(text), finish, usage, logprobs

            return await self._stream(request, session, call, sampling, req, stream, close)
        text, finish, usage, logprobs = answer(await self._generate(request, session, call, sampling))
        if logprobs is not None:
            logprobs = api.legacy_logprobs(logprobs, req.alternatives > 0)
        if req.echo:
            text = call.text + text
        from starlette.responses import JSONResponse

        return JSONResponse(api.completion_response(self.cfg.model_name, text, finish, usage, logprobs))

    def _check_token_ids(self, ids: list[int]) -> None:
        """A token-id prompt holds only ids the tokenizer has: an id outside `[0, len(tokenizer))`
        would fail the engine's or the trainer's embedding lookup, so it is refused at the door."""
        vocab = self.vocab_size
        for i, token in enumerate(ids):
            if not 0 <= token < vocab:
                raise api.APIError(400, f"prompt[{i}] is token id {token}, outside this model's vocabulary "
                                   f"[0, {vocab}).", param=f"prompt.{i}", code="invalid_token_id")

    def _cut(self, result: GenerateResult, stops: list[str]) -> tuple[str, str, int]:
        """The answer's text as the agent sees it, its finish reason, and how many of the sampled
        tokens it shows (a stop string ends it early: the tokens after stay recorded)."""
        text = self.formatter.response_text(result.token_ids)
        finish = "length" if result.finish_reason == "length" else "stop"
        kept = len([t for t in result.token_ids if t not in self.formatter.stop_token_ids])
        hits = [i for i in (text.find(s) for s in stops) if i >= 0]
        if hits:
            text, finish = text[:min(hits)], "stop"
            kept = len(self.formatter.encode(text))
        return text, finish, kept

    def _logprobs(self, result: GenerateResult, kept: int) -> list[dict]:
        """The log-prob entries of the answer's first `kept` tokens (those the agent sees)."""
        top = result.top_logprobs or [None] * len(result.token_ids)
        return [self._entry(*t) for t in list(zip(result.token_ids, result.logprobs, top))[:kept]]

    def _entry(self, token: int, logprob: float, top: list[tuple[int, float]] | None) -> dict:
        """One token's log-prob entry, with its likeliest alternatives when they were asked for."""
        return {**self._piece(token, logprob), "top_logprobs": [self._piece(*alt) for alt in top or []]}

    def _piece(self, token: int, logprob: float) -> dict:
        piece = self.tokenizer.decode([token])
        return {"token": piece, "logprob": logprob, "bytes": list(piece.encode())}


def _usage(call: Call, result: GenerateResult) -> dict:
    return {"prompt_tokens": len(call.prompt_ids), "completion_tokens": len(result.token_ids),
            "total_tokens": len(call.prompt_ids) + len(result.token_ids)}


async def _disconnected(request) -> None:
    """Returns when the client goes away (the body is read by then)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _events(chunks: list[dict]) -> str:
    return "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks)
