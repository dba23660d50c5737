"""roll_agent vs TRL's GRPOTrainer: same CPU, same model, same tasks, same hyperparameters.

    PYTHONPATH=$PWD python benchmarks/vs_trl/run.py [--trl-python /work/venv-trl/bin/python]

One invocation, one after the other on the same machine:
  1. builds the tiny model with `roll_agent.tiny_model` (tokenizer trained on both tasks'
     text, a tool-calling ChatML template, random-init Qwen2) and warm-starts one copy per
     task with roll_agent's supervised warm-up on that task's expert demonstrations, so RL
     starts from a policy that solves the task greedily but whose samples (temperature 1)
     still fail often; both frameworks load the task's checkpoint;
  2. single-turn task (`roll_agent/ReverseLetters-v0`, reward = share of letters right):
     roll_agent (async ratio 2, env-level async), then TRL (synchronous GRPOTrainer) once per
     `--trl-threads` setting (1 and 2 torch threads: TRL's one process may use both cores),
     with RL seeds 0-7 (8 runs a side: one run's final reward varies by about as much as the gap);
  3. multi-turn tool task (`roll_agent/ToolLatencyCalculator-v0`: the calculator is a tool
     that takes 100-500 ms, long-tailed, mean 200 ms): roll_agent with the env's async
     step, then TRL through `environment_factory` with an async tool (one run a side);
     `--tool-latency off` trains it with an instant tool: the gain without waits to overlap;
  4. evaluates the warm-start and every final model the same way (greedy, the same 256
     held-out seeds, roll_agent's evaluator), compares the final rewards of each pair of runs
     (same RL seed) seed by seed and averages over the pairs (with the standard error between
     pairs), prints the table, writes docs/vs_trl.png and a last line `RESULT ...`.

Same for both: checkpoint and tokenizer, prompts (token ids checked equal), reward code,
trained samples (steps x groups x group size), group size, batch, micro-batch, learning
rate (constant), AdamW betas, grad clip, clip epsilon, token-mean loss, temperature, max
tokens, max turns. Wall-clock = the training loop's time (first step to last), model
loading excluded on both sides. tokens/sample: generated tokens per trained sample as each
framework counts them (TRL's `completions/mean_length`): samples/s depends on how long the
policy's answers grow during the run, which differs from run to run on both sides.

Cores: each side's CPU-seconds (user + system: every thread, and roll_agent's trainer child
process) from the end of its first training step to the end of its last, over the wall
time between and the samples of those steps (`StepCpu` here, `Clock` in trl_side.py).
roll_agent is compared (speed ratio, reward pairs) with the fastest TRL thread setting.
`--async-ratios 2 0` adds synchronous roll_agent runs on the same seeds (the reward that async
training costs, if any), compared with both the headline runs and TRL; `--roll-threads 0 1`
adds runs with one torch thread per process (speed against the default's: `st_speed_th1`).
`--roll-repeats K` runs each of roll_agent's seeds K times: TRL is synchronous and seeded and
repeats exactly, ours does not (the async interleaving decides which samples a step trains on),
so one run's final reward per seed is one draw; the pairs then compare, seed by seed, the mean
of our K runs with TRL's one (the standard error still between the seed pairs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from statistics import mean, stdev

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.common import result_line, table  # noqa: E402
from benchmarks.vs_trl import tasks  # noqa: E402
from benchmarks.vs_trl.models import SFT_STEPS, evaluate_model, prepare_models  # noqa: E402
from roll_agent.checkpoint import Checkpointer  # noqa: E402
from roll_agent.config import Config, EnvSpec, RolloutConfig  # noqa: E402
from roll_agent.config_loader import load_config  # noqa: E402
from roll_agent.metrics import read_rows  # noqa: E402
from roll_agent.run import train  # noqa: E402

# after roll_agent, as in `python -m roll_agent.run`: roll_agent sets OpenMP's wait policy before torch loads it
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# lr: 1e-3 (used first) wrecks a warm-started policy (ours from the default warm-starts: single-turn
# greedy 0.92 -> 0.70, multi-turn 0.98 -> 0.00; both frameworks from a 200-step single-turn one:
# 0.82 -> 0.32 / 0.24); 1e-4 keeps it and lets RL refine it
HP = {"group_size": 8, "groups_per_batch": 4, "micro_batch_size": 8, "lr": 1e-4, "temperature": 1.0, "clip": 0.2,
      "seed": 0}
# torch intra-op threads of this process's warm-up and evaluation. The runs: roll_agent at
# --roll-threads (default: its own default, runtime.torch_threads=0: half the CPUs for each of its
# two processes), TRL at each --trl-threads.
# torch's default (one per core) once made TRL 5-20x slower on the shared 2-core machine
# (OpenMP threads spinning against other jobs): hence both sides' CPU use is printed.
THREADS = 1
TORCH_DEFAULT_THREADS = torch.get_num_threads()  # before main() sets THREADS: what a user's run starts with
SETTINGS = {  # steps: optimizer steps (x 32 trained samples); max_tokens: per completion
    # single-turn steps take ~0.1-0.25 s: 40 of them, so the first (cold, nothing to overlap) and
    # the machine's noise weigh less on both sides than in the 20 steps measured before.
    # runs: training runs per framework, RL seeds 0..runs-1 (the same checkpoint). One run's final
    # single-turn reward varies by ~0.005 (ours, seed 0: 0.927-0.950 over a dozen runs; TRL, seeds 0-7:
    # 0.939-0.958), as much as the gap to measure, so the single-turn task is run with 8 seeds
    # and compared pair by pair. A single-turn run takes ~30 s a side with its evaluation, a
    # multi-turn one ~100 s on TRL's side.
    tasks.SINGLE_TURN: {"steps": 40, "max_tokens": 16, "max_turns": 1, "runs": 8},
    tasks.MULTI_TURN: {"steps": 12, "max_tokens": 96, "max_turns": 3, "runs": 1},
}


def roll_agent_config(task: str, model: str, out: Path, setting: dict, prompt_len: int, seed: int,
                      threads: int = 0, async_ratio: int = 2) -> Config:
    # As many env groups as a batch takes: no group-level redundancy. With more (6 for 4-group
    # batches, used before) training outpaced generation here, the groups beyond the async
    # window were dropped as stale, and those are the slowest to finish: the hardest tasks
    # (single-turn, 8 seeds: 6-letter words trained 73% as often as they were drawn, 3-letter
    # ones 97%), which cost ~0.3 points of final reward against TRL's uniform data. With 4
    # none is dropped and samples/s is the same (single-turn 311-383 vs 326-383; multi-turn 39 vs 40).
    cfg = load_config(None, [
        f"output_dir={out}", f"max_steps={setting['steps']}", f"seed={seed}", f"model.path={model}",
        f"rollout.async_ratio={async_ratio}", f"rollout.num_env_groups={HP['groups_per_batch']}",
        f"rollout.groups_per_batch={HP['groups_per_batch']}",
        f"rollout.group_size={HP['group_size']}", "rollout.group_size_redundancy=1",
        f"rollout.max_turns={setting['max_turns']}", f"rollout.max_new_tokens={setting['max_tokens']}",
        # like TRL's max_completion_length: a cap per turn and on the whole completion (tool results included)
        f"rollout.max_context_tokens={prompt_len + setting['max_tokens']}",
        f"rollout.temperature={HP['temperature']}", "engine.type=hf", "engine.num_engines=1",
        f"trainer.lr={HP['lr']}", f"trainer.micro_batch_size={HP['micro_batch_size']}", "trainer.updates_per_batch=1",
        "algorithm.advantage=grpo", "algorithm.loss=ppo", "algorithm.kl_coef=0.0", f"algorithm.clip_low={HP['clip']}",
        f"algorithm.clip_high={HP['clip']}", "algorithm.aggregation=token-mean",
        f"runtime.torch_threads={threads}", "warmup.sft_steps=0", "eval.num_episodes=0", "checkpoint.every=0",
        "logging.progress=false", "logging.backends=[jsonl]", "logging.plot=false",
    ])
    cfg.envs = [EnvSpec(id=tasks.ENV_IDS[task], kwargs=tasks.train_kwargs(task))]
    return cfg


class StepCpu(threading.Thread):
    """CPU seconds (user + system) of this process (engine, controller) and its children (the
    trainer process) whenever a training step's metrics row appears: the counterpart of
    trl_side.Clock's marks, so both sides are measured over the same window (first step's end
    to last step's end) and samples (the steps between)."""

    def __init__(self, metrics: Path):
        super().__init__(daemon=True)
        self.metrics = metrics
        self.marks: list[tuple[int, float, float]] = []  # (steps done, wall, CPU seconds)
        self.done = threading.Event()

    def run(self) -> None:
        me, size = psutil.Process(), -1
        while not self.done.wait(0.01):
            try:
                if self.metrics.stat().st_size == size:
                    continue
                text = self.metrics.read_text()
            except FileNotFoundError:
                continue
            size, steps = len(text.encode()), text.count('"loss":')
            if steps and (not self.marks or steps > self.marks[-1][0]):
                self.marks.append((steps, time.perf_counter(), _cpu_seconds(me)))

    def window(self, rows: list[dict]) -> dict:
        (first, wall0, cpu0), (last, wall1, cpu1) = self.marks[0], self.marks[-1]
        return {"seconds": cpu1 - cpu0, "wall_s": wall1 - wall0,
                "samples": sum(r["episodes"] for r in rows[first:last])}


def _cpu_seconds(proc: psutil.Process) -> float:
    total = 0.0
    for p in (proc, *proc.children(recursive=True)):
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def run_roll_agent(cfg: Config) -> dict:
    out = Path(cfg.output_dir)
    meter = StepCpu(out / "metrics.jsonl")
    meter.start()
    torch.set_num_threads(cfg.runtime.torch_threads or TORCH_DEFAULT_THREADS)  # as `python -m roll_agent.run` would
    try:
        asyncio.run(train(cfg))
    finally:
        torch.set_num_threads(THREADS)
        meter.done.set()
        meter.join()
    rows = [r for r in read_rows(out / "metrics.jsonl") if "time_step_s" in r]
    clock, curve = 0.0, []
    for r in rows:
        clock += r["time_step_s"]
        curve.append((clock, r["reward_mean"]))
    return {"seconds": clock, "samples": sum(r["episodes"] for r in rows), "curve": curve, "cpu": meter.window(rows),
            "model": str(Checkpointer(out).latest() / "model"),
            "staleness": sum(r["staleness_mean"] for r in rows) / len(rows),
            # every turn but the last is a tool call (single-turn: none)
            "tool_calls": sum(r["episode_len_mean"] for r in rows) / len(rows) - 1,
            "tokens_per_sample": sum(r["train_tokens"] for r in rows) / sum(r["episodes"] for r in rows)}


def run_trl(task: str, model: str, root: Path, python: str, probe_seed: int, threads: int, seed: int) -> dict:
    out = root / f"trl-{task}-{seed}-{threads}t"
    out.mkdir(parents=True, exist_ok=True)
    spec = {"task": task, "model": model, "out": str(out), "hp": {**HP, "seed": seed}, "probe_seed": probe_seed,
            "torch_threads": threads, "tool_latency": tasks.TOOL_LATENCY, **SETTINGS[task]}
    (out / "spec.json").write_text(json.dumps(spec))
    env = dict(os.environ, PYTHONPATH=str(ROOT), TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([python, str(Path(__file__).with_name("trl_side.py")), str(out / "spec.json")],
                          env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"TRL run failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads((out / "result.json").read_text())


def train_reward(curve: list) -> float:
    """Mean batch reward over all steps (sampled, as trained). Over the whole run both sides
    train on the same tasks (the RL seed draws them: `tasks.train_seeds`), TRL in a shuffled
    order; with 4 tasks a step, a part of the run (its last quarter, shown before) compares
    different tasks, whose difficulty differs more than the two frameworks do."""
    return sum(r for _, r in curve) / len(curve)


def paired_difference(ours: dict[int, float], theirs: dict[int, float]) -> tuple[float, float]:
    """Mean of ours - theirs over the same seeds, and its standard error."""
    diffs = [ours[s] - theirs[s] for s in ours]
    return mean(diffs), (stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else 0.0)


def reward_difference(ours: list[dict], theirs: list[dict]) -> tuple[float, float]:
    """Final reward, ours - theirs: each pair of runs (same RL seed) compared over the same eval
    seeds, then averaged over the pairs. The standard error is the spread between pairs (which
    holds the runs' own luck, the larger part); with one pair, the spread over eval seeds."""
    pairs = [paired_difference(a["eval_rewards"], b["eval_rewards"]) for a, b in zip(ours, theirs, strict=True)]
    if len(pairs) == 1:
        return pairs[0]
    diffs = [d for d, _ in pairs]
    return mean(diffs), stdev(diffs) / math.sqrt(len(diffs))


def seed_means(runs: list[dict], repeats: int) -> list[dict]:
    """Each RL seed's `repeats` consecutive runs as one: their final rewards averaged per eval seed."""
    chunks = [runs[i:i + repeats] for i in range(0, len(runs), repeats)]
    return [{"eval_rewards": {s: mean(r["eval_rewards"][s] for r in chunk) for s in chunk[0]["eval_rewards"]}}
            for chunk in chunks]


def combine(runs: list[dict]) -> dict:
    """One framework's runs of a task as one row: samples and seconds summed, the rest averaged."""
    out = {key: mean(r[key] for r in runs) for key in
           ("tool_calls", "tokens_per_sample", "train_reward", "eval_reward")}
    out.update(samples=sum(r["samples"] for r in runs), seconds=sum(r["seconds"] for r in runs), runs=runs)
    out["samples_per_s"] = out["samples"] / out["seconds"]
    cpu = {key: sum(r["cpu"][key] for r in runs) for key in ("seconds", "wall_s", "samples")}
    # nan for runs of one step: the window runs from the first step's end to the last's
    out["cpu_s_per_sample"] = cpu["seconds"] / cpu["samples"] if cpu["samples"] else math.nan
    out["cores"] = cpu["seconds"] / cpu["wall_s"] if cpu["wall_s"] else math.nan  # cores busy on average while training
    return out


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, task in zip(axes, (tasks.SINGLE_TURN, tasks.MULTI_TURN)):
        for name, style in (("roll_agent", "-o"), ("TRL", "-s")):
            curves = [run["curve"] for run in results[task][name]["runs"]]
            steps = min(len(c) for c in curves)  # step by step, the mean over the RL seeds
            ax.plot([mean(c[i][0] for c in curves) for i in range(steps)],
                    [mean(c[i][1] for c in curves) for i in range(steps)], style, ms=3,
                    label=f"{name} ({len(curves)} run{'s' if len(curves) > 1 else ''})")
        ax.set(title=task.replace("_", "-"), xlabel="wall-clock (s)", ylabel="batch reward (mean)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"roll_agent vs TRL GRPOTrainer, same tiny model, {HP['group_size'] * HP['groups_per_batch']} "
                 "samples per step")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def trl_name(threads: int) -> str:
    return f"TRL {threads}t" if threads else "TRL default-threads"


def roll_arms(ratios: list[int], threads: list[int]) -> dict[str, tuple[int, int, str]]:
    """roll_agent's sets of runs by name: (async ratio, torch threads, RESULT key). The headline
    runs at the first of each; every other ratio at the first thread count, every other thread
    count at the first ratio."""
    arms = {"roll_agent": (ratios[0], threads[0], "")}
    arms.update({f"roll_agent async_ratio={r}": (r, threads[0], f"ar{r}") for r in ratios[1:]})
    arms.update({f"roll_agent threads={t}": (ratios[0], t, f"th{t}") for t in threads[1:]})
    return arms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trl-python", default="/work/venv-trl/bin/python", help="TRL's virtual environment")
    ap.add_argument("--plot", default=str(ROOT / "docs" / "vs_trl.png"))
    ap.add_argument("--trl-threads", type=int, nargs="+", default=[1, 2],
                    help="torch intra-op threads of the TRL process, one set of TRL runs each (0: torch's default, "
                         "one per core); roll_agent is compared with the fastest")
    ap.add_argument("--roll-threads", type=int, nargs="+", default=[0],
                    help="runtime.torch_threads of the roll_agent runs (0: its default, the CPUs split between "
                         "the engine's and the trainer's process); "
                         "the first is the headline, others (e.g. 0 1) add runs at the headline's async ratio")
    ap.add_argument("--async-ratios", type=int, nargs="+", default=[2],
                    help="rollout.async_ratio of the roll_agent runs, one set of runs each (same RL seeds); the first "
                         "is the headline, the others are compared with it and with TRL (e.g. 2 0: synchronous too)")
    ap.add_argument("--tool-latency", choices=("on", "off"), default="on",
                    help="the tool task's calculator latency while training (off: the gain without tools to overlap)")
    ap.add_argument("--eval-episodes", type=int, default=256, help="greedy held-out episodes per final model")
    ap.add_argument("--sft-steps", type=int, nargs=2, default=None, metavar=("SINGLE", "MULTI"),
                    help="warm-start steps per task (32 demonstrations each); default "
                         f"{SFT_STEPS[tasks.SINGLE_TURN]} {SFT_STEPS[tasks.MULTI_TURN]}")
    ap.add_argument("--steps", type=int, nargs=2, default=None, metavar=("SINGLE", "MULTI"),
                    help="optimizer steps per run (32 trained samples each); default "
                         f"{SETTINGS[tasks.SINGLE_TURN]['steps']} {SETTINGS[tasks.MULTI_TURN]['steps']}")
    ap.add_argument("--runs", type=int, nargs=2, default=None, metavar=("SINGLE", "MULTI"),
                    help="training runs per framework (RL seeds 0..N-1); default "
                         f"{SETTINGS[tasks.SINGLE_TURN]['runs']} {SETTINGS[tasks.MULTI_TURN]['runs']}")
    ap.add_argument("--lr", type=float, default=HP["lr"], help="RL learning rate, both sides")
    ap.add_argument("--roll-repeats", type=int, default=1,
                    help="roll_agent runs per RL seed (the reward pairs use their mean; TRL repeats exactly)")
    args = ap.parse_args()
    HP["lr"] = args.lr
    if args.tool_latency == "off":
        tasks.TOOL_LATENCY.update(tasks.NO_LATENCY)
    if args.runs:
        SETTINGS[tasks.SINGLE_TURN]["runs"], SETTINGS[tasks.MULTI_TURN]["runs"] = args.runs
    if args.steps:
        SETTINGS[tasks.SINGLE_TURN]["steps"], SETTINGS[tasks.MULTI_TURN]["steps"] = args.steps
    if not Path(args.trl_python).exists():
        sys.exit(f"No TRL interpreter at {args.trl_python}: create the venv (docs/performance.md, "
                 "'roll_agent vs TRL') or pass --trl-python")
    torch.set_num_threads(THREADS)  # warm-up and evaluation; the runs set their own
    start, load0 = time.perf_counter(), os.getloadavg()[0]
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="vs_trl_") as tmp:
        root = Path(tmp)
        sft_steps = dict(zip((tasks.SINGLE_TURN, tasks.MULTI_TURN), args.sft_steps)) if args.sft_steps else SFT_STEPS
        models = prepare_models(root, HP["seed"], {task: RolloutConfig(max_turns=SETTINGS[task]["max_turns"],
                                                                      max_new_tokens=SETTINGS[task]["max_tokens"])
                                                   for task in SETTINGS}, sft_steps)
        print(f"models ready ({time.perf_counter() - start:.0f} s)", flush=True)
        eval_seeds = [10_000_000 + i for i in range(args.eval_episodes)]
        for task in (tasks.SINGLE_TURN, tasks.MULTI_TURN):
            model, probe_seed, probe_ids = models[task]
            arms = roll_arms(args.async_ratios, args.roll_threads)
            runs: dict[str, list[dict]] = {**{name: [] for name in arms}, **{trl_name(n): [] for n in args.trl_threads}}
            rollout_cfg = roll_agent_config(task, model, root / "eval", SETTINGS[task], len(probe_ids), 0).rollout
            start_reward = mean(evaluate_model(task, model, eval_seeds, rollout_cfg).values())  # the warm-start
            for seed in range(SETTINGS[task]["runs"]):
                done = {f"{name}#{rep}": run_roll_agent(roll_agent_config(
                            task, model, root / f"roll_agent-{task}-{seed}-{ratio}-{threads}t-{rep}", SETTINGS[task],
                            len(probe_ids), seed, threads, ratio))
                        for name, (ratio, threads, _) in arms.items() for rep in range(args.roll_repeats)}
                for n in args.trl_threads:
                    done[trl_name(n)] = run_trl(task, model, root, args.trl_python, probe_seed, n, seed)
                    if done[trl_name(n)]["prompt_ids"] != probe_ids:
                        raise RuntimeError(f"{task}: TRL and roll_agent prompt the model differently; fix the task setup")
                print(f"{task} seed {seed}: " + ", ".join(f"{k} {v['seconds']:.1f} s" for k, v in done.items()), flush=True)
                for name, res in done.items():
                    res["eval_rewards"] = evaluate_model(task, res["model"], eval_seeds, rollout_cfg)
                    res["eval_reward"] = mean(res["eval_rewards"].values())
                    res["train_reward"] = train_reward(res["curve"])
                    runs[name.partition("#")[0]].append(res)
            results[task] = {name: combine(rs) for name, rs in runs.items()}
            pairs = {name: seed_means(rs, args.roll_repeats if name in arms else 1) for name, rs in runs.items()}
            # the peer at its best: the TRL thread setting with the most samples/s on this task
            best = max((trl_name(n) for n in args.trl_threads), key=lambda k: results[task][k]["samples_per_s"])
            results[task].update(TRL=results[task][best], trl_best=best, start_reward=start_reward,
                                 difference=reward_difference(pairs["roll_agent"], pairs[best]),
                                 arms={name: {"vs_trl": reward_difference(pairs[name], pairs[best]),
                                              "vs_headline": reward_difference(pairs[name], pairs["roll_agent"])}
                                       for name in list(arms)[1:]})
    report(results, args, time.perf_counter() - start, load0)


def report(results: dict, args, elapsed: float, load0: float) -> None:
    rows, ratios, diffs = [], {}, {}
    for task, pair in results.items():
        names = list(roll_arms(args.async_ratios, args.roll_threads)) + [trl_name(n) for n in args.trl_threads]
        for name in names:
            res = pair[name]
            rows.append((task, name + (" (fastest)" if name == pair["trl_best"] else ""), len(res["runs"]),
                         int(res["samples"]), res["seconds"], res["samples_per_s"], res["cores"],
                         res["cpu_s_per_sample"] * 1000, res["tool_calls"], res["tokens_per_sample"],
                         res["train_reward"], pair["start_reward"], res["eval_reward"]))
        ratios[task] = pair["roll_agent"]["samples_per_s"] / pair["TRL"]["samples_per_s"]
        diffs[task] = pair["difference"]
    print(f"\nsame checkpoint, G={HP['group_size']}, {HP['groups_per_batch']} groups/step, lr={HP['lr']}; "
          f"{elapsed:.0f} s in all; load average {load0:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(table(rows, ("task", "framework", "runs", "samples", "wall_s", "samples/s", "cores", "cpu_ms/sample",
                       "tool_calls/sample", "tokens/sample", "train_reward", "start_eval_reward", "eval_reward")))
    print("cores: CPU-seconds (user + system, every thread and child process) per wall-second while training; "
          "ratios and reward pairs are against the fastest TRL setting")
    for task, (diff, se) in diffs.items():
        per_run = {name: " ".join(f"{r['eval_reward']:.3f}" for r in results[task][name]["runs"])
                   for name in ("roll_agent", "TRL")}
        n = len(results[task]["TRL"]["runs"])
        over = f"{n} seed pairs" if n > 1 else f"{args.eval_episodes} eval seeds"
        if args.roll_repeats > 1:
            over += f", ours the mean of {args.roll_repeats} runs a seed"
        verdict = "equal or better" if diff >= -2 * se else "worse"
        print(f"{task}: final reward per run (RL seed by seed): roll_agent {per_run['roll_agent']}, TRL {per_run['TRL']}; "
              f"roll_agent - TRL = {diff:+.3f} (standard error {se:.3f}, over {over}): {verdict} at 2 standard errors")
        for name, arm in results[task]["arms"].items():
            runs = " ".join(f"{r['eval_reward']:.3f}" for r in results[task][name]["runs"])
            print(f"{task}: {name}: final reward per RL seed {runs}; - TRL = {arm['vs_trl'][0]:+.3f} "
                  f"(se {arm['vs_trl'][1]:.3f}), - roll_agent = {arm['vs_headline'][0]:+.3f} (se {arm['vs_headline'][1]:.3f})")
    plot(results, Path(args.plot))
    print(f"plot: {args.plot}")
    st, mt = results[tasks.SINGLE_TURN], results[tasks.MULTI_TURN]
    arms = {}  # each extra set of runs: its single-turn reward against TRL and the headline's, its speed against ours
    for name, (_, _, key) in list(roll_arms(args.async_ratios, args.roll_threads).items())[1:]:
        arm = st["arms"][name]
        arms.update({f"st_reward_diff_{key}": arm["vs_trl"][0], f"st_reward_diff_{key}_se": arm["vs_trl"][1],
                     f"st_reward_gain_{key}": arm["vs_headline"][0], f"st_reward_gain_{key}_se": arm["vs_headline"][1],
                     f"st_speed_{key}": st[name]["samples_per_s"] / st["roll_agent"]["samples_per_s"],
                     f"mt_speed_{key}": mt[name]["samples_per_s"] / mt["roll_agent"]["samples_per_s"]})
    print(result_line(
        single_turn_ratio=ratios[tasks.SINGLE_TURN], multi_turn_ratio=ratios[tasks.MULTI_TURN],
        st_reward_roll=st["roll_agent"]["eval_reward"], st_reward_trl=st["TRL"]["eval_reward"],
        mt_reward_roll=mt["roll_agent"]["eval_reward"], mt_reward_trl=mt["TRL"]["eval_reward"],
        st_reward_start=st["start_reward"], mt_reward_start=mt["start_reward"],
        st_reward_diff=diffs[tasks.SINGLE_TURN][0], st_reward_diff_se=diffs[tasks.SINGLE_TURN][1],
        mt_reward_diff=diffs[tasks.MULTI_TURN][0], mt_reward_diff_se=diffs[tasks.MULTI_TURN][1],
        st_sps_roll=st["roll_agent"]["samples_per_s"], st_sps_trl=st["TRL"]["samples_per_s"],
        st_tokens_roll=st["roll_agent"]["tokens_per_sample"], st_tokens_trl=st["TRL"]["tokens_per_sample"],
        mt_sps_roll=mt["roll_agent"]["samples_per_s"], mt_sps_trl=mt["TRL"]["samples_per_s"],
        st_cores_roll=st["roll_agent"]["cores"], st_cores_trl=st["TRL"]["cores"],
        st_cpu_ms_per_sample_roll=st["roll_agent"]["cpu_s_per_sample"] * 1000,
        st_cpu_ms_per_sample_trl=st["TRL"]["cpu_s_per_sample"] * 1000,
        mt_cores_roll=mt["roll_agent"]["cores"], mt_cores_trl=mt["TRL"]["cores"],
        st_trl_threads=st["TRL"]["runs"][0]["torch_threads"], mt_trl_threads=mt["TRL"]["runs"][0]["torch_threads"],
        **arms, roll_repeats=args.roll_repeats, tool_latency=args.tool_latency, total_s=round(elapsed)))


if __name__ == "__main__":
    main()
