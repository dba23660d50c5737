"""Weight sync cost: full parameters vs LoRA adapters only, same model, one process.

Setting: a random-weight Qwen2 model built with the project's `build_tiny_model`
(hidden 768, 8 layers, GQA 12/4 heads, MLP 2048, vocab 1024: ~50 M parameters,
~200 MB in fp32; `--quick`: hidden 512, 4 layers). The sender is the trainer-side
model (`load_policy`, as `TorchTrainer` loads it), the receiver an `HFEngine`
serving the same checkpoint; `InProcessSync(lambda: sync_parameters(sender, cfg))`
pushes into it, exactly as `run.py` wires the trainer's `named_weights`.

- full: `ModelConfig()`: every parameter moves;
- lora: `ModelConfig(lora=LoraConfig(enabled=True, r=8, alpha=16))` on q/k/v/o for
  both sides: only the adapters move (the base weights never change).

Before each push the sender's synced parameters are perturbed (outside the timing),
so the check after it (every engine parameter equals the sender's) proves that the
push moved them. Pushes are interleaved (full, lora, full, ...) against drift; the
table gives medians. Target: adapter sync >= 10x faster at rank 8.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.common import result_line, table  # noqa: E402
from roll_agent.config import EngineConfig, LoraConfig, ModelConfig, TinyModelConfig  # noqa: E402
from roll_agent.modeling import load_policy, sync_parameters  # noqa: E402
from roll_agent.proxy.engines.hf import HFEngine  # noqa: E402
from roll_agent.tiny_model import build_tiny_model  # noqa: E402
from roll_agent.train.weight_sync import InProcessSync  # noqa: E402

CORPUS = ["Answer with any text. This env is simulated.", "task 123456 step 7", "left right up down"] * 50
VARIANTS = {"full": ModelConfig(), "lora": ModelConfig(lora=LoraConfig(enabled=True, r=8, alpha=16))}


# ---- sync paths: one function per transport --------------------------------------
# Each takes (sender model, receiving engines, model config, version) and returns the
# push report {"bytes", "seconds"}. To add a transport, write it here and list it in
# PATHS; the benchmark runs every listed path on both variants and checks the result.
#   TODO deepspeed: gather ZeRO-3 partitions (GatheredParameters) per module, push.
#   TODO torch.distributed broadcast: a receiver process per engine, joined in a gloo
#        group, roll_agent/train/broadcast.py's broadcast_send / broadcast_receive_into.
async def sync_inprocess(sender, engines: list, cfg: ModelConfig, version: int) -> dict:
    sync = InProcessSync(lambda: ((n, p.detach()) for n, p in sync_parameters(sender, cfg)))
    return await sync.push(engines, version)


PATHS = {"inprocess": sync_inprocess}


# ---- harness ---------------------------------------------------------------------
def build_model(root: Path, quick: bool) -> Path:
    tiny = TinyModelConfig(vocab_size=1024, hidden_size=512 if quick else 768,
                           intermediate_size=1408 if quick else 2048, num_hidden_layers=4 if quick else 8,
                           num_attention_heads=8 if quick else 12, num_key_value_heads=4)
    return build_tiny_model(root / "model", tiny, lambda: CORPUS, seed=0)


@torch.no_grad()
def perturb(sender, cfg: ModelConfig, step: int) -> None:
    gen = torch.Generator().manual_seed(step)
    for _, p in sync_parameters(sender, cfg):
        p.add_(torch.randn(p.shape, generator=gen) * 1e-3)


@torch.no_grad()
def assert_synced(sender, engine: HFEngine, name: str) -> None:
    mine = dict(sender.named_parameters())
    theirs = dict(engine.model.named_parameters())
    assert mine.keys() == theirs.keys(), f"{name}: sender and engine parameter names differ"
    bad = [k for k in mine if not torch.equal(mine[k], theirs[k])]
    assert not bad, f"{name}: {len(bad)} engine parameters differ from the sender's after the push, e.g. {bad[:3]}"


async def bench(model_path: str, reps: int) -> dict[tuple[str, str], list[dict]]:
    sides = {v: (load_policy(model_path, cfg), HFEngine(model_path, EngineConfig(), cfg))
             for v, cfg in VARIANTS.items()}
    results: dict[tuple[str, str], list[dict]] = {(p, v): [] for p in PATHS for v in VARIANTS}
    for rep in range(reps + 1):  # rep 0 warms allocators and caches, not counted
        for path, fn in PATHS.items():
            for variant, cfg in VARIANTS.items():
                sender, engine = sides[variant]
                perturb(sender, cfg, rep)
                t0 = time.perf_counter()
                report = await fn(sender, [engine], cfg, rep + 1)
                wall = time.perf_counter() - t0
                assert_synced(sender, engine, f"{path}/{variant}")
                assert engine.version == rep + 1
                if rep:
                    results[(path, variant)].append({**report, "wall": wall})
    for _, engine in sides.values():
        await engine.close()
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller model, fewer pushes (< 30 s)")
    ap.add_argument("--reps", type=int, default=None, help="pushes per variant (default 15, quick 5)")
    args = ap.parse_args()
    reps = args.reps or (5 if args.quick else 15)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="weight_sync_") as tmp:
        model_path = build_model(Path(tmp), args.quick)
        results = asyncio.run(bench(str(model_path), reps))

    rows, med = [], {}
    for (path, variant), runs in results.items():
        secs = statistics.median(r["seconds"] for r in runs)
        mb = runs[0]["bytes"] / 2**20
        med[(path, variant)] = (secs, mb)
        rows.append((path, variant, len(runs), secs * 1e3, min(r["seconds"] for r in runs) * 1e3, mb, mb / 1024 / secs))
    print(f"{reps} pushes per variant, interleaved; every push verified; {time.perf_counter() - start:.0f} s")
    print(table(rows, ("path", "variant", "pushes", "median ms", "min ms", "MB/push", "GB/s")))
    for path in PATHS:
        (full_s, full_mb), (lora_s, lora_mb) = med[(path, "full")], med[(path, "lora")]
        print(f"{path}: adapter-only sync is {full_s / lora_s:.1f}x faster and moves {full_mb / lora_mb:.0f}x "
              f"fewer bytes ({'meets' if full_s / lora_s >= 10 else 'MISSES'} the 10x target)")
    (full_s, full_mb), (lora_s, lora_mb) = med[("inprocess", "full")], med[("inprocess", "lora")]
    print(result_line(full_s=full_s, lora_s=lora_s, ratio=full_s / lora_s, full_mb=full_mb, lora_mb=lora_mb))


if __name__ == "__main__":
    main()
