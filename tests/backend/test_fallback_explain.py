"""Visible fallback (TesseraFallbackWarning once per graph), torch_tessera.explain, inference only, unbacked symbols,
and no TRITON_INTERPRET left behind."""

from __future__ import annotations

import contextlib
import logging
import os
import warnings

import pytest
import torch

import torch_tessera
from torch_tessera.errors import TesseraFallbackWarning


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16))


def test_fallback_warns_once_with_reason_and_option_and_explain_says_so():
    torch._dynamo.reset()
    f = torch.compile(lambda x: torch.relu(x) * 3.0, backend="tessera", dynamic=True)
    x = torch.randn(7)
    with pytest.warns(TesseraFallbackWarning) as got:
        torch.testing.assert_close(f(x), torch.relu(x) * 3.0)
    msgs = [str(w.message) for w in got if issubclass(w.category, TesseraFallbackWarning)]
    assert len(msgs) == 1, msgs
    assert "static shape" in msgs[0] and "plain Inductor" in msgs[0] and "{'fallback': 'raise'}" in msgs[0]
    (report,) = torch_tessera.explain(f)
    assert report.backend == "fallback" and "static shape" in report.reason
    assert "fallback to Inductor" in str(torch_tessera.explain(f))


def test_explain_reports_tessera_launches_cuts_and_costs():
    torch._dynamo.reset()
    m, x = _mlp(), torch.randn(4, 16)
    f = torch.compile(m, backend="tessera", options={"devices": "cpu:0,cpu:1", "policy": "throughput"},
                      dynamic=False)
    assert len(torch_tessera.explain(f)) == 0  # nothing compiled before the first call
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", TesseraFallbackWarning)
        torch.testing.assert_close(f(x), m(x))
    (report,) = torch_tessera.explain(f)
    assert report.backend == "tessera" and report.reason is None and report.programs == 1
    assert set(report.launches) <= {"cpu:0", "cpu:1"} and sum(report.launches.values()) >= 2
    assert report.predicted_step_s is not None and report.predicted_step_s > 0
    assert report.costs.startswith("model: roofline model")
    assert report.costs.endswith("on CPU virtual devices the model is never calibrated (option costs='measured' times "
                                 "them)"), report.costs
    assert report.cuda_graphs is False  # CPU devices: graphs stay off by default
    line = str(torch_tessera.explain(f))
    assert "tessera" in line and "costs from the model (roofline model" in line and "cut edge" in line
    assert "costs model:" not in line
    assert f"predicted step {report.predicted_step_s * 1e3:.3f} ms," in line, line


def test_explain_single_device_has_no_plan():
    torch._dynamo.reset()
    m, x = _mlp(), torch.randn(4, 16)
    f = torch.compile(m, backend="tessera", dynamic=False)
    with torch.no_grad():
        f(x)
    (report,) = torch_tessera.explain(f)
    assert report.backend == "tessera" and report.costs is None and report.predicted_step_s is None
    assert report.launches == {"cpu": report.launches["cpu"]} and report.cut_edges == 0
    assert "costs no plan: one device," in str(torch_tessera.explain(f))


def test_measured_costs_on_one_device_say_nothing_is_measured(caplog):
    torch._dynamo.reset()
    m, x = _mlp(), torch.randn(4, 16)
    f = torch.compile(m, backend="tessera", dynamic=False, options={"costs": "measured"})
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="torch_tessera"):
        torch.testing.assert_close(f(x), m(x))
    assert any("costs='measured' but option devices is not set" in r.getMessage()
               and "nothing is placed, so nothing is measured" in r.getMessage() for r in caplog.records)
    (report,) = torch_tessera.explain(f)
    assert report.costs == "no plan: one device"
    assert "costs no plan: one device," in report.line(), report.line()


def test_unbacked_symbols_fall_back_and_equal_eager():
    torch._dynamo.reset()

    def fn(x):
        return torch.nonzero(x > 0).float().sum() + x.sum()

    f = torch.compile(fn, backend="tessera")
    x = torch.randn(16)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True), pytest.warns(
            TesseraFallbackWarning, match="nonzero .* data-dependent output shape"):
        torch.testing.assert_close(f(x), fn(x))


def test_training_falls_back_with_the_inference_only_warning_and_backward_works():
    torch._dynamo.reset()
    m = _mlp()
    ref = _mlp()
    x = torch.randn(4, 16)
    f = torch.compile(m, backend="tessera", dynamic=False)
    with pytest.warns(TesseraFallbackWarning, match="tessera is inference-only .* torch.no_grad()"):
        f(x).square().sum().backward()
    ref(x).square().sum().backward()
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_training_with_fallback_raise_is_one_clear_error():
    torch._dynamo.reset()
    f = torch.compile(_mlp(), backend="tessera", options={"fallback": "raise"}, dynamic=False)
    with pytest.raises(torch_tessera.InferenceOnlyError, match="^tessera is inference-only") as e:
        f(torch.randn(4, 16)).sum().backward()
    msg = str(e.value)
    assert "torch.inference_mode()" in msg and "backend='inductor'" in msg


@pytest.mark.parametrize("options", [{}, {"devices": "cpu:0,cpu:1", "policy": "random"}])
def test_cpu_compile_and_call_leave_no_triton_interpret(monkeypatch, options):
    """conftest sets TRITON_INTERPRET for the suite; here it starts unset, as in a user's process."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    torch._dynamo.reset()
    m, x = _mlp(), torch.randn(4, 16)
    f = torch.compile(m, backend="tessera", options=dict(options, fallback="raise"), dynamic=False)
    with torch.no_grad():
        torch.testing.assert_close(f(x), m(x))
        assert "TRITON_INTERPRET" not in os.environ
        torch.testing.assert_close(f(x), m(x))
    assert "TRITON_INTERPRET" not in os.environ
    (report,) = torch_tessera.explain(f)
    assert report.backend == "tessera"


def test_one_warning_when_a_function_recompiles_too_often():
    from torch_tessera.backend.explain import RECOMPILE_WARN_AFTER
    from torch_tessera.errors import TesseraRecompileWarning

    torch._dynamo.reset()

    def fn(x):
        return torch.relu(x) + 1.0

    f = torch.compile(fn, backend="tessera", dynamic=False)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        for n in range(2, RECOMPILE_WARN_AFTER + 4):
            torch.testing.assert_close(f(torch.ones(n)), fn(torch.ones(n)))
    recompiles = [str(w.message) for w in got if issubclass(w.category, TesseraRecompileWarning)]
    assert len(recompiles) == 1, recompiles
    assert ".<locals>.fn (" in recompiles[0] and f"{RECOMPILE_WARN_AFTER + 1} times" in recompiles[0]
    assert "compile_for_generate" in recompiles[0]


class _Doubler(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0


@contextlib.contextmanager
def _noop():
    yield


class _Stepper:
    @_noop()  # contextlib's ContextDecorator: Dynamo's root frame is contextlib's `inner`
    def step(self, x):
        return torch.relu(x) - 1.0


@pytest.mark.parametrize("make, subject", [
    (lambda: _Doubler(), "_Doubler (torch.nn.Module, forward at "),
    (lambda: _Stepper().step, "_Stepper.step ("),
], ids=["module", "decorated-method"])
def test_recompile_warning_names_what_the_user_compiled_and_the_failed_guard(make, subject):
    from torch_tessera.backend.explain import RECOMPILE_WARN_AFTER
    from torch_tessera.errors import TesseraRecompileWarning

    torch._dynamo.reset()
    fn = make()
    f = torch.compile(fn, backend="tessera", dynamic=False)
    with warnings.catch_warnings(record=True) as got, torch.no_grad():
        warnings.simplefilter("always")
        for n in range(2, RECOMPILE_WARN_AFTER + 3):
            torch.testing.assert_close(f(torch.ones(n)), fn(torch.ones(n)))
    (msg,) = [str(w.message) for w in got if issubclass(w.category, TesseraRecompileWarning)]
    assert f"compiled {subject}" in msg and os.path.basename(__file__) in msg, msg
    assert "inner" not in msg and "contextlib" not in msg, msg
    last = RECOMPILE_WARN_AFTER + 1  # the compile that warns: input length n = last + 1 after length last
    assert f"Last failed guard: tensor " in msg and f"expected {last}, actual {last + 1}" in msg, msg


def test_fallback_warning_names_the_callers_line():
    torch._dynamo.reset()
    f = torch.compile(lambda x: torch.relu(x) * 2.0, backend="tessera", dynamic=True)
    with pytest.warns(TesseraFallbackWarning) as got:
        f(torch.randn(5))  # the warning must point at this file, not at torch_tessera or torch internals
    (w,) = [w for w in got if issubclass(w.category, TesseraFallbackWarning)]
    assert os.path.abspath(w.filename) == os.path.abspath(__file__), w.filename


def test_explain_leaves_out_graphs_dynamo_dropped():
    torch._dynamo.reset()
    m, x = _mlp(), torch.randn(4, 16)
    f = torch.compile(m, backend="tessera", dynamic=False)
    with torch.no_grad():
        f(x)
    assert len(torch_tessera.explain(f)) == 1
    torch._dynamo.reset()  # drops the compiled graph
    with torch.no_grad():
        torch.testing.assert_close(f(x), m(x))  # compiles again
    reports = torch_tessera.explain(f)
    assert len(reports) == 1, str(reports)  # only the live graph, not the dropped one
    assert reports[0].backend == "tessera" and reports[0].programs == 1
