"""Our SWE evaluation vs the official `swebench` harness: same instances, images, workers.

    PYTHONPATH=$PWD python benchmarks/swe_eval_vs_swebench.py [--n 24] [--workers 4] [--rounds 1]

Instances: the shipped task set (data/swe_tasks/tasks.jsonl, images built with
`python -m roll_agent.swe_tasks build-images` when missing) if it is there, else the
test fixture's minicalc project (one image; --tasks fixture forces it). Predictions
rotate gold / wrong / not-applying / empty patches (plus 3-way and fuzzy ones on the
fixture), so every verdict kind is compared, not only "resolved".

Both harnesses run as their own CLIs in subprocesses, timed end to end:
  swebench:  /work/venv-swebench/bin/python -m swebench.harness.run_evaluation
             (5.x: per-instance image, eval_script, log_parser, eval_type; local images
             are used as found; the images stop with SIGKILL, so its `docker stop` does
             not wait out a grace period)
  ours:      python -m roll_agent.swe_eval --sandbox docker   (the headline ratio)
             python -m roll_agent.swe_eval --sandbox bwrap    (ratio_bwrap: a bwrap sandbox per
             instance over the base rootfs the images are built from, /testbed exported from
             each image, timed cold; only when the images add nothing else to the base)
             python -m roll_agent.swe_eval on the very rows swebench reads (eval_script,
             parse_log_pytest; the `harness` column, docker; needs the `swe` extra)
Each round alternates which harness goes first (the first one meets cold caches).
Verdicts must agree across all runs.
Create the swebench venv once (never in the project venv; $SWEBENCH_PY names another):
  python3 -m venv /work/venv-swebench && /work/venv-swebench/bin/pip install swebench==5.0.2

Per-phase means (last round, docker) are printed for both; *_tests_s in the RESULT line
sum the instances' test-run seconds (wall, under the run's own contention), and
*_overhead is each harness's mean per-instance time outside the test command as a share
of the test time (on a CPU-bound machine, the part a harness can still win; ours
starts and removes sandboxes ahead of and behind its workers, outside that share).
Last line: RESULT same_verdicts=<k>/<n> ratio=<swebench s / ours docker s> ratio_bwrap=... ...
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from envs.swe.grading import harness_row  # noqa: E402
from envs.swe.instance import SWEInstance, load_instances, write_jsonl  # noqa: E402

TASKS = ROOT / "data" / "swe_tasks" / "tasks.jsonl"
SWEBENCH_PY = os.environ.get("SWEBENCH_PY", "/work/venv-swebench/bin/python")


def fixture_instances(n: int, tmp: Path) -> tuple[list[SWEInstance], dict[str, str]]:
    """n copies of the minicalc instance, with the fixture's patches rotated over them."""
    from tests.swe.conftest import build_project_image, make_swe_project

    project = make_swe_project(tmp / "src")
    image = build_project_image(make_swe_project(tmp / "img").repo_dir)
    kinds = ["gold", "wrong", "not_applying", "gold", "empty", "three_way", "gold", "fuzzy"]
    instances, preds = [], {}
    for k in range(n):
        # repo is a name, as in SWE-bench: the bwrap run takes the tree from the image, not a local clone
        inst = dataclasses.replace(project.instance, instance_id=f"minicalc-{k:03d}", image=image,
                                   repo="local/minicalc")
        instances.append(inst)
        preds[inst.instance_id] = project.patches[kinds[k % len(kinds)]]
    return instances, preds


def task_set_instances(path: Path, n: int) -> tuple[list[SWEInstance], dict[str, str]]:
    """The shipped tasks (images built if missing), with gold / wrong / broken / empty patches."""
    from roll_agent.swe_tasks import build_images

    instances = load_instances(path)[:n]
    images = build_images(instances)
    instances = [dataclasses.replace(i, image=images[i.instance_id]) for i in instances]
    preds = {}
    for k, inst in enumerate(instances):
        kind = ("gold", "wrong", "gold", "broken", "gold", "empty")[k % 6]
        preds[inst.instance_id] = prediction_kinds(inst)[kind]
    return instances, preds


def prediction_kinds(inst: SWEInstance) -> dict[str, str]:
    """The patches every verdict kind comes from: gold (resolved), wrong (applies, fixes
    nothing: unresolved), broken (does not apply: error), empty (empty_patch)."""
    return {"gold": inst.patch, "wrong": _unrelated_patch(), "broken": _broken(inst.patch), "empty": ""}


def edge_prediction_kinds(inst: SWEInstance) -> dict[str, str]:
    """The gold fix as tools mangle it: CRLF line ends, no final newline; and already applied
    (the fix backwards: its reverse applies to the buggy tree)."""
    from tests.swe.conftest import reverse_patch

    gold = inst.patch
    return {"crlf": gold.replace("\n", "\r\n"), "no_newline": gold.rstrip("\n"), "already_applied": reverse_patch(gold)}


def _unrelated_patch() -> str:
    """Applies anywhere and fixes nothing: the tests decide (unresolved)."""
    return ("diff --git a/NOTES.roll_agent b/NOTES.roll_agent\nnew file mode 100644\n--- /dev/null\n"
            "+++ b/NOTES.roll_agent\n@@ -0,0 +1 @@\n+looked at it, changed nothing\n")


def _broken(patch: str) -> str:
    """The gold patch with every removed/context line altered: no fallback can place it."""
    out = []
    for line in patch.splitlines(keepends=True):
        if line[:1] in ("-", " ") and not line.startswith("---"):
            line = line[0] + "#roll_agent-missing# " + line[1:]
        out.append(line)
    return "".join(out)


def ensure_sigkill(images: set[str]) -> None:
    """Both harnesses must use images that stop at once (swebench runs `docker stop`)."""
    from sandboxes.build_image import docker_client

    client = docker_client()
    for image in images:
        sig = (client.api.inspect_image(image).get("Config") or {}).get("StopSignal")
        if sig not in ("SIGKILL", "9", "KILL"):
            raise SystemExit(f"image {image} has StopSignal={sig!r}; rebuild it with sandboxes.build_image "
                             "(task images are built with STOPSIGNAL SIGKILL)")


VERDICT_KEYS = ("resolved", "unresolved", "empty_patch", "error")


def verdicts(report: dict) -> dict[str, str]:
    out = {}
    for key in VERDICT_KEYS:
        for iid in report.get(f"{key}_ids", []):
            out.setdefault(iid, key)
    return out


def run_swebench(work: Path, dataset: Path, preds: Path, workers: int, tag: str) -> tuple[float, dict]:
    run_id = f"roll-agent-bench-{tag}"
    cmd = [SWEBENCH_PY, "-m", "swebench.harness.run_evaluation", "--dataset_name", str(dataset),
           "--predictions_path", str(preds), "--max_workers", str(workers), "--run_id", run_id,
           "--report_dir", str(work / "sb-report"), "--timeout", "600"]
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
    wall = time.monotonic() - t0
    reports = list((work / "sb-report").glob(f"*.{run_id}.json"))
    if p.returncode != 0 or not reports:
        raise SystemExit(f"swebench failed (exit {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return wall, json.loads(reports[0].read_text())


def swebench_phases(log_dir: Path) -> dict[str, dict[str, float]]:
    """Seconds per phase of each instance, from the timestamps of swebench's run_instance.log."""
    out = {}
    for log in log_dir.glob("*/run_instance.log"):
        text = log.read_text(errors="replace")
        stamps = [(datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp(), m.group(2))
                  for m in re.finditer(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+) - \w+ - (.*)$", text, re.M)]
        if not stamps:
            continue

        def at(prefix: str, last: bool = False) -> float | None:
            hits = [t for t, msg in stamps if msg.startswith(prefix)]
            return (hits[-1] if last else hits[0]) if hits else None

        started, stop = at("Container for", last=True), at("Attempting to stop")
        applied = at(">>>>> Applied Patch") or at(">>>>> Patch Apply Failed")
        tests = re.search(r"Test runtime: ([\d_.]+) seconds", text)
        phases = {"start": (started or stamps[0][0]) - stamps[0][0],
                  "apply": (applied - started) if applied and started else 0.0,
                  "tests": float(tests.group(1).replace("_", "")) if tests else 0.0,
                  "stop+remove": (stamps[-1][0] - stop) if stop else 0.0,
                  "total": stamps[-1][0] - stamps[0][0]}
        out[log.parent.name] = phases
    return out


def ours_phases(log_dir: Path) -> dict[str, dict[str, float]]:
    """Seconds per grading step of each instance, from our run_instance.log (sandbox start and
    removal happen off the worker's path, ahead of and behind it)."""
    out = {}
    for log in log_dir.glob("*/run_instance.log"):
        phases = {"checkout+apply": 0.0, "tests": 0.0}  # the first command checks out and applies
        steps = re.findall(r"^\$ ([^:]+):.*?\[exit -?\d+[^\]]*?, ([\d.]+)s\]", log.read_text(errors="replace"),
                           re.M | re.S)
        for name, secs in steps:
            key = "tests" if name.startswith("run tests") else "checkout+apply"
            phases[key] += float(secs)
        phases["total"] = sum(phases.values())
        out[log.parent.name] = phases
    return out


def phase_line(name: str, phases: dict[str, dict[str, float]]) -> str:
    """Mean seconds per instance that ran (empty patches run nothing in either harness)."""
    ran = [p for p in phases.values() if p["total"] > 0]
    keys = list(ran[0]) if ran else []
    return f"{name:<9} per instance ({len(ran)} run): " + " ".join(
        f"{k}={sum(p[k] for p in ran) / len(ran):.2f}s" for k in keys)


def overhead_share(phases: dict[str, dict[str, float]]) -> float:
    """Mean over the instances whose tests ran of (time outside the test command) / (test time)."""
    ran = [p for p in phases.values() if p["tests"] > 0]
    return sum((p["total"] - p["tests"]) / p["tests"] for p in ran) / len(ran) if ran else float("nan")


def run_ours(work: Path, dataset: Path, preds: Path, workers: int, tag: str, backend: str) -> tuple[float, dict]:
    out = work / f"ours-{tag}"
    cmd = [sys.executable, "-m", "roll_agent.swe_eval", "--dataset", str(dataset), "--predictions", str(preds),
           "--sandbox", backend, "--workers", str(workers), "--output-dir", str(out), "--timeout", "600"]
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.monotonic() - t0
    if p.returncode != 0:
        raise SystemExit(f"roll_agent.swe_eval failed (exit {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return wall, json.loads((out / "report.json").read_text())


def bwrap_comparable(images: set[str]) -> str | None:
    """Why the bwrap run would not see the images' userland, or None.

    The bwrap grading sandbox's root is the base rootfs the images are built from, and its
    /testbed is exported from each image (once, cached): the same files as in the image
    when the image is the base plus layers that only add the repo.
    """
    from sandboxes.build_image import docker_client, rootfs_path
    from sandboxes.config import BASE_IMAGE

    if not rootfs_path().is_dir():
        return f"no base rootfs at {rootfs_path()}"
    api = docker_client().api
    base = api.inspect_image(BASE_IMAGE)["RootFS"]["Layers"]
    for image in images:
        if api.inspect_image(image)["RootFS"]["Layers"][:len(base)] != base:
            return f"{image} is not built from {BASE_IMAGE}"
        steps = [h.get("CreatedBy", "") for h in api.history(image)]
        extra = [c for c in steps if "RUN" in c and "git reset" not in c]
        if extra:
            return f"{image} has setup steps outside /testbed ({extra[0][:80]})"
    return None


def clear_exports(images: set[str]) -> None:
    """The bwrap run is timed cold: each image's /testbed is exported again."""
    import shutil

    from sandboxes.build_image import docker_client
    from sandboxes.config import cache_dir

    client = docker_client()
    for image in images:
        key = client.images.get(image).id.split(":")[-1][:20]
        for d in (cache_dir() / "swe-src").glob(f"image-{key}-*"):
            shutil.rmtree(d)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default=str(TASKS), help="tasks JSONL, or 'fixture' for the minicalc instances")
    ap.add_argument("--n", type=int, default=24, help="instances")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=1, help="alternate the two harnesses this many times")
    args = ap.parse_args(argv)
    if not Path(SWEBENCH_PY).exists():
        raise SystemExit(f"{SWEBENCH_PY} not found; create it: python3 -m venv /work/venv-swebench && "
                         "/work/venv-swebench/bin/pip install swebench==5.0.2")
    work = Path(tempfile.mkdtemp(prefix="swe-bench-cmp-"))
    if args.tasks != "fixture" and Path(args.tasks).exists():
        source = f"task set {args.tasks}"
        instances, patches = task_set_instances(Path(args.tasks), args.n)
    else:
        source = "fixture (minicalc; data/swe_tasks/tasks.jsonl not found)" if args.tasks != "fixture" \
            else "fixture (minicalc)"
        instances, patches = fixture_instances(args.n, work)
    ensure_sigkill({i.image for i in instances})
    write_jsonl(work / "ours.jsonl", [i.to_dict() for i in instances])
    harness_rows = [harness_row(i) for i in instances]
    (work / "swebench.json").write_text(json.dumps(harness_rows))
    write_jsonl(work / "harness.jsonl", harness_rows)
    write_jsonl(work / "preds.jsonl", [{"instance_id": iid, "model_name_or_path": "bench", "model_patch": p}
                                       for iid, p in patches.items()])
    print(f"instances: {len(instances)} from {source}; images: {len({i.image for i in instances})}; "
          f"workers: {args.workers}; work dir: {work}", flush=True)
    images = {i.image for i in instances}
    no_bwrap = bwrap_comparable(images)
    times: dict[str, list[float]] = {"swebench": [], "docker": [], "bwrap": [], "harness": []}
    reports: dict[str, dict] = {}

    def run(name: str, r: int) -> None:
        if name == "swebench":
            wall, reports[name] = run_swebench(work, work / "swebench.json", work / "preds.jsonl", args.workers, str(r))
        else:
            if name == "bwrap":
                clear_exports(images)
            dataset = work / ("harness.jsonl" if name == "harness" else "ours.jsonl")
            wall, reports[name] = run_ours(work, dataset, work / "preds.jsonl", args.workers, f"{name}-{r}",
                                           "bwrap" if name == "bwrap" else "docker")
        times[name].append(wall)

    ours = ["docker", "harness"] + ([] if no_bwrap else ["bwrap"])
    for r in range(args.rounds):
        for name in (["swebench", *ours] if r % 2 == 0 else [*ours, "swebench"]):
            run(name, r)
        print("round %d: " % r + ", ".join(f"{k} {v[-1]:.1f}s" for k, v in times.items() if v), flush=True)
    if no_bwrap:
        print(f"bwrap run skipped: {no_bwrap}")
    v = {k: verdicts(rep) for k, rep in reports.items()}
    print(f"{'instance':<32} " + " ".join(f"{k:<12}" for k in v))
    same = 0
    for iid in patches:
        row = [v[k].get(iid, "-") for k in v]
        agree = row[0] != "-" and len(set(row)) == 1
        same += agree
        print(f"{iid:<32} " + " ".join(f"{x:<12}" for x in row) + ("" if agree else "  <-- differs"))
    sb_phases = swebench_phases(work / "logs" / "run_evaluation" / f"roll-agent-bench-{args.rounds - 1}" / "bench")
    our_phases = ours_phases(work / f"ours-docker-{args.rounds - 1}" / "logs")
    print(phase_line("swebench", sb_phases))
    print(phase_line("ours", our_phases))
    tests_s = {k: sum(p["tests"] for p in ph.values()) for k, ph in (("sb", sb_phases), ("ours", our_phases))}
    overhead = {k: overhead_share(ph) for k, ph in (("sb", sb_phases), ("ours", our_phases))}
    med = {k: sorted(t)[len(t) // 2] for k, t in times.items() if t}
    counts = {k: sum(x == k for x in v["docker"].values()) for k in VERDICT_KEYS}
    bwrap = (f"ratio_bwrap={med['swebench'] / med['bwrap']:.2f} bwrap_s={med['bwrap']:.1f} " if "bwrap" in med
             else "ratio_bwrap=skipped ")
    print(f"RESULT same_verdicts={same}/{len(patches)} ratio={med['swebench'] / med['docker']:.2f} "
          f"swebench_s={med['swebench']:.1f} ours_docker_s={med['docker']:.1f} {bwrap}workers={args.workers} "
          f"n={len(instances)} swebench_tests_s={tests_s['sb']:.1f} ours_tests_s={tests_s['ours']:.1f} "
          f"swebench_overhead={overhead['sb']:.2f} ours_overhead={overhead['ours']:.2f} "
          f"source={'fixture' if 'fixture' in source else 'task_set'} "
          + " ".join(f"{k}={n}" for k, n in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
