"""The `openai` engine: a model served elsewhere behind an OpenAI-compatible API.

For evaluation only: it has no weights to update. Requests go to the completions
endpoint (`POST {base_url}/completions`) with the prompt as token ids, so the
rollout stays token-in/token-out with the same chat framing as the other engines.
Servers that support them get vLLM's extensions: `stop_token_ids`,
`return_tokens_as_token_ids` (the response's tokens as ids, with their log-probs)
and `skip_special_tokens=false`. When the server gives only text, the text is
tokenized with the local tokenizer of `model.path` and the log-probs are 0 (not
known); `finish_reason == "stop"` then gets the end-of-turn token appended, as a
local engine would have produced it.

Abort cancels the HTTP request (the server sees the connection close) and returns
finish_reason "abort" with no tokens. It does not stream (an answer comes whole) and
refuses top-k alternatives (`sampling.top_logprobs`).
"""

from __future__ import annotations

import asyncio
import os
from typing import Iterable

import httpx

from roll_agent.config import EngineConfig, ModelConfig
from roll_agent.protocols import Unsupported
from roll_agent.types import EngineOutput, SamplingParams, TokenSink

_TOKEN_ID_PREFIX = "token_id:"  # vLLM's return_tokens_as_token_ids format


class OpenAIEngineError(RuntimeError):
    """The server refused a request or answered something that is not a completion."""


class OpenAIEngine:
    alive = True
    restartable = False  # a crash takes it out of routing for good

    def __init__(self, model_path: str, cfg: EngineConfig, model_cfg: ModelConfig, seed: int = 0):
        self.cfg = cfg.openai
        self.model_path = model_path
        self.seed = seed
        self.version = 0
        self._tokenizer = None  # loaded on the first text-only answer
        self._clients: dict[int, httpx.AsyncClient] = {}  # per event loop: httpx pools are loop-bound
        self._inflight: dict[str, asyncio.Task] = {}
        self._model = self.cfg.model

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        client = self._clients.get(id(loop))
        if client is None or client.is_closed:
            key = os.environ.get(self.cfg.api_key_env, "") if self.cfg.api_key_env else ""
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            client = httpx.AsyncClient(base_url=self.cfg.base_url.rstrip("/") + "/", headers=headers,
                                       timeout=httpx.Timeout(self.cfg.timeout_s, connect=10.0))
            self._clients[id(loop)] = client
        return client

    async def _served_model(self) -> str:
        if not self._model:  # the server's first model, as `openai` CLIs default to
            data = await self._request("GET", "models")
            models = data.get("data") or []
            if not models or not isinstance(models[0], dict) or "id" not in models[0]:
                raise OpenAIEngineError(f"{self.cfg.base_url}/models lists no model; set engine.openai.model")
            self._model = str(models[0]["id"])
        return self._model

    async def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        try:
            response = await self._client().request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise OpenAIEngineError(f"cannot reach {self.cfg.base_url} ({type(exc).__name__}: {exc}); "
                                    "check engine.openai.base_url and that the server is up") from exc
        if response.status_code != 200:
            raise OpenAIEngineError(f"{method} {self.cfg.base_url}/{path} -> HTTP {response.status_code}: "
                                    f"{response.text[:500]}")
        try:
            return response.json()
        except ValueError as exc:
            raise OpenAIEngineError(f"{self.cfg.base_url}/{path} answered non-JSON: {response.text[:200]}") from exc

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, request_id: str,
                       on_tokens: TokenSink | None = None) -> EngineOutput:
        if sampling.top_logprobs:
            raise Unsupported("top_logprobs: engine.type=openai (a model served elsewhere) gives no top-k "
                              "alternatives; use engine.type=hf, vllm or scripted", "top_logprobs")
        if sampling.max_new_tokens <= 0:
            return EngineOutput([], [], "length")
        task = asyncio.ensure_future(self._complete(list(prompt_ids), sampling))
        self._inflight[request_id] = task
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled() and request_id not in self._inflight:  # abort(), not our caller
                return EngineOutput([], [], "abort")
            task.cancel()
            raise
        finally:
            self._inflight.pop(request_id, None)

    async def _complete(self, prompt_ids: list[int], sampling: SamplingParams) -> EngineOutput:
        body = {
            "model": await self._served_model(),
            "prompt": prompt_ids,
            "max_tokens": sampling.max_new_tokens,
            "temperature": 0.0 if sampling.greedy else sampling.temperature,
            "top_p": 1.0 if sampling.greedy else sampling.top_p,
            "logprobs": 1,
            "seed": self.seed,
            "stop_token_ids": list(sampling.stop_token_ids),
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
        }
        data = await self._request("POST", "completions", body)
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise OpenAIEngineError(f"the completion has no choices: {str(data)[:300]}")
        return self._output(choices[0], sampling)

    def _output(self, choice: dict, sampling: SamplingParams) -> EngineOutput:
        finish = "length" if choice.get("finish_reason") == "length" else "stop"
        logprobs = choice.get("logprobs") or {}
        tokens, values = logprobs.get("tokens"), logprobs.get("token_logprobs")
        ids = _token_ids(tokens)
        if ids is not None and isinstance(values, list) and len(values) == len(ids):
            lps = [float(v) if v is not None else 0.0 for v in values]
        else:  # text only: our tokenizer's ids, log-probs unknown
            ids = self._encode(str(choice.get("text") or ""))
            lps = [0.0] * len(ids)
        ids, lps = ids[: sampling.max_new_tokens], lps[: sampling.max_new_tokens]
        stops = set(sampling.stop_token_ids)
        if finish == "stop" and stops and (not ids or ids[-1] not in stops) and len(ids) < sampling.max_new_tokens:
            ids, lps = ids + [sampling.stop_token_ids[0]], lps + [0.0]
        return EngineOutput(ids, lps, finish)

    def _encode(self, text: str) -> list[int]:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        return self._tokenizer.encode(text, add_special_tokens=False)

    async def abort(self, request_id: str) -> None:
        task = self._inflight.pop(request_id, None)
        if task is not None:
            task.cancel()  # closes the HTTP request; generate() returns "abort"

    async def load_weights(self, named_tensors: Iterable, version: int) -> None:
        """Only a version bump: the served model cannot be updated from here."""
        for _ in named_tensors:
            raise NotImplementedError("engine.type=openai serves a model elsewhere and is for evaluation only; "
                                      "train with engine.type=hf or vllm")
        self.version = version

    async def close(self) -> None:
        for task in list(self._inflight.values()):
            task.cancel()
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            try:
                await client.aclose()
            except RuntimeError:  # its loop is gone; nothing left to close
                pass


def _token_ids(tokens) -> list[int] | None:
    """Token ids from vLLM's `token_id:N` strings; None when the server sent token text."""
    if not isinstance(tokens, list):
        return None
    ids = []
    for token in tokens:
        if not isinstance(token, str) or not token.startswith(_TOKEN_ID_PREFIX):
            return None
        try:
            ids.append(int(token[len(_TOKEN_ID_PREFIX):]))
        except ValueError:
            return None
    return ids
