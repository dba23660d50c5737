"""Trained samples/s against the async ratio: the real `train(cfg)`, side by side, at two
topologies in one invocation (`--topology both`, the default):

- default (the headline): configs/default.yaml as `python -m roll_agent.run` runs it (the
  default tiny model on FrozenLake, 8 env groups of 8 + 1 for 8-group batches, one update per
  batch, torch's thread default), async ratios 0, 2 and 8; only warm-up, evaluation,
  checkpoints and logging are off, and the step count is set.
- tuned: the setting below, ratios 0, 1, 2, 4 and 8.

Tuned setting (ROLL Flash's agentic case, scaled to a 2-core CPU): a tiny Qwen2 built by the
project (hidden 384, 4 layers) on the `hf` engine, trained by the `torch` trainer with the
default loss (GRPO + decoupled PPO + the k3 KL term to the initial model, 0.05) in two PPO
mini-batch updates per batch, in its own process (the local runtime's default), on the
simulated env: episodes of 2..4 turns (per task seed), step latency N(mu, sigma = mu),
mu = 0.5 s, clipped at 0. Synchronously a step is ~2.4 s of rollout and ~1.4 s of
training: rollout ~60% of the step (ROLL Flash reports rollout at 70%+ of agentic RL).
Topology, pinned: 4 groups (16 episodes) per step from 5 env groups of 4 + 2 redundant
envs. Ratio 0 gets the same groups (its batch is the first 4 to finish: ROLL Flash's
group-level redundancy). The number of groups in flight N and the training share set the
two targets against each other (measured, 2 rounds each unless said; flags `--groups
--redundancy --hidden --layers --updates --kl`):
  5 x (4+2), 384/4, KL 0.05, 2 updates (pinned): ratio 2 2.00x ratio 0, 0.99x ratio 8;
                                        the default command (3 rounds, 550-570 s) twice:
                                        1.87x, 0.90x and 1.92x, 0.97x
  5 x (4+2), 384/4, KL 0.05, 1 update:   1.85x, 0.98x
  6 x (4+2), 384/4, KL 0.05, 2 updates:  1.87x, 0.88x (52 episodes dropped by ratio 2)
  6 x (4+2), 384/4, KL 0.05, 1 update:   1.89x, 0.99x; 3 rounds: 1.75x, 0.88x (64 dropped)
  6 x (4+2), 384/4, no KL, 2 updates:    1.71x, 0.98x (training ~0.5 s: a smaller share)
  6 x (4+1), 384/4, no KL, 2 updates:    1.74x, 0.87x
  7 x (4+2), 384/4, no KL, 2 updates:    1.51x, 0.93x (ratio 8 itself 1.62x: CPU bound)
  6 x (4+2), 512/4, no KL, 2 updates:    1.48x, 0.92x (CPU bound: 3.7 CPU-s a 2.3 s step)
  9 x (4+2), 192/2, no KL, 1 update:     1.77x, 0.87x; 12 x (4+1): 1.96x, 0.72x
The run is CPU bound from ratio 2 up (3.5-4.2 CPU-s a step on 2 cores): groups in flight past
what the cores serve add no throughput, only duration, and a group's staleness grows with
N/B (a group lasts ~N/B steps when generation sets the pace); ratio 2 drops the long
(4-turn) groups that outlive its window while ratio 8 keeps them. At N = 5 (N/B = 1.25)
ratio 2 keeps nearly every group; the speed-up over sync comes from hiding training (and
the sync wait for the 4th group of N) behind the rollout, so a larger training share (two
updates) raises it. Eval, warm-up, checkpoints and logging off; runtime.torch_threads=1
(torch's default, one thread per core in each of the trainer and engine, oversubscribes
the 2 cores).

Every ratio in {0, 1, 2, 4, 8} runs the same config (own output_dir) in one process;
rounds repeat the sweep in rotated order against drift on a noisy machine. samples/s
= episodes trained in steps `skip+1..N` / sum of those steps' `time_step_s` (batch
wait + train + weight sync: the loop's wall time). Rates pool all rounds; cpu/step
is the CPU seconds per step of the process and its trainer process (all threads, setup
included): a check on CPU starvation, read with the load average printed beside it.
`bound_2_vs_0` is the most any ratio can gain over lockstep, from the same run's ratio-0 steps:
their step time over max(generation, training) time a step (generation at ratio 0 is the
step's wait for its batch).

The base model is built once with the project's own builder (`build_tiny_model` over
`env_corpus`) from a latency-free copy of the env spec and passed as `model.path`:
`env_corpus` plays its corpus episodes with the env's real step latency (~25 s for
this env), which `train()` would otherwise pay again in every run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import SIM_ID, result_line, table  # noqa: E402
from roll_agent.config import Config, EnvSpec  # noqa: E402
from roll_agent.config_loader import load_config  # noqa: E402
from roll_agent.run import train  # noqa: E402
from roll_agent.tiny_model import build_tiny_model, env_corpus, prepare_model  # noqa: E402

RATIOS = {"default": (0, 2, 8), "tuned": (0, 1, 2, 4, 8)}


def env_kwargs(mean_s: float) -> dict:
    return dict(latency="normal", mean_s=mean_s, std_s=mean_s, episode_len=4, min_len=2)


def default_config(ratio: int, out: Path, args) -> Config:
    """configs/default.yaml, as a user runs it: only the measurement's knobs are set."""
    return load_config(None, [
        f"output_dir={out}", f"max_steps={args.steps}", f"rollout.async_ratio={ratio}", "warmup.sft_steps=0",
        "eval.num_episodes=0", "checkpoint.every=0", "logging.progress=false", "logging.backends=[jsonl]",
        "logging.plot=false"])


def make_config(ratio: int, out: Path, args) -> Config:
    # every knob that shapes the run is pinned here, so drifting defaults cannot change the setting
    cfg = load_config(None, [
        f"output_dir={out}", f"max_steps={args.steps}", f"rollout.async_ratio={ratio}",
        f"rollout.num_env_groups={args.groups}", "rollout.groups_per_batch=4", "rollout.group_size=4",
        f"rollout.group_size_redundancy={args.redundancy}", "rollout.max_turns=8", "rollout.max_new_tokens=8",
        "engine.type=hf", "engine.num_engines=1", f"algorithm.kl_coef={args.kl}", "trainer.micro_batch_size=8",
        f"trainer.updates_per_batch={args.updates}",
        f"model.tiny.hidden_size={args.hidden}", f"model.tiny.intermediate_size={args.hidden * 8 // 3}",
        f"model.tiny.num_hidden_layers={args.layers}", f"runtime.torch_threads={args.threads}",
        "warmup.sft_steps=0", "eval.num_episodes=0", "checkpoint.every=0",
        "logging.progress=false", "logging.backends=[jsonl]", "logging.plot=false",
    ])
    cfg.envs = [EnvSpec(id=SIM_ID, kwargs=env_kwargs(args.mean_s))]
    return cfg


def build_model(root: Path, args) -> str:
    cfg = make_config(0, root / "unused", args)
    spec = EnvSpec(id=SIM_ID, kwargs=env_kwargs(0.0) | {"latency": "none"})
    return str(build_tiny_model(root / "base_model", cfg.model.tiny, lambda: env_corpus([spec], seed=cfg.seed),
                                seed=cfg.seed))


def run_one(topology: str, ratio: int, root: Path, model_path: str, args, tag: str) -> dict:
    out = root / f"{topology}-ratio{ratio}-{tag}"
    cfg = (default_config if topology == "default" else make_config)(ratio, out, args)
    cfg.model.path = model_path
    cpu0 = cpu_seconds()
    asyncio.run(train(cfg))
    cpu = cpu_seconds() - cpu0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "time_step_s" in r][args.skip:]
    return {"episodes": sum(r["episodes"] for r in rows), "seconds": sum(r["time_step_s"] for r in rows),
            "stale": [r["staleness_mean"] for r in rows], "train": [r["time_train_s"] for r in rows],
            "wait": [r["time_wait_data_s"] for r in rows], "dropped": rows[-1]["episodes_total_stale_dropped"],
            "cpu_per_step": [cpu / args.steps]}


def cpu_seconds() -> float:
    """This process's and its ended children's (the trainer process's) CPU seconds."""
    return sum(u.ru_utime + u.ru_stime for u in map(resource.getrusage,
                                                  (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))


def measure(topology: str, args, budget_s: float) -> dict[int, list[dict]]:
    """Every ratio of `topology` once per round, in rotated order against drift."""
    ratios = RATIOS[topology]
    start = time.perf_counter()
    results: dict[int, list[dict]] = {r: [] for r in ratios}
    with tempfile.TemporaryDirectory(prefix="async_ratio_") as tmp:
        root = Path(tmp)
        if topology == "default":
            model_path = prepare_model(default_config(0, root / "unused", args), root)
        else:
            model_path = build_model(root, args)
        for rnd in range(args.rounds):
            t0 = time.perf_counter()
            for ratio in ratios[rnd % len(ratios):] + ratios[:rnd % len(ratios)]:
                t1 = time.perf_counter()
                results[ratio].append(run_one(topology, ratio, root, model_path, args, f"r{rnd}"))
                last = results[ratio][-1]
                print(f"{topology} round {rnd} ratio {ratio}: {last['episodes'] / last['seconds']:.2f} samples/s "
                      f"(run {time.perf_counter() - t1:.0f} s)", flush=True)
            elapsed, took = time.perf_counter() - start, time.perf_counter() - t0
            if rnd + 1 < args.rounds and elapsed + took > budget_s:
                print(f"{topology}: stopping after {rnd + 1} rounds: another would pass its share of --budget-s")
                break
    return results


def overlap_bound(results: dict[int, list[dict]]) -> float:
    """What async can gain at most, measured on the lockstep (ratio 0) runs: their step time over
    max(generation, training) time a step. At ratio 0 generation starts only after the weight
    sync, so a step's wait for its batch is its generation time; overlapped, a step lasts at least
    the longer of the two."""
    runs = results[0]
    step_s = sum(x["seconds"] for x in runs) / sum(len(x["train"]) for x in runs)
    return step_s / max(statistics.fmean(w for x in runs for w in x["wait"]),
                        statistics.fmean(t for x in runs for t in x["train"]))


def report(topology: str, results: dict[int, list[dict]], args) -> dict[int, float]:
    def pooled(ratio: int, key: str) -> float:
        return statistics.fmean(x for res in results[ratio] for x in res[key])

    rate = {r: sum(x["episodes"] for x in results[r]) / sum(x["seconds"] for x in results[r]) for r in results}
    per_round = {r: [x["episodes"] / x["seconds"] for x in results[r]] for r in results}
    rows = [(r, rate[r], rate[r] / rate[0], pooled(r, "stale"), pooled(r, "train"), pooled(r, "wait"),
             pooled(r, "cpu_per_step"), sum(x["dropped"] for x in results[r]),
             " ".join(f"{v:.2f}" for v in per_round[r])) for r in results]
    setting = ("configs/default.yaml: FrozenLake, 8 groups of 8 + 1, 8 a batch, 1 update" if topology == "default"
               else f"env N({args.mean_s}, {args.mean_s}) 2..4 turns; {args.groups} groups of 4 + {args.redundancy}, "
                    f"4 a batch, {args.updates} updates; model hidden={args.hidden} layers={args.layers}; "
                    f"torch_threads={args.threads}")
    print(f"\n{topology}: {len(results[0])} round(s) x {args.steps} steps (first {args.skip} skipped); {setting}")
    print(table(rows, ("ratio", "samples/s", "x ratio 0", "staleness", "train_s", "wait_s", "cpu/step",
                       "dropped", "per round")))
    print(f"overlap bound: ratio 0's step / max(generation, training) a step = {overlap_bound(results):.2f}x "
          f"(ratio 2 got {rate[2] / rate[0]:.2f}x)")
    return rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one short round a topology: a smoke test, noisy")
    ap.add_argument("--topology", choices=("both", "default", "tuned"), default="both")
    ap.add_argument("--rounds", type=int, default=None, help="sweeps over all ratios (default 3, quick 1)")
    ap.add_argument("--steps", type=int, default=None, help="training steps per run (default 12, quick 5)")
    ap.add_argument("--skip", type=int, default=2, help="warm-up steps left out of the rates")
    ap.add_argument("--budget-s", type=float, default=1800.0, help="start no round that would end past this "
                    "(shared between the topologies)")
    ap.add_argument("--mean-s", type=float, default=0.5, help="tuned: mean (= std) env step latency, seconds")
    ap.add_argument("--groups", type=int, default=5, help="tuned: env groups in flight (4 per batch)")
    ap.add_argument("--redundancy", type=int, default=2, help="tuned: redundant envs per group of 4")
    ap.add_argument("--kl", type=float, default=0.05, help="tuned: algorithm.kl_coef")
    ap.add_argument("--updates", type=int, default=2, help="tuned: trainer.updates_per_batch (PPO mini-batch updates)")
    ap.add_argument("--hidden", type=int, default=384, help="tuned: model hidden size")
    ap.add_argument("--layers", type=int, default=4, help="tuned: model layers")
    ap.add_argument("--threads", type=int, default=1, help="tuned: runtime.torch_threads (1: trainer and engine "
                    "threads each get one core; torch's default oversubscribes 2 cores)")
    args = ap.parse_args()
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.steps = args.steps or (5 if args.quick else 12)
    topologies = ("default", "tuned") if args.topology == "both" else (args.topology,)

    start, load0 = time.perf_counter(), os.getloadavg()[0]
    measured = {t: measure(t, args, args.budget_s / len(topologies)) for t in topologies}
    rate = {t: report(t, measured[t], args) for t in topologies}
    print(f"\n{time.perf_counter() - start:.0f} s; load average {load0:.1f} -> {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores")
    values = {}
    for t in topologies:  # the default topology's figures first, unprefixed: the headline
        prefix = "" if t == topologies[0] else f"{t}_"
        values.update({f"{prefix}speedup_2_vs_0": rate[t][2] / rate[t][0],
                       f"{prefix}bound_2_vs_0": overlap_bound(measured[t]),
                       f"{prefix}speedup_2_vs_8": rate[t][2] / rate[t][8],
                       f"{prefix}sps_0": rate[t][0], f"{prefix}sps_2": rate[t][2],
                       f"{prefix}rounds": len(measured[t][0])})  # rounds run: --budget-s may stop early
    print(result_line(topology=topologies[0], **values))


if __name__ == "__main__":
    main()
