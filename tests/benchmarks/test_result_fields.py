"""No benchmark reports a constant as a measurement: every RESULT field is computed."""

from __future__ import annotations

import ast
from pathlib import Path

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"


def _constant_fields(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        # result_line(name=<literal>): a constant printed as a result
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "result_line":
            found += [f"{path.name}:{node.lineno} {kw.arg}" for kw in node.keywords
                      if kw.arg is not None and isinstance(kw.value, ast.Constant)]
        # {"..._ok": True} or {"..._met": True}: a verdict written down instead of checked
        if isinstance(node, ast.Dict):
            found += [f"{path.name}:{node.lineno} {k.value}" for k, v in zip(node.keys, node.values)
                      if isinstance(k, ast.Constant) and isinstance(k.value, str)
                      and k.value.endswith(("_ok", "_met")) and isinstance(v, ast.Constant)]
    return found


def test_no_benchmark_prints_a_constant_as_a_result():
    scripts = sorted(BENCHMARKS.rglob("*.py"))
    assert len(scripts) > 10
    found = [hit for path in scripts for hit in _constant_fields(path)]
    assert found == [], f"RESULT fields that are constants, not measurements: {found}"


def test_the_check_flags_a_constant(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("print(result_line(ratio=r, target=0.7))\nout = {'checksum_ok': True}\n")
    assert sorted(_constant_fields(bad)) == ["bad.py:1 target", "bad.py:2 checksum_ok"]


def test_gpu_checks_broadcast_compares_checksums_on_cpu(tmp_path):
    """benchmarks/gpu_check.py's bucketed broadcast over gloo between two processes: the
    receiver, zeroed first, ends with the checkpoint's weights (checksum_ok computed)."""
    from benchmarks.gpu_check import broadcast_check, build_checkpoint

    build_checkpoint(tmp_path / "ckpt", "cpu", "cpu")
    r = broadcast_check(str(tmp_path / "ckpt"), "gloo")
    assert r["world"] == 2 and r["bytes"] > 0 and r["checksum_ok"] is True
