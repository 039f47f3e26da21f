"""Errors the user causes reach the caller of a compiled model as themselves (not wrapped in Dynamo's
BackendCompilerFailed), with the message as raised and a traceback that starts at the backend; errors that fall back
to Inductor still do."""

from __future__ import annotations

import pickle
import traceback

import pytest
import torch

import torch_tessera
from torch_tessera.compat import dynamo as compat_dynamo
from torch_tessera.errors import ConfigError, InfeasiblePlanError, TesseraFallbackWarning


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))


def _call(options: dict, grad: bool = False) -> None:
    torch._dynamo.reset()
    f = torch.compile(_mlp(), backend="tessera", options=options, dynamic=False)
    with torch.set_grad_enabled(grad):
        f(torch.randn(4, 64))


def test_bad_option_raises_config_error_with_the_plain_message():
    with pytest.raises(ConfigError, match=r"^option timeout_s='abc' must be a positive number of seconds, e\.g\. 60$"
                       ) as e:
        _call({"timeout_s": "abc"})
    assert not isinstance(e.value, torch._dynamo.exc.BackendCompilerFailed)
    assert type(e.value).__name__ == "ConfigError" and type(e.value).__module__ == "torch_tessera.errors"
    frames = [f.name for f in traceback.extract_tb(e.value.__traceback__)]
    assert "tessera_backend" in frames and "_call_user_compiler" not in frames, frames
    back = pickle.loads(pickle.dumps(e.value))  # e.g. sent from a worker process
    assert type(back) is ConfigError and str(back) == str(e.value)


def test_unknown_option_is_caught_by_the_public_name():
    with pytest.raises(torch_tessera.ConfigError, match="Did you mean 'timeout_s'"):
        _call({"timeout": 5})


def test_plan_that_does_not_fit_raises_infeasible_plan_error():
    with pytest.raises(InfeasiblePlanError, match=r"device cpu:0,mem=1KB needs at least 2\.05 KB for activations "
                       r"alone \(the weights and buffers come on top\), has 1\.00 KB") as e:
        _call({"devices": ["cpu:0,mem=1KB", "cpu:1,mem=1KB"]})
    assert e.value.shortfalls and "TORCHDYNAMO_VERBOSE" not in str(e.value)


def test_missing_device_raises_device_unavailable_error():
    with pytest.raises(torch_tessera.DeviceUnavailableError, match=r"^sim:a100 is simulated: it has costs but no "
                       r"runtime; run on cuda:N or cpu:N$"):
        _call({"devices": "cpu:0,sim:a100"})


def test_missing_gpu_names_the_fixes_that_apply_to_the_backend():
    with pytest.raises(torch_tessera.DeviceUnavailableError, match=r"^cuda:9 is not present: this process sees ") as e:
        _call({"devices": "cpu:0,cuda:9"})
    msg = str(e.value)
    assert isinstance(e.value, torch_tessera.GpuNotPresentError) and e.value.fact in msg, msg
    assert "Run on a machine with that GPU" in msg and "options={'devices': 'cpu:0,cpu:1'}" in msg, msg
    assert "tessera plan --program dump/program_0.json" in msg, msg
    assert "--assume-gpu" not in msg and "tessera devices" not in msg, msg  # a CLI remedy that does not apply here
    back = pickle.loads(pickle.dumps(e.value))
    assert type(back) is torch_tessera.GpuNotPresentError and str(back) == msg and back.fix == e.value.fix


def test_a_missing_gpu_is_said_before_the_graph_is_lowered(monkeypatch):
    """The devices are checked before the lowering (Inductor's compile, seconds): nothing is lowered for a GPU the
    machine does not have."""
    from torch_tessera import lowering

    def lowered(*args, **kwargs):
        raise AssertionError("the graph was lowered before the missing GPU was reported")

    monkeypatch.setattr(lowering, "lower", lowered)
    with pytest.raises(torch_tessera.GpuNotPresentError, match=r"^cuda:9 is not present"):
        _call({"devices": "cpu:0,cuda:9"})


def test_policy_that_does_not_apply_names_the_option_and_the_fix():
    with pytest.raises(torch_tessera.NotApplicableError, match=r"^option policy='af' does not apply to this graph: "
                       r"af needs attention kernels.*Fix: use policy='throughput'"):
        _call({"devices": "cpu:0,cpu:1", "policy": "af"})


def test_fallback_raise_raises_inference_only_error():
    with pytest.raises(torch_tessera.InferenceOnlyError, match="tessera is inference-only"):
        _call({"fallback": "raise"}, grad=True)


def test_default_fallback_still_warns_and_runs():
    with pytest.warns(TesseraFallbackWarning, match="tessera is inference-only"):
        _call({}, grad=True)


def test_twin_pickles_as_the_plain_class_with_its_attributes():
    error = InfeasiblePlanError("does not fit", (("cpu:0", 2.0, 1.0),))
    twin = compat_dynamo.as_user_error(error, None)
    assert isinstance(twin, InfeasiblePlanError) and isinstance(twin, torch._dynamo.exc.ShortenTraceback)
    back = pickle.loads(pickle.dumps(twin))
    assert type(back) is InfeasiblePlanError and str(back) == "does not fit"
    assert back.shortfalls == (("cpu:0", 2.0, 1.0),)


def test_without_shorten_traceback_the_error_is_left_as_it_is(monkeypatch):
    error = ConfigError("bad")
    monkeypatch.delattr(torch._dynamo.exc, "ShortenTraceback")
    assert compat_dynamo.as_user_error(error, None) is error


@pytest.mark.parametrize("bases", [(OSError,), (ValueError, RuntimeError)], ids=["layout", "mro"])
def test_a_class_that_cannot_be_combined_is_left_as_it_is(monkeypatch, bases):
    clash = type("Clash", bases, {})  # another instance layout / a base order ConfigError's cannot merge with
    error = ConfigError("bad")
    monkeypatch.setattr(torch._dynamo.exc, "ShortenTraceback", clash)
    assert compat_dynamo.as_user_error(error, None) is error
