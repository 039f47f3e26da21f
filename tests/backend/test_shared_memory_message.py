"""A plan that does not fit the shared memory of one GPU's partitions, restated in the backend's terms."""

from __future__ import annotations

from types import SimpleNamespace

from torch_tessera.backend.checks import in_user_terms
from torch_tessera.errors import InfeasiblePlanError
from torch_tessera.target.devices import parse_devices


def test_pool_shortfall_names_the_gpu_its_partitions_and_the_option():
    devices = ("cuda:0@104sm", "cuda:0@24sm", "cuda:1")
    specs = parse_devices(list(devices), assume_gpu="h200")
    error = InfeasiblePlanError("request-dist does not fit: ...", (("cuda:0", 207.34e9, 141e9),))
    msg = str(in_user_terms(error, specs, SimpleNamespace(devices=devices, policy="request-dist")))
    assert ("GPU cuda:0 needs 207.34 GB for its partitions cuda:0@104sm, cuda:0@24sm together, has 141.00 GB (its "
            "memory, less any mem= budgets of its other partitions in option devices="
            "'cuda:0@104sm,cuda:0@24sm,cuda:1')") in msg, msg
    assert "Fix:" in msg and "policy='throughput'" in msg and "memory_budgets" not in msg
