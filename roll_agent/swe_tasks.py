"""Make SWE tasks from real projects, and build their images.

    python -m roll_agent.swe_tasks make --source pypi:toolz==0.12.1 --out tasks.jsonl --max-tasks 12
    python -m roll_agent.swe_tasks build-images tasks.jsonl

`make` injects bugs into the project and keeps those its own tests catch and the
reversal fixes (envs.swe.task_maker); `--source` may repeat (tasks per source). The
instances follow the SWE-bench schema plus `image`, `test_cmd`, `source` and
`source_sha256`; with `--format harness`, the SWE-bench 5.x one instead of `test_cmd`
(`eval_script`, `log_parser: parse_log_pytest`, `eval_type`), as the official harness
runs them. `build-images` rebuilds each task's repo from its source (the sdist
is re-downloaded at the pinned version and must match the recorded sha256), checks it
comes out at the recorded base_commit, and builds roll-agent-swe:<instance_id> from
roll-agent-base:latest with the repo at /testbed owned by uid 1000. Images that exist
are skipped (--force rebuilds them).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from envs.swe.grading import harness_row
from envs.swe.instance import SWEInstance, instance_from_dict, load_instances, write_jsonl
from envs.swe.mutations import OPERATORS
from envs.swe.task_maker import MakerConfig, duration, make_tasks
from envs.swe.task_source import MakerError, fetch_source, restore_task_repo


def build_images(instances: list[SWEInstance], force: bool = False, cache: str | None = None,
                 log=print) -> dict[str, str]:
    """{instance_id: image} for every instance, building the missing ones."""
    from sandboxes.build_image import build_task_image, docker_client, ensure_base_image, image_exists

    client = docker_client()
    todo = [i for i in instances if force or not image_exists(client, _image_of(i))]
    log(f"{len(instances) - len(todo)} images exist, {len(todo)} to build")
    if todo:
        ensure_base_image(client=client)
    with tempfile.TemporaryDirectory(prefix="swe-images-") as tmp_name:
        tmp, projects, t_start = Path(tmp_name), {}, time.monotonic()
        for k, inst in enumerate(todo):
            spec, sha = inst.extra.get("source"), inst.extra.get("source_sha256")
            if not spec:
                raise MakerError(f"{inst.instance_id}: no 'source' field; only tasks made by "
                                 "`python -m roll_agent.swe_tasks make` can be rebuilt here")
            if spec not in projects:
                where = tmp / f"src{len(projects)}"
                where.mkdir()
                projects[spec] = fetch_source(spec, where, cache, sha).root
            repo = restore_task_repo(projects[spec], inst.patch, inst.base_commit, tmp / f"task{k}")
            t0 = time.monotonic()
            # the index holds this checkout's stat data; rebuilt in the image, so the build
            # context (hence the content-hashed tag) depends only on the repo's content
            (repo / ".git" / "index").unlink()
            content_tag = build_task_image(str(repo), setup=("git reset -q",), client=client)
            name, _, tag = _image_of(inst).rpartition(":")
            client.images.get(content_tag).tag(name, tag=tag)
            per = (time.monotonic() - t_start) / (k + 1)
            log(f"[{k + 1}/{len(todo)}] {_image_of(inst)} ({time.monotonic() - t0:.1f}s; "
                f"ETA {duration(per * (len(todo) - k - 1))})")
    return {i.instance_id: _image_of(i) for i in instances}


def _image_of(inst: SWEInstance) -> str:
    if not inst.image or ":" not in inst.image:
        raise MakerError(f"{inst.instance_id}: 'image' must be NAME:TAG, got {inst.image!r}")
    return inst.image


def _log(line: str) -> None:
    print(line, flush=True)  # progress of a long run, also when redirected to a file


def _make(args) -> int:
    rows = []
    for spec in args.source:
        cfg = MakerConfig(source=spec, max_tasks=args.max_tasks, seed=args.seed, max_candidates=args.max_candidates,
                          tests=tuple(args.tests), src=tuple(args.src), operators=tuple(args.operators),
                          max_fail=args.max_fail, sandbox=args.sandbox, test_timeout=args.test_timeout,
                          pythonpath=args.pythonpath, cache=args.cache, log=_log)
        rows.extend(make_tasks(cfg))
    if args.format == "harness":
        rows = [harness_row(instance_from_dict(row)) for row in rows]
    tmp = f"{args.out}.tmp-{os.getpid()}"
    write_jsonl(tmp, rows)
    os.replace(tmp, args.out)
    print(f"wrote {len(rows)} tasks to {args.out}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m roll_agent.swe_tasks", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make", help="inject bugs into a project and write verified tasks")
    mk.add_argument("--source", action="append", required=True,
                    help="pypi:NAME==VERSION[#sha256=HEX] or a local project directory (repeatable)")
    mk.add_argument("--out", required=True, help="output JSONL")
    mk.add_argument("--max-tasks", type=int, default=10, help="tasks per source")
    mk.add_argument("--max-candidates", type=int, default=None, help="mutations tried per source (6 x max-tasks)")
    mk.add_argument("--seed", type=int, default=0)
    mk.add_argument("--tests", nargs="*", default=[], help="test files/globs (default: test_*.py, *_test.py)")
    mk.add_argument("--src", nargs="*", default=[], help="files/globs to mutate (default: non-test .py files)")
    mk.add_argument("--operators", nargs="*", default=[], choices=sorted(OPERATORS))
    mk.add_argument("--max-fail", type=int, default=40, help="drop mutations breaking more tests than this")
    mk.add_argument("--sandbox", choices=("bwrap", "docker"), default="bwrap")
    mk.add_argument("--test-timeout", type=float, default=None, help="seconds per test run")
    mk.add_argument("--pythonpath", default="", help="PYTHONPATH for the tests, e.g. src")
    mk.add_argument("--cache", default=None, help="sdist cache dir")
    mk.add_argument("--format", choices=("roll_agent", "harness"), default="roll_agent",
                    help="harness: SWE-bench 5.x rows (eval_script, parse_log_pytest) instead of test_cmd")
    bi = sub.add_parser("build-images", help="build the per-task docker images of a task file")
    bi.add_argument("dataset")
    bi.add_argument("--force", action="store_true", help="rebuild images that exist")
    bi.add_argument("--cache", default=None, help="sdist cache dir")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "make":
            return _make(args)
        build_images(load_instances(args.dataset), force=args.force, cache=args.cache, log=_log)
        return 0
    except MakerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
