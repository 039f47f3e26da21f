"""Bad option values get a ConfigError that names the option and the valid values; the documented memory-budget
device syntax works; a plan that does not fit memory says so in the user's terms."""

from __future__ import annotations

import pytest
import torch

from torch_tessera.backend import TesseraConfig, tessera_backend
from torch_tessera.errors import ConfigError, InfeasiblePlanError
from torch_tessera.options import BACKEND_POLICIES


@pytest.mark.parametrize("options, message", [
    ({"timeout_s": "abc"}, "option timeout_s='abc' must be a positive number of seconds"),
    ({"timeout_s": -1}, "option timeout_s=-1 must be a positive number of seconds"),
    ({"devices": 123}, "option devices=123 must be a string such as 'cuda:0,cuda:1'"),
    ({"devices": ["cpu:0", 1]}, "or a list of such strings"),
    ({"devices": "mem=1KB,cpu:0"}, "option devices='mem=1KB,cpu:0': bad device string"),
    ({"devices": "cpu:0,cpu:0"}, "option devices='cpu:0,cpu:0': cpu:0 appears twice; give each device once"),
    ({"devices": "cpu:0,mem=abc,cpu:1"}, "'mem=abc' of device 'cpu:0': 'abc' is not a size"),
    ({"seed": "x"}, "option seed='x' must be an int"),
    ({"policy": "thruput"}, "option policy='thruput' is not one of ('throughput', 'latency'"),
    ({"policy": "thruput"}, "Did you mean 'throughput'?"),
    ({"cuda_graphs": "yes"}, "option cuda_graphs='yes' is not one of (None, False, True, 'whole', 'segments')"),
    ({"priority": 3}, "option priority=3 is not one of ('normal', 'urgent', 'background')"),
    ({"dump_dir": 5}, "option dump_dir=5 must be a directory path"),
    ({"dump_dir": "/proc/x"}, "option dump_dir='/proc/x': cannot create the directory"),
])
def test_bad_value_names_option_and_valid_values(options, message):
    with pytest.raises(ConfigError) as e:
        TesseraConfig.from_options(options)
    assert message in str(e.value)


def test_policies_come_from_one_home():
    from torch_tessera.backend import config, pipeline
    from torch_tessera.scheduler import POLICIES

    assert config.POLICIES is pipeline.BACKEND_POLICIES is BACKEND_POLICIES
    assert {"throughput", "latency", "af", "layer", "homo-L", "homo-R"} <= set(POLICIES)


@pytest.mark.parametrize("devices", ["cpu:0,mem=1MB,cpu:1", ["cpu:0,mem=1MB", "cpu:1"], ("cpu:0,mem=1MB", "cpu:1")])
def test_memory_budget_syntax_is_one_device_each(devices):
    assert TesseraConfig.from_options({"devices": devices}).devices == ("cpu:0,mem=1MB", "cpu:1")


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))


def test_memory_budget_syntax_compiles_and_equals_eager():
    torch._dynamo.reset()
    m, x = _mlp(), torch.randn(4, 64)
    f = torch.compile(m, backend="tessera", options={"devices": "cpu:0,mem=1MB,cpu:1", "fallback": "raise"},
                      dynamic=False)
    with torch.no_grad():
        torch.testing.assert_close(f(x), m(x))


@pytest.mark.parametrize("policy, devices, needed", [
    # no device holds even the activation reserve: the bytes named are a lower bound, and the message says so
    ("throughput", ["cpu:0,mem=1KB", "cpu:1,mem=1KB"],
     "cpu:0,mem=1KB needs at least 2.05 KB for activations alone (the weights and buffers come on top), has 1.00 KB"),
    ("homo-R", "cpu:0,cpu:1,mem=1KB", "cpu:1,mem=1KB needs 36.35 KB, has 1.00 KB"),
])
def test_plan_that_does_not_fit_names_device_bytes_and_option(policy, devices, needed):
    gm = torch.fx.symbolic_trace(_mlp())
    with torch.no_grad(), pytest.raises(InfeasiblePlanError) as e:
        tessera_backend(gm, [torch.randn(4, 64)], options={"devices": devices, "policy": policy})
    msg = str(e.value)
    assert needed in msg, msg
    assert "set by mem= in option devices=" in msg and "memory_budgets" not in msg
    # the fix names another policy only when the user's policy is not already the one that spreads the weights
    assert ("policy='throughput')" in msg.split("Fix:")[1]) == (policy != "throughput"), msg
    assert e.value.shortfalls and all(need > have for _, need, have in e.value.shortfalls)
    assert e.value.lower_bound == (policy == "throughput")


def test_split_devices_keeps_pieces_with_their_device():
    from torch_tessera.errors import DeviceUnavailableError
    from torch_tessera.target.devices import parse_devices, split_devices

    assert split_devices("cpu:0,mem=1KB,cpu:1") == ["cpu:0,mem=1KB", "cpu:1"]
    assert [d.name for d in parse_devices(["cpu:0,mem=1KB", "cpu:1"])] == ["cpu:0,mem=1KB", "cpu:1"]
    with pytest.raises(DeviceUnavailableError, match="option 'mem=1KB' comes before any device"):
        split_devices("mem=1KB,cpu:0")


def test_budgeted_device_left_idle_is_said_once_and_results_stay_eager():
    """``cpu:0,mem=1KB,cpu:1``: nothing fits in cpu:0's 1 KB, so the plan runs every launch on cpu:1; the user who set
    that budget sees a warning naming the device and the budget. A budget large enough to use both devices (or no
    budget) says nothing."""
    import warnings

    from torch_tessera.errors import TesseraIdleDeviceWarning

    m = _mlp()
    x = torch.randn(4, 64)
    gm = torch.fx.symbolic_trace(m)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f = tessera_backend(gm, [x], options={"devices": "cpu:0,mem=1KB,cpu:1", "fallback": "raise"})
        out = f(x)
        torch.testing.assert_close(out[0] if isinstance(out, (list, tuple)) else out, m(x))
    idle = [w for w in caught if issubclass(w.category, TesseraIdleDeviceWarning)]
    assert len(idle) == 1, [str(w.message) for w in caught]
    msg = str(idle[0].message)
    assert msg.startswith("device cpu:0 (option devices='cpu:0,mem=1KB,cpu:1') runs no kernel of this graph"), msg
    assert "1.00 KB set by mem=" in msg and "raise the budget" in msg, msg
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tessera_backend(gm, [x], options={"devices": "cpu:0,cpu:1", "fallback": "raise"})
    assert not [w for w in caught if issubclass(w.category, TesseraIdleDeviceWarning)]
