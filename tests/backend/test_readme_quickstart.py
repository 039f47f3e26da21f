"""The README's CPU quickstart runs as written, in a fresh process: its program is split over both virtual devices
(at least one cut edge) and equals eager (the block asserts it)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TEST_DEVICE

ROOT = Path(__file__).resolve().parents[2]


def quickstart_block() -> str:
    """The ```python block after the README's ``quickstart-cpu`` marker."""
    text = (ROOT / "README.md").read_text()
    match = re.search(r"<!-- quickstart-cpu:[^\n]*-->\n```python\n(.*?)\n```", text, re.S)
    assert match, "README.md lost its quickstart-cpu block"
    return match.group(1) + "\n"


@pytest.mark.skipif(TEST_DEVICE != "cpu", reason="the CPU quickstart")
def test_readme_cpu_quickstart_splits_the_model_and_equals_eager(tmp_path):
    script = tmp_path / "quickstart.py"
    script.write_text(quickstart_block())
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TRITON_INTERPRET", None)  # as in a user's shell: the backend sets it for its own launches
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = proc.stdout.strip().splitlines()[-1]
    launches = dict((d, int(n)) for d, n in re.findall(r"(cpu:\d) (\d+)", line.split("cut edge")[0]))
    cuts = int(re.search(r"(\d+) cut edge\(s\)", line).group(1))
    assert line.startswith("graph 0/0: tessera,") and launches.get("cpu:0", 0) > 0 and launches.get("cpu:1", 0) > 0
    assert cuts >= 1, line
    assert "TesseraFallbackWarning" not in proc.stderr, proc.stderr[-2000:]
