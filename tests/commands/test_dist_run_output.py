"""``tessera dist-run`` defaults to the planner's policy, prints a short table on rank 0, and keeps JSON for machines
(``--json``: one line per rank; ``--json PATH``: a file per rank)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TEST_DEVICE
from torch_tessera.cli import build_parser
from torch_tessera.commands.dist_report import format_result

ROOT = Path(__file__).resolve().parents[2]


def _parse(*argv: str):
    return build_parser().parse_args(["dist-run", *argv])


def test_policy_defaults_to_the_planners_as_plan_does():
    assert _parse().policy == "throughput"
    assert _parse("--json").json == "-" and _parse("--json", "r{rank}.json").json == "r{rank}.json"
    assert _parse().json is None


def _record(**over) -> dict:
    rows = [{"rank": 0, "device": "cpu:0", "host": "vm", "launches": 3, "cut_edges_sent": 1, "cut_edges_received": 1,
             "cut_bytes_sent": 4096.0, "other_bytes_sent": 0.0},
            {"rank": 1, "device": "cpu:1", "host": "vm", "launches": 2, "cut_edges_sent": 1, "cut_edges_received": 1,
             "cut_bytes_sent": 16384.0, "other_bytes_sent": 2048.0}]
    record = {"ok": True, "failures": [], "world_size": 2, "policy": "throughput", "total_launches": 5,
              "cut_edges": 2, "cut_edges_transferred": 2, "compile_s": 2.84, "seconds_per_call": [0.05, 0.0455],
              "max_abs_diff_eager": 2.38e-7, "equal_inprocess": True, "per_rank": rows}
    return {**record, **over}


def test_table_states_verdict_cuts_ranks_and_checks():
    text = format_result(_record(), "mlp", "tiny")
    assert text.splitlines() == [
        "tessera dist-run: mlp (tiny) on 2 ranks, policy throughput: OK",
        "5 launches, 2 cut edges (2 transferred per call); compile 2.8 s; 2 call(s), the last 45.500 ms; bytes: all calls",
        "rank  device  host  launches/call  cut edges sent  received  cut bytes sent  inputs/outputs sent",
        "0     cpu:0   vm    3              1               1         4.10 KB         0 B",
        "1     cpu:1   vm    2              1               1         16.38 KB        2.05 KB",
        "vs eager: max abs diff 2.38e-07; bitwise equal to the in-process runtime: yes",
    ]
    failed = format_result(_record(ok=False, failures=["x"], equal_inprocess=False), "mlp", "tiny")
    assert "policy throughput: FAILED (1 check(s))" in failed and "in-process runtime: NO" in failed


def _torchrun(*args: str) -> subprocess.CompletedProcess:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(port), "-m", "torch_tessera.cli", "dist-run", "--model", "mlp",
           "--devices", "cpu:0,cpu:1", *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.skipif(TEST_DEVICE != "cpu", reason="gloo on CPU virtual devices")
def test_default_run_prints_rank_zeros_table_not_json(tmp_path):
    out = _torchrun("--json", str(tmp_path / "r{rank}.json")).stdout
    assert "tessera dist-run: mlp (tiny) on 2 ranks, policy throughput: OK" in out, out
    assert "rank  device  host  launches/call" in out and "\n0     cpu:0 " in out and "\n1     cpu:1 " in out, out
    assert "{" not in out, out
    r0 = json.loads((tmp_path / "r0.json").read_text())
    assert r0["ok"] and r0["policy"] == "throughput" and sum(r["launches"] for r in r0["per_rank"]) == r0["total_launches"] > 0


@pytest.mark.skipif(TEST_DEVICE != "cpu", reason="gloo on CPU virtual devices")
def test_json_flag_prints_one_record_per_rank():
    lines = [l for l in _torchrun("--json").stdout.splitlines() if l.startswith("{")]
    records = sorted((json.loads(l) for l in lines), key=lambda r: r["rank"])
    assert [r["rank"] for r in records] == [0, 1]
    assert records[0]["ok"] and records[0]["max_abs_diff_eager"] < 1e-4
