"""The openai engine against a real HTTP server on 127.0.0.1 (an OpenAI-compatible stub)."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from roll_agent.config import EngineConfig, ModelConfig, OpenAIEngineConfig
from roll_agent.proxy.engines import make_engines
from roll_agent.proxy.engines.openai import OpenAIEngine, OpenAIEngineError
from roll_agent.proxy.llm_proxy import LLMProxy
from roll_agent.types import GenerateRequest, SamplingParams
from tests.conftest import run

STOP = 2


class Server:
    """Answers /v1/models and /v1/completions; records every request body."""

    def __init__(self, mode: str):
        self.mode = mode  # "ids": vLLM's token_id:N log-probs; "text": text only; "slow"; "error"
        self.bodies: list[dict] = []
        self.release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                server._send(self, 200, {"object": "list", "data": [{"id": "served-model", "object": "model"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.bodies.append({**body, "auth": self.headers.get("Authorization")})
                server._complete(self, body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def _complete(self, handler, body: dict) -> None:
        if self.mode == "error":
            return self._send(handler, 500, {"error": {"message": "model overloaded"}})
        if self.mode == "slow":
            self.release.wait(10)
        # a deterministic "model": the next tokens are the prompt's last ids + 1, then the stop id
        out = [t + 1 for t in body["prompt"][-3:]][: body["max_tokens"]]
        finish = "length" if len(out) == body["max_tokens"] else "stop"
        if finish == "stop":
            out.append(body["stop_token_ids"][0])
        choice = {"index": 0, "text": "hello world", "finish_reason": finish}
        if self.mode == "ids":
            choice["logprobs"] = {"tokens": [f"token_id:{t}" for t in out],
                                  "token_logprobs": [-0.5 - i / 10 for i in range(len(out))]}
        self._send(handler, 200, {"id": "cmpl-1", "object": "text_completion", "choices": [choice]})

    @staticmethod
    def _send(handler, code: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        handler.send_response(code)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        try:
            handler.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client aborted
            pass

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(request):
    srv = Server(request.param)
    yield srv
    srv.close()


def _engine(url: str, model_path: str = "", **kw) -> OpenAIEngine:
    cfg = EngineConfig(type="openai", openai=OpenAIEngineConfig(base_url=url, **kw))
    engines = make_engines(cfg, ModelConfig(), model_path, seed=7)
    assert len(engines) == 1 and isinstance(engines[0], OpenAIEngine)
    return engines[0]


@pytest.mark.parametrize("server", ["ids"], indirect=True)
def test_token_ids_and_logprobs_round_trip(server, monkeypatch):
    monkeypatch.setenv("TEST_OPENAI_KEY", "sk-test")
    engine = _engine(server.url, api_key_env="TEST_OPENAI_KEY")

    async def go():
        proxy = LLMProxy([engine])
        sampling = SamplingParams(max_new_tokens=10, temperature=0.7, stop_token_ids=(STOP, 3))
        result = await proxy.generate(GenerateRequest([5, 6, 7, 8], sampling, env_id="e0"))
        short = await engine.generate([5, 6, 7, 8], SamplingParams(max_new_tokens=2, greedy=True), "r2")
        await proxy.close()
        return result, short

    result, short = run(go())
    assert result.token_ids == [7, 8, 9, STOP] and result.finish_reason == "stop"
    assert result.logprobs == pytest.approx([-0.5, -0.6, -0.7, -0.8])
    assert result.versions == [0, 0, 0, 0]
    assert short.token_ids == [7, 8] and short.finish_reason == "length"
    first, second = server.bodies
    assert first["model"] == "served-model" and first["prompt"] == [5, 6, 7, 8]
    assert first["stop_token_ids"] == [STOP, 3] and first["temperature"] == 0.7 and first["max_tokens"] == 10
    assert first["logprobs"] == 1 and first["seed"] == 7 and first["auth"] == "Bearer sk-test"
    assert second["temperature"] == 0.0 and second["top_p"] == 1.0


@pytest.mark.parametrize("server", ["text"], indirect=True)
def test_text_only_server_is_tokenized_locally(server, tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    engine = _engine(server.url, str(tmp_path), model="named", api_key_env="")
    out = run(engine.generate([5, 6], SamplingParams(max_new_tokens=50, stop_token_ids=(STOP,)), "r1"))
    assert out.token_ids == tokenizer.encode("hello world", add_special_tokens=False) + [STOP]
    assert out.logprobs == [0.0] * len(out.token_ids) and out.finish_reason == "stop"
    assert server.bodies[0]["model"] == "named" and server.bodies[0]["auth"] is None
    run(engine.close())


@pytest.mark.parametrize("server", ["slow"], indirect=True)
def test_abort_returns_at_once(server):
    engine = _engine(server.url)

    async def go():
        call = asyncio.create_task(engine.generate([1, 2, 3], SamplingParams(max_new_tokens=5), "slow-1"))
        while not server.bodies:
            await asyncio.sleep(0.01)
        await engine.abort("slow-1")
        out = await call
        await engine.close()
        return out

    out = run(go(), timeout=8)  # the server holds the request for 10 s
    assert out.token_ids == [] and out.finish_reason == "abort"


@pytest.mark.parametrize("server", ["error"], indirect=True)
def test_server_errors_and_weight_updates_are_clear(server):
    engine = _engine(server.url)
    with pytest.raises(OpenAIEngineError, match="HTTP 500.*model overloaded"):
        run(engine.generate([1], SamplingParams(max_new_tokens=3), "r"))
    run(engine.load_weights([], 3))
    assert engine.version == 3
    with pytest.raises(NotImplementedError, match="evaluation only"):
        run(engine.load_weights([("w", None)], 4))
    run(engine.close())


def test_unreachable_server_names_the_setting():
    engine = _engine("http://127.0.0.1:9/v1", model="m")
    with pytest.raises(OpenAIEngineError, match="engine.openai.base_url"):
        run(engine.generate([1], SamplingParams(max_new_tokens=3), "r"))
