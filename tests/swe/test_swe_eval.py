"""`python -m roll_agent.swe_eval`: reports, logs and error isolation, on the minicalc fixture."""
from __future__ import annotations

import dataclasses
import json

import pytest

from envs.swe.instance import write_jsonl
from roll_agent import swe_eval


def _instance(base, iid):
    return dataclasses.replace(base, instance_id=iid).to_dict()


@pytest.fixture(params=[pytest.param("docker", marks=pytest.mark.docker), "bwrap"])
def backend_instance(request, swe_project):
    if request.param == "docker":
        return "docker", dataclasses.replace(swe_project.instance, image=request.getfixturevalue("swe_image"))
    request.getfixturevalue("swe_bwrap")
    return "bwrap", swe_project.instance


def test_every_outcome_is_reported_and_a_malformed_line_does_not_stop_the_others(
        tmp_path, backend_instance, swe_patches, capsys):
    backend, base = backend_instance
    names = ["gold", "wrong", "empty", "not_applying"]
    rows = [_instance(base, n) for n in names]
    rows.insert(2, {**_instance(base, "malformed"), "FAIL_TO_PASS": "tests/test_mul.py::test_mul"})  # not a list
    rows.append(_instance(base, "no-prediction"))
    write_jsonl(tmp_path / "d.jsonl", rows)
    preds = [{"instance_id": n, "model_name_or_path": "t", "model_patch": swe_patches[n]} for n in names]
    write_jsonl(tmp_path / "p.jsonl", [*preds, {"instance_id": "malformed", "model_patch": swe_patches["gold"]}])
    out = tmp_path / "out"
    assert swe_eval.main(["--dataset", str(tmp_path / "d.jsonl"), "--predictions", str(tmp_path / "p.jsonl"),
                          "--sandbox", backend, "--workers", "2", "--output-dir", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["resolved_ids"] == ["gold"] and report["unresolved_ids"] == ["wrong"]
    assert report["empty_patch_ids"] == ["empty"] and report["error_ids"] == ["malformed", "not_applying"]
    assert report["incomplete_ids"] == ["no-prediction"] and report["completed_ids"] == ["gold", "wrong"]
    assert (report["total_instances"], report["submitted_instances"], report["completed_instances"]) == (6, 5, 2)
    assert (report["resolved_instances"], report["error_instances"], report["empty_patch_instances"]) == (1, 2, 1)
    assert report["instances"]["not_applying"]["reason"].startswith("patch does not apply")
    assert "field 'FAIL_TO_PASS' is a string but not a JSON list" in report["instances"]["malformed"]["reason"]
    logs = out / "logs"
    assert "4 passed" in (logs / "gold" / "test_output.txt").read_text()
    assert "Hunk #1 FAILED" in (logs / "not_applying" / "run_instance.log").read_text()
    assert json.loads((logs / "wrong" / "result.json").read_text())["pass_to_pass"]["failure"] == [
        "tests/test_calc.py::test_add"]
    # the official harness's per-instance report, for the instances it would complete
    wrong = json.loads((logs / "wrong" / "report.json").read_text())["wrong"]
    assert (wrong["resolved"], wrong["patch_successfully_applied"]) == (False, True)
    assert wrong["tests_status"]["PASS_TO_PASS"]["failure"] == ["tests/test_calc.py::test_add"]
    assert json.loads((logs / "gold" / "report.json").read_text())["gold"]["resolved"] is True
    assert not (logs / "not_applying" / "report.json").exists() and (logs / "not_applying" / "result.json").exists()
    assert (logs / "gold" / "patch.diff").read_text() == swe_patches["gold"]
    assert '"resolved_instances": 1' in capsys.readouterr().out


@pytest.mark.docker
def test_gold_predictions_resolve_every_instance(tmp_path, swe_instance):
    write_jsonl(tmp_path / "d.jsonl", [_instance(swe_instance, f"gold-{i}") for i in range(4)])
    swe_eval.main(["--dataset", str(tmp_path / "d.jsonl"), "--predictions", "gold", "--workers", "2",
                   "--output-dir", str(tmp_path / "out"), "--instance-ids", "gold-0", "gold-2", "gold-3"])
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["resolved_ids"] == ["gold-0", "gold-2", "gold-3"] and report["total_instances"] == 3
    assert report["error_ids"] == [] and report["unresolved_ids"] == []


def test_unknown_instance_ids_and_bad_options_are_clear_errors(tmp_path, swe_project):
    write_jsonl(tmp_path / "d.jsonl", [swe_project.instance.to_dict()])
    with pytest.raises(SystemExit, match="--instance-ids not in .*: nope"):
        swe_eval.main(["--dataset", str(tmp_path / "d.jsonl"), "--predictions", "gold",
                       "--output-dir", str(tmp_path), "--instance-ids", "nope"])
    for bad, why in (("memory_mb", "expected KEY=VALUE"), ("memry_mb=1", "did you mean 'memory_mb'")):
        with pytest.raises(SystemExit, match=why):
            swe_eval.main(["--dataset", str(tmp_path / "d.jsonl"), "--predictions", "gold",
                           "--output-dir", str(tmp_path), "--sandbox-option", bad])
