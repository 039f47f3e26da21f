"""Options parsing, registration and fallback behaviour of the backend."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest
import torch

from torch_tessera.backend import TesseraConfig, tessera_backend
from torch_tessera.errors import ConfigError, LoweringError


def test_unknown_option_lists_valid_ones_and_suggests():
    with pytest.raises(ConfigError) as e:
        TesseraConfig.from_options({"fallbak": "raise"})
    msg = str(e.value)
    assert "fallbak" in msg and "Did you mean 'fallback'" in msg
    assert "fallback" in msg and "dump_dir" in msg  # the valid options are listed


def test_bad_option_value():
    with pytest.raises(ConfigError, match="fallback='never'"):
        TesseraConfig.from_options({"fallback": "never"})


def test_graph_copies_values_and_combination():
    assert TesseraConfig.from_options({}).graph_copies == "link"
    assert TesseraConfig.from_options({"graph_copies": "producer", "cuda_graphs": True}).graph_copies == "producer"
    assert TesseraConfig.from_options({"graph_copies": "push", "cuda_graphs": "whole"}).graph_copies == "push"
    with pytest.raises(ConfigError, match="graph_copies='peer' is not one of"):
        TesseraConfig.from_options({"graph_copies": "peer", "cuda_graphs": True})
    with pytest.raises(ConfigError, match="also pass cuda_graphs=True"):
        TesseraConfig.from_options({"graph_copies": "producer", "cuda_graphs": "segments"})
    with pytest.raises(ConfigError, match="also pass cuda_graphs=True"):
        TesseraConfig.from_options({"graph_copies": "push"})


def test_static_inputs_values():
    assert TesseraConfig.from_options({}).static_inputs == "place"
    assert TesseraConfig.from_options({"static_inputs": "copy"}).static_inputs == "copy"
    with pytest.raises(ConfigError, match=r"static_inputs='once' is not one of \('place', 'copy'\)"):
        TesseraConfig.from_options({"static_inputs": "once"})
    with pytest.raises(ConfigError, match="Did you mean 'static_inputs'"):
        TesseraConfig.from_options({"static_input": "copy"})


def test_static_inputs_option_reaches_the_executor():
    """Through ``torch.compile`` to the runner and its executor, and kept by ``set_placement``."""
    from torch_tessera.backend.recording import RecordingBackend

    torch._dynamo.reset()
    backend = RecordingBackend(devices="cpu:0,cpu:1", policy="home", static_inputs="copy")
    f = torch.compile(lambda x: torch.relu(x) * 3.0, backend=backend, dynamic=False)
    x = torch.randn(7)
    torch.testing.assert_close(f(x), torch.relu(x) * 3.0)
    runner = backend.executors[0]
    assert runner.static_inputs == runner.executor.static_inputs == "copy"
    runner.set_placement(dict(runner.placement))
    assert runner.executor.static_inputs == "copy"


def test_unknown_option_through_torch_compile():
    torch._dynamo.reset()
    f = torch.compile(lambda x: x + 1, backend="tessera", options={"colour": "blue"})
    with pytest.raises(Exception, match="unknown tessera option 'colour'"):
        f(torch.ones(3))


def test_registered_by_name():
    import torch._dynamo

    assert "tessera" in torch._dynamo.list_backends()


def test_entry_point_works_without_importing_the_package():
    """``torch.compile(m, backend="tessera")`` finds us through the ``torch_dynamo_backends`` entry point."""
    code = textwrap.dedent(
        """
        import sys, torch
        f = torch.compile(lambda x: torch.nn.functional.gelu(x) * 2, backend="tessera")
        x = torch.randn(5)
        torch.testing.assert_close(f(x), torch.nn.functional.gelu(x) * 2)
        assert "torch_tessera" in sys.modules
        print("ok")
        """
    )
    from importlib.metadata import entry_points

    if not [e for e in entry_points(group="torch_dynamo_backends") if e.name == "tessera"]:
        pytest.fail("package not installed: run `pip install -e .` (the README's test command does)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")


def test_fallback_to_inductor_with_one_warning(caplog):
    torch._dynamo.reset()
    calls = []

    def backend(gm, inputs):
        fn = tessera_backend(gm, inputs)
        calls.append(fn)
        return fn

    f = torch.compile(lambda x: torch.relu(x) * 3.0, backend=backend, dynamic=True)
    with caplog.at_level(logging.WARNING, logger="torch_tessera"):
        x = torch.randn(7)
        torch.testing.assert_close(f(x), torch.relu(x) * 3.0)
    warnings = [r for r in caplog.records if r.name.startswith("torch_tessera") and r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "plain Inductor" in warnings[0].getMessage() and "'fallback': 'raise'" in warnings[0].getMessage()
    assert not hasattr(calls[0], "tessera_executors")  # Inductor's callable, not ours


def test_fallback_raise_reraises():
    torch._dynamo.reset()

    def backend(gm, inputs):
        return tessera_backend(gm, inputs, options={"fallback": "raise"})

    f = torch.compile(lambda x: torch.relu(x) * 3.0, backend=backend, dynamic=True)
    with pytest.raises(Exception) as e:
        f(torch.randn(7))
    chain = [e.value] + [getattr(e.value, "__cause__", None), getattr(e.value, "inner_exception", None)]
    assert any(isinstance(c, LoweringError) for c in chain) or "symbolic shape" in str(e.value)
