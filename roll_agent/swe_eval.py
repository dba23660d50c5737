"""Evaluate SWE predictions in sandboxes: `python -m roll_agent.swe_eval`.

    python -m roll_agent.swe_eval --dataset data/swe_tasks/tasks.jsonl --predictions gold \\
        --sandbox docker --workers 4 --output-dir runs/eval
    python -m roll_agent.swe_eval --dataset D.jsonl --predictions preds.jsonl ...   # SWE-bench predictions
    python -m roll_agent.swe_eval --dataset D.jsonl --policy outputs/swe ...        # roll a policy out first

Writes DIR/report.json (SWE-bench report fields: total/submitted/completed/resolved/
unresolved/empty_patch/error counts and the id lists, plus each instance's status and
reason) and DIR/logs/<instance_id>/ (patch.diff, run_instance.log: every grading step,
test_output.txt, result.json: our whole record, and for a completed instance report.json
in the official harness's shape, `{id: {patch_successfully_applied, resolved,
tests_status}}`, so tooling written for its logs reads ours). A malformed dataset line
is an error instance; the others are still evaluated.

Speed: pytest stops at the first FAIL_TO_PASS/PASS_TO_PASS test that fails (that test
decides "unresolved"; --no-fail-fast runs everything); sandboxes are started ahead of
the workers and closed behind them (container start and removal, ~0.3 s each, overlap
test runs); commands reach a docker sandbox
through its command server (a fork, ~5 ms) instead of one `docker exec` each; and the
patches travel inside the first command instead of as file uploads.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import yaml

from envs.swe.grading import EMPTY_PATCH, ERROR, RESOLVED, UNRESOLVED, GradeResult, grade, instance_problem
from envs.swe.instance import MalformedInstance, SWEInstance, gold_predictions, load_instances, load_predictions
from envs.swe.sources import BACKENDS, prepare_sandbox

SCHEMA_VERSION = 2


def evaluate(instances: list[SWEInstance], predictions: dict[str, dict], sandbox: str = "docker", workers: int = 1,
             timeout: float = 1800.0, partial_credit: bool = False, sandbox_options: dict | None = None,
             on_result: Callable[[GradeResult], None] | None = None,
             fail_fast: bool = True) -> dict[str, GradeResult]:
    """Grade every instance that has a prediction, `workers` at a time; {instance_id: result}."""
    todo = [i for i in instances if i.instance_id in predictions]
    patches = {i.instance_id: predictions[i.instance_id]["model_patch"] for i in todo}
    ahead = threading.Semaphore(2 * workers)  # live sandboxes: started ahead, being graded, being closed

    def start(inst: SWEInstance):
        ahead.acquire()
        try:
            return prepare_sandbox(inst, sandbox, sandbox_options)
        except Exception:  # noqa: BLE001 - grade() starts one itself and records why it fails
            ahead.release()
            return None

    def close(sb) -> None:
        try:
            sb.close()
        finally:
            ahead.release()

    def run(inst: SWEInstance, started: Future | None) -> GradeResult:
        sb = started.result() if started else None
        try:
            result = grade(inst, patches[inst.instance_id], sandbox=sb or sandbox, timeout=timeout,
                           partial_credit=partial_credit, sandbox_options=sandbox_options, fail_fast=fail_fast)
        finally:
            if sb is not None:  # removing a container takes ~0.3 s: not on the worker's path
                closer.submit(close, sb)
        if on_result:
            on_result(result)
        return result

    with ThreadPoolExecutor(workers, thread_name_prefix="swe-close") as closer, \
            ThreadPoolExecutor(workers, thread_name_prefix="swe-start") as starter, \
            ThreadPoolExecutor(workers, thread_name_prefix="swe-grade") as graders:
        futures = []
        for inst in todo:
            needs_sandbox = patches[inst.instance_id].strip() and not instance_problem(inst, sandbox)
            started = starter.submit(start, inst) if needs_sandbox else None
            futures.append(graders.submit(run, inst, started))
        return {f.result().instance_id: f.result() for f in futures}


def make_report(dataset_ids: list[str], predictions: dict[str, dict], results: dict[str, GradeResult],
                malformed: list[MalformedInstance]) -> dict[str, Any]:
    """SWE-bench's report fields, plus each instance's status and reason."""
    ids: dict[str, list[str]] = {k: [] for k in ("submitted", "completed", "incomplete", "resolved", "unresolved",
                                                 "empty_patch", "error")}
    bad = {m.instance_id: m for m in malformed}
    for iid in [*dataset_ids, *bad]:
        result = results.get(iid)
        if iid in bad or result is not None:
            ids["submitted"].append(iid)
        if iid in bad:
            ids["error"].append(iid)
        elif result is None:
            ids["incomplete"].append(iid)  # no prediction for it
        elif result.status in (RESOLVED, UNRESOLVED):
            ids["completed"].append(iid)
            ids[result.status].append(iid)
        else:
            ids[result.status].append(iid)
    report: dict[str, Any] = {"total_instances": len(dataset_ids) + len(bad)}
    report.update({f"{k}_instances": len(v) for k, v in ids.items()})
    report.update({f"{k}_ids": sorted(v) for k, v in ids.items()})
    report["unknown_prediction_ids"] = sorted(set(predictions) - set(dataset_ids) - set(bad))
    report["instances"] = {**{m.instance_id: {"status": ERROR, "reason": m.reason} for m in malformed},
                           **{iid: {"status": r.status, "reason": r.reason, "reward": r.reward,
                                    "apply_method": r.apply_method, "stopped_at": r.stopped_at,
                                    "duration_s": round(r.duration_s, 3)}
                              for iid, r in results.items()}}
    report["schema_version"] = SCHEMA_VERSION
    return report


def _safe(instance_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", instance_id)[:200] or "_"


def write_instance_logs(log_dir: Path, result: GradeResult, patch: str) -> None:
    d = log_dir / _safe(result.instance_id)
    d.mkdir(parents=True, exist_ok=True)
    (d / "patch.diff").write_text(patch)
    (d / "run_instance.log").write_text(result.log or f"[not run: {result.status}] {result.reason}\n")
    (d / "test_output.txt").write_text(result.test_output)
    (d / "result.json").write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    if result.status in (RESOLVED, UNRESOLVED):  # the harness writes one for the instances it completed
        (d / "report.json").write_text(json.dumps(harness_report(result, patch), indent=2) + "\n")


def harness_report(result: GradeResult, patch: str) -> dict[str, Any]:
    """The official harness's per-instance report.json (its get_eval_report, tests_status included)."""
    none = {"success": [], "failure": []}
    return {result.instance_id: {
        "patch_is_None": False, "patch_exists": bool(patch.strip()),
        "patch_successfully_applied": bool(result.tests),  # the harness: a log it could read
        "resolved": result.resolved,
        "tests_status": {"FAIL_TO_PASS": result.fail_to_pass, "PASS_TO_PASS": result.pass_to_pass,
                         "FAIL_TO_FAIL": none, "PASS_TO_FAIL": none}}}


def run_eval(args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.monotonic()
    out = Path(args.output_dir)
    sandbox_options = _sandbox_options(args.sandbox, args.sandbox_option)
    instances, malformed = load_instances(args.dataset, fmt=args.format, errors="collect")
    if args.instance_ids:
        known = {i.instance_id for i in instances} | {m.instance_id for m in malformed}
        unknown = sorted(set(args.instance_ids) - known)
        if unknown:
            raise SystemExit(f"--instance-ids not in {args.dataset}: {', '.join(unknown)}")
        instances = [i for i in instances if i.instance_id in args.instance_ids]
        malformed = [m for m in malformed if m.instance_id in args.instance_ids]
    predictions = _predictions(args, instances, out)
    for m in malformed:
        print(f"error: {m.reason}", file=sys.stderr)
    bar = _progress(len([i for i in instances if i.instance_id in predictions]))
    lock = threading.Lock()
    counts: dict[str, int] = {}

    def done(result: GradeResult) -> None:
        write_instance_logs(out / "logs", result, predictions[result.instance_id]["model_patch"])
        with lock:
            bar.update(1)
            counts[result.status] = counts.get(result.status, 0) + 1
            bar.set_postfix(counts, refresh=False)

    results = evaluate(instances, predictions, args.sandbox, args.workers, args.timeout, args.partial_credit,
                       sandbox_options, on_result=done, fail_fast=not args.no_fail_fast)
    bar.close()
    report = make_report([i.instance_id for i in instances], predictions, results, malformed)
    report.update(dataset=str(args.dataset), predictions=args.predictions or f"policy:{args.policy}",
                  sandbox=args.sandbox, workers=args.workers, duration_s=round(time.monotonic() - t0, 2))
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def _predictions(args: argparse.Namespace, instances: list[SWEInstance], out: Path) -> dict[str, dict]:
    if args.policy:
        from roll_agent.swe_agent import generate_predictions

        path = generate_predictions(args.policy, args.dataset, str(out), instance_ids=args.instance_ids,
                                    sandbox=args.sandbox, workers=args.workers, overrides=args.override)
        return load_predictions(path)
    if args.predictions == "gold":
        return gold_predictions(instances)
    return load_predictions(args.predictions)


def _sandbox_options(backend: str, pairs: list[str]) -> dict[str, Any]:
    """KEY=VALUE pairs checked against the backend's config now, not once per instance later."""
    from sandboxes.config import make_config

    opts = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq:
            raise SystemExit(f"--sandbox-option {pair!r}: expected KEY=VALUE (e.g. memory_mb=2048)")
        opts[key] = yaml.safe_load(value)
    try:
        make_config(backend, opts)
    except (TypeError, ValueError) as e:
        raise SystemExit(f"--sandbox-option: {e}") from None
    return opts


def _progress(total: int):
    from tqdm import tqdm

    return tqdm(total=total, desc="grading", unit="inst", file=sys.stderr, dynamic_ncols=True)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m roll_agent.swe_eval", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", required=True, help="instances JSONL (SWE-bench / SWE-Gym / SWE-smith schema)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--predictions", help="predictions JSONL (instance_id, model_name_or_path, model_patch) "
                                           "or 'gold' for each instance's own fix")
    src.add_argument("--policy", help="CHECKPOINT_OR_CONFIG: roll it out in roll_agent/SWE-v0 first "
                                      "(writes DIR/predictions.jsonl), then evaluate")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="config override for --policy (repeatable), e.g. engine.type=openai")
    ap.add_argument("--sandbox", choices=BACKENDS, default="docker")
    ap.add_argument("--sandbox-option", action="append", default=[], metavar="KEY=VALUE",
                    help="sandbox backend option (repeatable), e.g. memory_mb=2048 cpus=2")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--output-dir", required=True)
    ap.add_argument("--instance-ids", nargs="+", help="evaluate only these")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds for one instance's test run")
    ap.add_argument("--partial-credit", action="store_true", help="reward = fraction of F2P+P2P tests passing")
    ap.add_argument("--no-fail-fast", action="store_true",
                    help="run every test even after a FAIL_TO_PASS/PASS_TO_PASS test failed (the verdict is the "
                         "same; the logs then show every test's status)")
    ap.add_argument("--format", default="auto", choices=("auto", "swe-bench", "swe-gym", "swe-smith"))
    args = ap.parse_args(argv)
    if args.workers < 1:
        ap.error("--workers must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    report = run_eval(args)
    print(json.dumps({k: report[k] for k in ("total_instances", "submitted_instances", "completed_instances",
                                             "resolved_instances", "unresolved_instances", "empty_patch_instances",
                                             "error_instances", "duration_s")}))
    print(f"report: {Path(args.output_dir) / 'report.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
