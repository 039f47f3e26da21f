"""bench/gpu_attention_mask.py and bench/gpu_convolution.py checked on CPU with --dry-run (their GPU runs are in
docs/BENCHMARKS.md): the JSON the calibration reads, and a clear error for an unwritable --out."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(script, *args):
    return subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)


def test_attention_sweep_dry_run_writes_rows_with_and_without_a_mask(tmp_path):
    got = run("gpu_attention_mask.py", "--out", str(tmp_path), "--dry-run", "--repeats", "1")
    assert got.returncode == 0, got.stderr
    rows = json.loads((tmp_path / "attention_mask.json").read_text())["rows"]
    assert rows and all(r["seconds_plain"] > 0 and r["seconds_masked"] > 0 and r["device"] == "cpu" for r in rows)
    assert rows[0]["scores"] == 1 * 2 * 64 * 80


def test_convolution_sweep_dry_run_writes_both_kinds(tmp_path):
    got = run("gpu_convolution.py", "--out", str(tmp_path), "--dry-run", "--repeats", "1")
    assert got.returncode == 0, got.stderr
    data = json.loads((tmp_path / "convolution.json").read_text())
    kinds = {r["kind"]: r for r in data["rows"]}
    assert set(kinds) == {"patchify", "depthwise"} and all(r["seconds"] > 0 for r in data["rows"])
    assert kinds["patchify"]["output"] == [1, 16, 4, 4] and kinds["depthwise"]["output"] == [1, 8, 19]
    assert kinds["depthwise"]["groups"] == 8


@pytest.mark.parametrize("script", ["gpu_attention_mask.py", "gpu_convolution.py"])
def test_an_unwritable_out_is_a_clear_error(tmp_path, script):
    blocker = tmp_path / "file"
    blocker.write_text("")
    got = run(script, "--out", str(blocker / "sub"), "--dry-run")
    assert got.returncode == 2 and "cannot write --out" in got.stderr and "Traceback" not in got.stderr
