"""An Inductor FX graph cache hit gives the same kernel program as a fresh codegen: the provenance that codegen
records is saved per generated module and reused, or codegen runs again when the record is missing."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from tests.ptx.zoo import lower_fn


def _block(x, w1, w2):
    h = F.silu(x @ w1) * (x @ w1).sigmoid()
    return torch.softmax(h @ w2, dim=-1) + x.mean()


def _program_of(inputs):
    """Lower ``_block`` with a fresh Dynamo (not run); returns its kernel program."""
    programs = lower_fn(_block, *inputs)
    assert len(programs) == 1
    return programs[0]


def _compiled_output(inputs):
    """``_block(*inputs)`` through the tessera backend with a fresh Dynamo."""
    torch._dynamo.reset()
    return torch.compile(_block, backend="tessera", dynamic=False)(*inputs)


def _provenance(program):
    return [(type(launch).__name__, getattr(launch, "kernel", getattr(launch, "op", None)),
             launch.provenance.aten_ops, launch.provenance.fx_nodes) for launch in program.launches]


@pytest.fixture
def caches(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path / "tessera"))
    # the FX graph cache path, as without the AOTAutograd cache, whose hit skips it (tests/lowering/test_warm_path.py)
    monkeypatch.setattr(torch._functorch.config, "enable_autograd_cache", False)
    return tmp_path


def test_fx_graph_cache_hit_reuses_the_codegen_record(caches, caplog):
    torch.manual_seed(0)
    inputs = (torch.randn(8, 16), torch.randn(16, 16), torch.randn(16, 16))
    first = _program_of(inputs)
    records = list((caches / "tessera" / "codegen").glob("*.json"))
    assert len(records) == 1, records
    with caplog.at_level(logging.DEBUG, logger="torch_tessera.lowering"):
        second = _program_of(inputs)
    assert "codegen record " in caplog.text and "reused" in caplog.text  # the hit path ran: no second codegen
    assert "generating it again" not in caplog.text
    assert _provenance(second) == _provenance(first)
    assert any(p[2] for p in _provenance(first))  # the record carries ATen ops, not empty provenance


def test_backend_through_a_cache_hit_equals_eager(caches, caplog):
    torch.manual_seed(0)
    inputs = (torch.randn(8, 16), torch.randn(16, 16), torch.randn(16, 16))
    out1 = _compiled_output(inputs)
    with caplog.at_level(logging.DEBUG, logger="torch_tessera.lowering"):
        out2 = _compiled_output(inputs)
    assert "codegen record " in caplog.text and "reused" in caplog.text
    torch.testing.assert_close(out1, _block(*inputs))
    torch.testing.assert_close(out2, _block(*inputs))


def test_missing_record_generates_again(caches, caplog):
    torch.manual_seed(0)
    inputs = (torch.randn(8, 16), torch.randn(16, 16), torch.randn(16, 16))
    first = _program_of(inputs)
    for p in (caches / "tessera" / "codegen").glob("*.json"):
        p.unlink()
    with caplog.at_level(logging.INFO, logger="torch_tessera"):
        second = _program_of(inputs)
    assert "generating it again" in caplog.text
    assert _provenance(second) == _provenance(first)


def test_unreadable_record_is_logged_and_regenerated(caches, caplog):
    torch.manual_seed(0)
    inputs = (torch.randn(8, 16), torch.randn(16, 16), torch.randn(16, 16))
    first = _program_of(inputs)
    for p in (caches / "tessera" / "codegen").glob("*.json"):
        p.write_text("{not json")
    with caplog.at_level(logging.INFO, logger="torch_tessera"):
        second = _program_of(inputs)
    assert "unreadable codegen record" in caplog.text
    assert _provenance(second) == _provenance(first)


def test_record_naming_other_kernels_is_not_trusted(caches, caplog):
    import json

    torch.manual_seed(0)
    inputs = (torch.randn(8, 16), torch.randn(16, 16), torch.randn(16, 16))
    first = _program_of(inputs)
    for p in (caches / "tessera" / "codegen").glob("*.json"):
        data = json.loads(p.read_text())
        for e in data["events"]:
            if e["kind"] == "triton":
                e["name"] += "_other"
        p.write_text(json.dumps(data))
    with caplog.at_level(logging.INFO, logger="torch_tessera"):
        second = _program_of(inputs)
    assert "does not name the kernels" in caplog.text
    assert _provenance(second) == _provenance(first)
