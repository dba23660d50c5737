"""The official harness's verdicts on a task set, for every prediction kind: what our
evaluation must agree with (tests/swe/test_official_format.py reads the file this writes).

    SWEBENCH_PY=/work/venv-swebench/bin/python PYTHONPATH=$PWD \\
        python benchmarks/swe_harness_verdicts.py data/swe_harness/tasks.jsonl data/swe_harness/verdicts.json

Each instance is graded by `swebench.harness.run_evaluation` (5.x: its image, eval_script,
log_parser, eval_type) with its gold patch, an unrelated patch (applies, fixes nothing),
a broken one (no fallback can place it), an empty one, and the gold patch with CRLF line
ends, without its final newline, and backwards (already applied): one harness run per kind.
Writes {"harness": "swebench X.Y.Z", "verdicts": {instance_id: {kind: verdict}}}.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.swe_eval_vs_swebench import (SWEBENCH_PY, edge_prediction_kinds, ensure_sigkill,  # noqa: E402
                                             prediction_kinds, run_swebench, verdicts)
from envs.swe.grading import harness_row  # noqa: E402
from envs.swe.instance import load_instances, write_jsonl  # noqa: E402


def main(argv=None) -> int:
    tasks, out = (argv or sys.argv[1:])[:2]
    from roll_agent.swe_tasks import build_images

    instances = load_instances(tasks)
    build_images(instances)
    ensure_sigkill({i.image for i in instances})
    work = Path(tempfile.mkdtemp(prefix="swe-harness-verdicts-"))
    (work / "tasks.json").write_text(json.dumps([harness_row(i) for i in instances]))
    found: dict[str, dict[str, str]] = {i.instance_id: {} for i in instances}
    kinds = {i.instance_id: {**prediction_kinds(i), **edge_prediction_kinds(i)} for i in instances}
    for kind in kinds[instances[0].instance_id]:
        preds = work / f"preds-{kind}.jsonl"
        write_jsonl(preds, [{"instance_id": i.instance_id, "model_name_or_path": "bench",
                             "model_patch": kinds[i.instance_id][kind]} for i in instances])
        _, report = run_swebench(work, work / "tasks.json", preds, 2, kind)
        for iid, verdict in verdicts(report).items():
            found[iid][kind] = verdict
        print(kind, {iid: v[kind] for iid, v in found.items() if kind in v}, flush=True)
    version = subprocess.run([SWEBENCH_PY, "-c", "import swebench; print(swebench.__version__)"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(out).write_text(json.dumps({"harness": f"swebench {version}", "verdicts": found}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
