"""The warm path: a compile in a new process whose graph AOTAutograd's cache holds skips tracing and Inductor, takes
tessera's program from the disk (the saved captured program, else the saved codegen record), and computes what eager
and the cold compile compute; a changed graph or shape misses, and a corrupt, mismatched or unhooked entry is logged
and compiled again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# One child process: a module with a static-cache-like buffer updated in place (index_copy_) and read back, compiled
# with tessera, called CALLS times beside an eager copy (every output and the buffer compared), then a JSON line.
_CHILD = textwrap.dedent("""
    import json, sys, torch, torch_tessera
    from torch._dynamo.utils import counters

    batch, act, hook = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    if hook == "off":  # a hit path tessera does not hook: the compile must still run tessera's executor
        import contextlib
        import torch_tessera.compat.torch_inductor as compat
        compat._on_aot_cache_hits = lambda on_hit, seen: contextlib.nullcontext()

    class Cached(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(16, 16)
            self.register_buffer("cache", torch.zeros(8, 16))

        def forward(self, x, pos):
            y = getattr(torch, act)(self.proj(x))
            self.cache.index_copy_(0, pos, y)
            return self.cache.sum(0) * 0.5 + y.mean(), y

    torch.manual_seed(0)
    model, eager = Cached().eval(), Cached().eval()
    eager.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend="tessera", dynamic=False)
    outs = []
    with torch.no_grad():
        for call in range(3):
            x = torch.randn(batch, 16)
            pos = torch.arange(batch) + call * batch % 8
            got, want = compiled(x, pos), eager(x, pos)
            torch.testing.assert_close(got, want)
            torch.testing.assert_close(model.cache, eager.cache)
            outs.append([t.tolist() for t in got])
    (report,) = torch_tessera.explain(compiled)
    print("RESULT " + json.dumps({"from_cache": report.from_cache, "programs": report.programs,
                                  "backend": report.backend, "line": report.line(), "outs": outs,
                                  "aot": dict(counters["aot_autograd"])}))
""")


def _child(root: Path, batch: int = 2, act: str = "relu", hook: str = "on") -> tuple[dict, str]:
    """Run the child on the caches under ``root``; returns its result and its stderr (the log)."""
    env = {**os.environ, "TESSERA_CACHE_DIR": str(root / "tessera"), "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
           "TRITON_INTERPRET": "1"}
    code = "import logging; logging.basicConfig(level=logging.INFO, format='%(name)s: %(message)s')\n" + _CHILD
    out = subprocess.run([sys.executable, "-c", code, str(batch), act, hook], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    return json.loads(line[len("RESULT "):]), out.stderr


@pytest.fixture(scope="module")
def cold(tmp_path_factory) -> tuple[Path, dict]:
    """One cold compile (empty caches); the caches it filled, and its result."""
    root = tmp_path_factory.mktemp("warm")
    result, _ = _child(root)
    assert result["backend"] == "tessera" and result["from_cache"] == 0
    assert result["aot"].get("autograd_cache_hit", 0) == 0
    return root, result


def _copy(root: Path, tmp_path: Path) -> Path:
    import shutil

    shutil.copytree(root, tmp_path / "caches")
    return tmp_path / "caches"


def test_warm_process_skips_tracing_and_equals_the_cold_compile(cold, tmp_path):
    root, first = cold
    warm, log = _child(_copy(root, tmp_path))
    assert warm["backend"] == "tessera" and warm["programs"] == 1
    assert warm["from_cache"] == 1, log[-3000:]  # the program came from the saved record: no AOTAutograd tracing
    assert warm["aot"].get("autograd_cache_hit") == 1 and not warm["aot"].get("autograd_cache_bypass")
    assert "from the compile cache, not traced" in warm["line"]
    assert warm["outs"] == first["outs"]  # the same program: bitwise equal, every call (eager checked in the child)


@pytest.mark.parametrize("change", [{"batch": 4}, {"act": "tanh"}], ids=["shape", "graph"])
def test_a_changed_shape_or_graph_misses(cold, tmp_path, change):
    root, _ = cold
    result, log = _child(_copy(root, tmp_path), **change)
    assert result["backend"] == "tessera" and result["from_cache"] == 0
    assert result["aot"].get("autograd_cache_miss") == 1 and not result["aot"].get("autograd_cache_hit")


def _corrupt(caches: Path, sub: str, pattern: str) -> None:
    entries = list((caches / "tessera" / sub).glob(pattern))
    assert entries, sub
    for p in entries:
        p.write_bytes(b"{not an entry")


def test_a_corrupt_captured_program_is_captured_again_from_the_record(cold, tmp_path):
    root, first = cold
    caches = _copy(root, tmp_path)
    _corrupt(caches, "warm", "*.pkl")
    result, log = _child(caches)
    assert "unreadable captured program" in log
    assert result["from_cache"] == 1 and result["outs"] == first["outs"]  # still no tracing: the record served


def test_corrupt_entries_are_logged_and_generated_again(cold, tmp_path):
    root, first = cold
    caches = _copy(root, tmp_path)
    _corrupt(caches, "warm", "*.pkl")
    _corrupt(caches, "codegen", "*.json")
    result, log = _child(caches)
    assert "unreadable codegen record" in log
    assert result["from_cache"] == 0 and result["outs"] == first["outs"]
    again, _ = _child(caches)  # both were saved again: the next process is warm
    assert again["from_cache"] == 1 and again["outs"] == first["outs"]


def test_a_record_for_other_inputs_is_declined(cold, tmp_path):
    root, first = cold
    caches = _copy(root, tmp_path)
    for p in (caches / "tessera" / "warm").glob("*.pkl"):
        p.unlink()
    for p in (caches / "tessera" / "codegen").glob("*.json"):
        data = json.loads(p.read_text())
        data["inputs"][0][1] = [99] + data["inputs"][0][1][1:]  # another shape for the first input
        p.write_text(json.dumps(data))
    result, log = _child(caches)
    assert "saved for other inputs" in log
    assert result["from_cache"] == 0 and result["outs"] == first["outs"]


def test_a_hit_that_bypasses_the_hook_is_compiled_again(cold, tmp_path):
    root, first = cold
    result, log = _child(_copy(root, tmp_path), hook="off")
    assert "no inner graph of this compile reached tessera" in log
    assert result["backend"] == "tessera" and result["programs"] == 1 and result["from_cache"] == 0
    assert result["outs"] == first["outs"]
