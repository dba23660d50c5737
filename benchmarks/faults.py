"""Trained samples/s with faulty envs (10% of steps raise, 5% hang) vs fault-free, side by side,
at the default run's topology (the headline) and at a tuned one.

Both arms of a topology run the same config in this process, alternating (A B A B ...) so machine noise
hits both: the real rollout stack (LLMProxy + scripted engines, EnvManagers, groups,
SampleBuffer) on the simulated env, with the trainer played by a fixed sleep per step.
A third pair of arms ("real trainer") runs the real `train()` of configs/default.yaml (the
tiny model on the hf engine, the torch trainer in its process, weight sync every step) on the
same simulated env, faulty vs fault-free: the first `--skip` steps (start-up) are left out.

Why hangs could cost throughput: a hung step holds its env until `step_timeout_s`, and a
group waiting on it cannot complete. The design's answers, both on in both arms:
- a short step timeout relative to the step latency: steps take ~normal(50 ms, 20 ms), so
  the timeout is 0.5 s (10x the mean, >20 std above it: a healthy step never hits it);
- redundancy: each group runs `group_size + group_size_redundancy` envs and completes at
  the first `group_size` good episodes (the hung and failed ones are cancelled or ignored),
  and more groups run than a batch needs, so a group that cannot complete does not hold
  the batch.
Faults are per env instance and step (transient infrastructure faults, not broken tasks).
The accounting identity (started == finished + truncated + cancelled + env_error +
stale_dropped + in flight) is checked after every batch and after shutdown.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import SIM_ID, build_stack, make_formatter, result_line, sim_spec, table  # noqa: E402
from roll_agent.config import Config, EnvSpec, RolloutConfig, ScriptedEngineConfig  # noqa: E402
from roll_agent.config_loader import load_config  # noqa: E402
from roll_agent.controller import update_weights  # noqa: E402
from roll_agent.metrics import read_rows  # noqa: E402
from roll_agent.run import train  # noqa: E402
from roll_agent.tiny_model import prepare_model  # noqa: E402


async def run_arm(formatter, cfg: RolloutConfig, env: dict, engine_cfg, batches: int, train_s: float) -> dict:
    stack = build_stack(formatter, cfg, [sim_spec(**env)], engine_cfg)
    identity_ok = True
    samples = 0
    stack.scheduler.start()
    start = time.perf_counter()
    try:
        for v in range(batches):
            batch = await stack.buffer.get_batch(v)
            samples += sum(len(g.trajectories) for g in batch)
            identity_ok &= stack.stats().accounting()["accounting_ok"]
            await asyncio.sleep(train_s)  # the trainer's step; rollout goes on meanwhile
            await update_weights(stack, v + 1)
        seconds = time.perf_counter() - start
    finally:
        await stack.close()
    acc = stack.stats().accounting()
    return {"samples_per_s": samples / seconds, "seconds": seconds, "samples": samples,
            "accounted": identity_ok and acc["accounting_ok"], "stuck": stack.watchdog.stats["stuck_env"], **acc}


def real_config(out: Path, env: dict, args) -> Config:
    """configs/default.yaml as a user runs it, on the simulated env: only the measurement's knobs set."""
    cfg = load_config(None, [
        f"output_dir={out}", f"max_steps={args.real_steps}", "rollout.max_turns=4",
        f"rollout.step_timeout_s={args.step_timeout_s}", "warmup.sft_steps=0", "eval.num_episodes=0",
        "checkpoint.every=0", "logging.progress=false", "logging.backends=[jsonl]", "logging.plot=false"])
    cfg.envs = [EnvSpec(id=SIM_ID, kwargs=env)]
    return cfg


def run_real(root: Path, model_path: str, env: dict, args, tag: str) -> dict:
    out = root / tag
    cfg = real_config(out, env, args)
    cfg.model.path = model_path
    asyncio.run(train(cfg))
    rows = [r for r in read_rows(out / "metrics.jsonl") if "time_step_s" in r]
    timed = rows[args.skip:]
    seconds = sum(r["time_step_s"] for r in timed)
    last = rows[-1]
    return {"samples_per_s": sum(r["episodes"] for r in timed) / seconds, "seconds": seconds,
            "accounted": all(r["accounting_ok"] for r in rows), "stuck": last.get("watchdog_stuck_env", 0),
            "accounting_ok": last["accounting_ok"], "episodes_in_flight": last.get("episodes_in_flight", 0),
            **{k: v for k, v in last.items() if k.startswith("episodes_total_")}}


def topologies(args) -> dict[str, RolloutConfig]:
    """The default run's (configs/default.yaml's rollout section: 8 groups of 8 + 1 redundant env,
    8-group batches) and the tuned one (`--lanes` groups of `--group-size` + `--redundancy`)."""
    default = dataclasses.replace(load_config(None).rollout, async_ratio=2, max_turns=4,
                                  step_timeout_s=args.step_timeout_s)
    return {"default": default,
            "tuned": dataclasses.replace(default, num_env_groups=args.lanes, groups_per_batch=args.groups_per_batch,
                                         group_size=args.group_size, group_size_redundancy=args.redundancy)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=2, help="A/B alternations")
    ap.add_argument("--fail", type=float, default=0.10)
    ap.add_argument("--hang", type=float, default=0.05)
    ap.add_argument("--step-ms", type=float, default=50.0)
    ap.add_argument("--step-timeout-s", type=float, default=0.5)
    ap.add_argument("--train-s", type=float, default=0.1)
    ap.add_argument("--group-size", type=int, default=4, help="the tuned topology's group size")
    ap.add_argument("--redundancy", type=int, default=4, help="the tuned topology's redundant envs per group")
    ap.add_argument("--lanes", type=int, default=12, help="the tuned topology's env groups")
    ap.add_argument("--groups-per-batch", type=int, default=8, help="the tuned topology's groups per batch")
    ap.add_argument("--real-steps", type=int, default=8, help="training steps of each real-trainer run (0: no "
                    "real-trainer arms)")
    ap.add_argument("--skip", type=int, default=2, help="real trainer: start-up steps left out of the rate")
    args = ap.parse_args()
    logging.getLogger("roll_agent.watchdog").setLevel(logging.ERROR)  # one line per hung step: counted instead

    configs = topologies(args)
    mean = args.step_ms / 1000
    clean = dict(latency="normal", mean_s=mean, std_s=0.4 * mean, episode_len=3)
    faulty = dict(clean, fail_prob=args.fail, hang_prob=args.hang, hang_s=3600.0)
    engine_cfg = ScriptedEngineConfig(response_tokens=4, token_latency_s=0.002)
    formatter = make_formatter()
    topology_names = [*configs, "real trainer"] if args.real_steps else list(configs)
    arms: dict[tuple[str, str], list[dict]] = {(t, a): [] for t in topology_names for a in ("fault-free", "faulty")}
    with tempfile.TemporaryDirectory(prefix="faults_") as tmp:
        root = Path(tmp)
        if args.real_steps:
            real_cfg = real_config(root / "unused", clean, args)
            model_path = prepare_model(real_cfg, root)
            configs["real trainer"] = real_cfg.rollout
        for rnd in range(args.rounds):
            for (topology, name), results in arms.items():
                env = clean if name == "fault-free" else faulty
                if topology == "real trainer":
                    results.append(run_real(root, model_path, env, args, f"{name}-{rnd}"))
                else:
                    results.append(asyncio.run(run_arm(formatter, configs[topology], env, engine_cfg, args.batches,
                                                       args.train_s)))

    rows, rate = [], {}
    for (topology, name), results in arms.items():
        last = results[-1]
        rate[topology, name] = statistics.mean(r["samples_per_s"] for r in results)
        cfg = configs[topology]
        rows.append((topology, f"{cfg.num_env_groups} x ({cfg.group_size}+{cfg.group_size_redundancy})", name,
                     rate[topology, name], last["episodes_total_started"],
                     last["episodes_total_finished"] + last["episodes_total_truncated"],
                     last["episodes_total_cancelled"], last["episodes_total_env_error"],
                     last["episodes_total_stale_dropped"], last["episodes_in_flight"], last["stuck"],
                     str(last["accounting_ok"])))
    print(f"{args.fail:.0%} failing steps, {args.hang:.0%} hanging steps; step ~normal({args.step_ms:.0f} ms, "
          f"{0.4 * args.step_ms:.0f} ms), step_timeout_s={args.step_timeout_s}, train step {args.train_s}s, "
          f"async ratio 2, {args.batches} batches x {args.rounds} rounds per arm; real trainer: "
          f"{args.real_steps} steps of configs/default.yaml's train() (first {args.skip} not timed)")
    print(table(rows, ("topology", "groups x (size+redundant)", "arm", "samples/s", "started", "trained",
                       "cancelled", "env_error", "stale", "in_flight", "stuck_steps", "identity")))
    ratio = {t: rate[t, "faulty"] / rate[t, "fault-free"] for t in topology_names}
    for t, r in ratio.items():
        print(f"{t}: faulty / fault-free = {r:.2f}x")
    if ratio["default"] < 0.8:
        tuned = configs["tuned"]
        print(f"to hold 0.8x with faults like these, give each group more redundant envs and run more groups "
              f"than a batch takes: rollout.group_size_redundancy={tuned.group_size_redundancy} "
              f"rollout.num_env_groups={tuned.num_env_groups} for {tuned.groups_per_batch}-group batches "
              f"(the tuned topology: {ratio['tuned']:.2f}x)")
    accounted = all(r["accounted"] for results in arms.values() for r in results)
    real = {"real_trainer_ratio": ratio["real trainer"]} if args.real_steps else {}
    print(result_line(ratio=ratio["default"], tuned_ratio=ratio["tuned"], **real, accounted=str(accounted).lower(),
                      faulty_samples_per_s=rate["default", "faulty"], clean_samples_per_s=rate["default", "fault-free"],
                      fail=args.fail, hang=args.hang, step_timeout_s=args.step_timeout_s))


if __name__ == "__main__":
    main()
