"""The OpenAI-compatible endpoint in front of the LLMProxy: roll_agent serves, the agent calls.

Starlette routes served by uvicorn on loopback, on the rollout's own event loop (the proxy is
an asyncio object there). Each agent episode is a `Session` with its own key, reached either
by its base URL `http://127.0.0.1:PORT/s/<key>/v1` or by the key as its API key on the plain
`/v1` base URL; every call of the session is recorded in order (roll_agent/agents/sessions.py).

    POST /v1/chat/completions   messages, tools, tool_choice, max_tokens / max_completion_tokens,
                                stop, logprobs, stream (SSE, with a final usage chunk when asked)
    POST /v1/completions        a text or token-id prompt
    GET  /v1/models

Sampling: a training episode samples at the rollout's temperature / top_p whatever the agent
asks (RL needs the policy's own distribution; `endpoint.honor_sampling` passes the agent's
temperature and top_p through instead), an evaluation episode greedily. Stop strings cut the
answer the agent sees; the tokens sampled past them stay recorded (the model saw them).

A weight update is invisible to agents: the proxy re-issues a request suspended mid-answer, so
it returns later with per-token versions showing the switch. Errors are OpenAI-style JSON:
400 for a malformed request (the field named), 401 without a key, 404 for an unknown or ended
session, 413 for a body over `endpoint.max_request_mb`, 503 while shutting down. A client that
goes away has its request aborted in the engine.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections import Counter

from roll_agent.agents import openai_api as api
from roll_agent.agents.workers import AgentWorkers, default_agent_workers
from roll_agent.agents.sessions import Call, Session
from roll_agent.config import EndpointConfig, RolloutConfig
from roll_agent.types import GenerateRequest, GenerateResult, SamplingParams, Trajectory

log = logging.getLogger(__name__)


class AgentEndpoint:
    def __init__(self, proxy, formatter, rollout: RolloutConfig, cfg: EndpointConfig | None = None):
        self.proxy = proxy
        self.formatter = formatter
        self.tokenizer = formatter.tokenizer
        self.rollout = rollout
        self.cfg = cfg or EndpointConfig()
        self.parse_tools = api.tool_parser(self.cfg.tool_parser)
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
            try:
                if self._closing:
                    raise api.APIError(503, "The endpoint is shutting down.", "service_unavailable")
                session = self._session(request)
                body = await self._body(request)
                parsed = api.parse(model, body)
                return await answer(request, session, parsed)
            except api.APIError:
                raise
            except Exception as exc:  # a bug or an input nothing above foresaw: a JSON 500, the run goes on
                log.exception("agent endpoint: %s failed", request.url.path)
                raise api.APIError(500, f"The endpoint failed on this request: {type(exc).__name__}: {exc}",
                                   "server_error") from exc
        except api.APIError as exc:
            # a request cut by its episode's end (a redundant or stale episode cancelled) or by the
            # run's is no error: its agent is cancelled with it and sees no answer
            ended = exc.code == "session_ended" or self._closing
            self.stats["ended" if ended else "errors"] += 1
            if not ended:
                self.error_codes[exc.code or str(exc.status)] += 1
                self.http_errors[f"agent_http_{exc.status // 100}xx"] += 1
                reason = (exc.status, exc.code or exc.param or exc.type)
                first = reason not in self._logged_reasons
                self._logged_reasons.add(reason)
                log.log(logging.WARNING if first else logging.DEBUG,
                        "agent endpoint answered %s to %s of session %s: %s%s", exc.status,
                        "/v1" + request.url.path.rsplit("/v1", 1)[-1],
                        session.env_id if session is not None else "(none)", exc.message,
                        " (later answers for this reason are counted in metrics.jsonl, agent_http_*xx)" if first
                        else "")
            return JSONResponse(exc.body(), status_code=exc.status)

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
            stop_token_ids=self.formatter.stop_token_ids)

    def _check_calls(self, session: Session) -> None:
        if session.max_calls and session.calls >= session.max_calls:
            session.truncated = "turns"
            raise api.APIError(400, f"This episode has made rollout.max_turns={session.max_calls} model calls.",
                               code="max_turns_exceeded")

    async def _generate(self, request, session: Session, call: Call, sampling: SamplingParams) -> GenerateResult:
        """The proxy's answer to `call`, recorded; the request is aborted if the client goes away."""
        gen = asyncio.create_task(self.proxy.generate(GenerateRequest(call.prompt_ids, sampling, session.env_id)))
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
            if gen.exception() is not None:
                exc = gen.exception()
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
        t1 = time.perf_counter()
        result = await self._generate(request, session, call, sampling)
        t2 = time.perf_counter()
        content, finish, kept = self._cut(result, req.stops)
        calls = []
        if req.tool_choice != "none" and req.tools:
            content, calls = self.parse_tools(content)
        session.answered(call, content, calls)  # recognised when the agent sends it back
        finish = "tool_calls" if calls else finish
        usage = {"prompt_tokens": len(call.prompt_ids), "completion_tokens": len(result.token_ids),
                 "total_tokens": len(call.prompt_ids) + len(result.token_ids)}
        logprobs = self._logprobs(result, kept) if req.logprobs else None
        self.latency_s.append(time.perf_counter() - t2 + (t1 - t0))
        if req.stream:
            include_usage = bool((req.stream_options or {}).get("include_usage"))
            chunks = api.chat_chunks(self.cfg.model_name, content, calls, finish, usage, logprobs, include_usage)
            return _sse(chunks)
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
        result = await self._generate(request, session, call, sampling)
        text, finish, kept = self._cut(result, req.stops)
        usage = {"prompt_tokens": len(call.prompt_ids), "completion_tokens": len(result.token_ids),
                 "total_tokens": len(call.prompt_ids) + len(result.token_ids)}
        logprobs = None
        if req.logprobs is not None:
            entries = self._logprobs(result, kept)
            logprobs = {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
                        "top_logprobs": None, "text_offset": None}
        if req.echo:
            text = call.text + text
        if req.stream:
            base = api.completion_response(self.cfg.model_name, text, finish, usage, logprobs)
            chunks = [{**base, "object": "text_completion"}]
            if (req.stream_options or {}).get("include_usage"):
                chunks.append({**base, "choices": [], "usage": usage})
            return _sse(chunks)
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
        out = []
        for token, logprob in list(zip(result.token_ids, result.logprobs))[:kept]:
            piece = self.tokenizer.decode([token])
            out.append({"token": piece, "logprob": logprob, "bytes": list(piece.encode()), "top_logprobs": []})
        return out


async def _disconnected(request) -> None:
    """Returns when the client goes away (the body is read by then)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _sse(chunks: list[dict]):
    from starlette.responses import StreamingResponse

    async def events():
        for chunk in chunks:
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")
