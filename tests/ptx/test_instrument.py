"""PTX instrumentation for observed extents (torch_tessera.ptx.instrument), checked on PTX text without a GPU."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.ptx.snippets import INDIRECT, MIXED, PTR, entry
from tests.ptx.test_compile import CONFIG, COPY, GATHER, SCATTER
from torch_tessera.errors import PTXParseError
from torch_tessera.ptx import AccessMode, access_from_ptx, compile_ptx
from torch_tessera.ptx.instrument import (U64_MAX, InstrumentError, ObservedSite, TraceSite, ViewSpan, check_launch,
                                          decode_trace, instrument_ptx)
from torch_tessera.ptx.parser import parse_ptx

GLOBAL_ACCESS = re.compile(r"^\s*(@!?%p\d+\s+)?((?:ld|st|atom|red)\.global\S*|cp\.async\.c[ag]\.shared\.global)\s")


def global_access_lines(ptx: str) -> list[tuple[int, str | None]]:
    """(1-based line, predicate) of every global access, found by a regex independent of the rewrite."""
    out = []
    for i, line in enumerate(ptx.split("\n"), 1):
        m = GLOBAL_ACCESS.match(line)
        if m:
            out.append((i, m.group(1).strip()[1:] if m.group(1) else None))
    return out


def strip_instrumentation(inst) -> str:
    """The instrumented text minus every line the rewrite added (and the comma it put after the last param)."""
    prefix = "%tss"
    kept = [line for line in inst.ptx.split("\n") if prefix not in line and inst.trace_param not in line]
    text = "\n".join(kept)
    return re.sub(r",(\n\))", r"\1", text, count=1)


def ptxas() -> str | None:
    try:
        import triton.backends.nvidia as nv
    except ImportError:
        return None
    path = Path(nv.__file__).parent / "bin" / "ptxas"
    return str(path) if path.exists() else shutil.which("ptxas")


@pytest.mark.parametrize("ptx", [MIXED, INDIRECT], ids=["mixed", "indirect"])
def test_every_global_access_gets_two_guarded_reductions_and_nothing_else_changes(ptx):
    inst = instrument_ptx(ptx)
    expected = global_access_lines(ptx)
    assert [(s.line, s.pred) for s in inst.sites] == expected and not inst.untraced
    assert strip_instrumentation(inst) == ptx  # every original line kept, in order
    lines = inst.ptx.split("\n")
    for site in inst.sites:
        at = next(i for i, line in enumerate(lines) if line == ptx.split("\n")[site.line - 1])
        guard = f"@{site.pred} " if site.pred else ""
        assert lines[at - 2].strip().startswith(f"{guard}red.global.min.u64 \t[%tss0+{16 * site.index}]")
        assert lines[at - 1].strip().startswith(f"{guard}red.global.max.u64 \t[%tss0+{16 * site.index + 8}]")
    fn = parse_ptx(inst.ptx)
    assert len(fn.params) == len(parse_ptx(ptx).params) + 1 and fn.params[-1].is_pointer
    assert fn.params[-1].name == inst.trace_param and inst.trace_param_index == len(fn.params) - 1
    assert inst.block == (128, 1, 1) and inst.trace_nbytes == 16 * len(inst.sites)


def test_widths_kinds_and_offsets_of_the_mixed_snippet():
    inst = instrument_ptx(MIXED)
    by_op = {s.opcode: s for s in inst.sites}
    assert by_op["ld.global.nc.L1::evict_first.L2::cache_hint.v4.b32"].width == 16
    assert by_op["cp.async.cg.shared.global"].width == 16 and by_op["cp.async.cg.shared.global"].kind == "load"
    assert by_op["red.global.add.f32"].kind == "atomic" and by_op["atom.global.gpu.acq_rel.add.f32"].writes
    assert by_op["ld.global.b32"].reads and not by_op["ld.global.b32"].writes
    # INDIRECT stores at [%rd5+4]: the traced address is the register plus 4, computed before the reductions
    ind = instrument_ptx(INDIRECT)
    store = next(s for s in ind.sites if s.kind == "store")
    assert store.width == 4
    assert "\tadd.s64 \t%tss1, %rd5, 4;" in ind.ptx.split("\n")
    assert "\tred.global.min.u64 \t[%tss0+32], %tss1;" in ind.ptx.split("\n")


def test_the_analysis_of_instrumented_ptx_is_unchanged_plus_an_atomic_trace_param():
    for ptx in (MIXED, INDIRECT):
        before, after = access_from_ptx(ptx), access_from_ptx(instrument_ptx(ptx).ptx)
        assert after.params[:-1] == before.params and after.indirect == before.indirect
        trace = after.params[-1]
        assert trace.mode == AccessMode.READ_WRITE and trace.atomic and not trace.data_dependent


def test_untraceable_accesses_are_listed_not_dropped():
    body = """
\t.reg .b32 \t%r<4>;
\t.reg .b64 \t%rd<4>;
\tld.param.b64 \t%rd1, [odd_param_0];
\tld.param.b64 \t%rd2, [odd_param_1];
\tld.global.b32 \t%r1, [%rd1];
\tcp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes [%r2], [%rd2, {%r3}], [%r3];
\tld.global.b32 \t%r2, [%r3];
\tret;
"""
    inst = instrument_ptx(entry("odd", [PTR, PTR], body))
    assert [s.opcode for s in inst.sites] == ["ld.global.b32"]
    reasons = [u.reason for u in inst.untraced]
    assert len(reasons) == 2 and "tensor-map" in reasons[0] and "64-bit" in reasons[1]
    parse_ptx(inst.ptx)


def test_malformed_ptx_still_raises_the_parse_error():
    with pytest.raises(PTXParseError, match="line"):
        instrument_ptx(MIXED.replace("ret;", "ret"))
    with pytest.raises(InstrumentError, match="parameter list"):
        instrument_ptx(entry("noparams", [], "\tret;"))


def test_decode_trace_reads_min_and_max_plus_width_and_skips_unexecuted_sites():
    inst = instrument_ptx(MIXED)
    words = inst.initial_trace()
    assert words[:4] == [U64_MAX, 0, U64_MAX, 0] and len(words) == 2 * len(inst.sites)
    high = 0xFFFF_0000_0000_0000  # above 2**63: a signed int64 read-back must give the same range
    words[0:4] = [0x1000, 0x10F0, high, high + 0x100]
    signed = [w - (1 << 64) if w >= 1 << 63 else w for w in words]
    for trace in (words, signed):
        observed = decode_trace(inst, trace)
        assert [(o.site.index, o.start, o.end) for o in observed] == [
            (0, 0x1000, 0x10F0 + 16), (1, high, high + 0x100 + inst.sites[1].width)]
    bad = inst.initial_trace()
    bad[0], bad[1] = 5, 4
    with pytest.raises(InstrumentError, match="min"):
        decode_trace(inst, bad)
    with pytest.raises(InstrumentError, match="words"):
        decode_trace(inst, [0])


def _site(index, kind, width=4):
    return TraceSite(index, 10 + index, {"load": "ld.global.b32", "store": "st.global.b32",
                                         "atomic": "atom.global.add.f32"}[kind], kind, width, None)


def test_check_launch_attributes_by_address_and_flags_unsound_modes_and_strays():
    base_a, base_b = 1 << 20, 1 << 21
    views = [ViewSpan("in_ptr0", "buf0", base_a, 0, 256, 1024), ViewSpan("out_ptr0", "buf1", base_b, 64, 128, 128)]
    observed = [
        ObservedSite(_site(0, "load"), base_a + 16, base_a + 200),
        ObservedSite(_site(1, "store"), base_b + 64, base_b + 128),
        ObservedSite(_site(2, "store"), base_a + 0, base_a + 4),  # a store into the read-only view
        ObservedSite(_site(3, "load"), base_a + 512, base_a + 516),  # inside buf0, outside its view
        ObservedSite(_site(4, "load"), 1 << 30, (1 << 30) + 4),  # in no storage at all
    ]
    static = {"in_ptr0": (True, False, False), "out_ptr0": (False, True, False)}
    checks, stray = check_launch(observed, views, static)
    a, b = checks
    assert (a.observed_reads, a.observed_writes, a.mode_sound, a.extent_sound) == (True, True, False, True)
    assert a.observed_extent == (0, 200) and a.coverage == pytest.approx(200 / 256)
    assert (b.observed_reads, b.observed_writes, b.mode_sound, b.mode_exact) == (False, True, True, True)
    assert b.observed_extent == (64, 128) and b.coverage == 1.0
    assert [s.line for s in stray] == [13, 14]
    assert "buf0 bytes [512, 516)" in stray[0].where and stray[1].where == "no storage passed to the launch"


def test_check_launch_marks_sites_inside_two_views_ambiguous():
    views = [ViewSpan("in_ptr0", "buf0", 4096, 0, 64, 64), ViewSpan("in_out_ptr0", "buf0", 4096, 0, 64, 64)]
    checks, stray = check_launch([ObservedSite(_site(0, "atomic"), 4096, 4100)], views,
                                 {"in_ptr0": (True, False, False), "in_out_ptr0": (True, True, True)})
    assert not stray and all(c.ambiguous for c in checks)
    assert [c.mode_sound for c in checks] == [False, True]


@pytest.mark.parametrize("target", [80, 90])
def test_ptxas_accepts_instrumented_triton_kernels(target, tmp_path):
    tool = ptxas()
    if tool is None:
        pytest.skip("no ptxas (Triton's NVIDIA backend ships one)")
    arch = f"sm_{target}a" if target >= 90 else f"sm_{target}"
    for source in (SCATTER, GATHER, COPY):
        compiled = compile_ptx(source, CONFIG, target)
        inst = instrument_ptx(compiled.ptx, source.name)
        assert [s.line for s in inst.sites] == [line for line, _ in global_access_lines(compiled.ptx)]
        path = tmp_path / f"{source.name}_{target}.ptx"
        path.write_text(inst.ptx)
        proc = subprocess.run([tool, f"-arch={arch}", str(path), "-o", os.devnull], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0, f"{source.name} sm_{target}: {proc.stderr}"
        assert access_from_ptx(inst.ptx).params[:-1] == access_from_ptx(compiled.ptx).params


class FakeDriver:
    """Stands in for cuda-python on CPU: checks the packed arguments against the instrumented PTX's params."""

    def __init__(self, fail: bool) -> None:
        self.fail, self.launches, self._params = fail, 0, {}

    def load(self, ptx, name):
        self._params[name] = parse_ptx(ptx).params
        return name, 0

    def launch(self, fn, grid, block, shared, values, stream):
        import ctypes

        params = self._params[fn]
        assert len(values) == len(params)
        assert [ctypes.sizeof(v) * 8 for v in values] == [p.width for p in params]
        assert all(g > 0 for g in grid) and block[0] % 32 == 0
        self.launches += 1
        if not self.fail:  # on CPU the pointers are host addresses: record site 0 at the first param's address
            trace, first = values[-1].value, values[0].value
            ctypes.c_uint64.from_address(trace).value = first
            ctypes.c_uint64.from_address(trace + 8).value = first
        if self.fail:
            from bench.gpu_ptx_extents import DriverError

            raise DriverError("fake driver: no GPU here")


@pytest.mark.parametrize("fail", [True, False], ids=["launch-fails", "launch-noop"])
def test_gpu_extents_bench_plumbing_on_cpu(fail, tmp_path):
    import json

    import torch

    from bench.gpu_ptx_extents import run

    driver = FakeDriver(fail)
    res = run(tmp_path, ["mlp"], limit=10, budget_s=60, device=torch.device("cpu"), driver=driver, target=90)
    rows = res["launches"]
    assert driver.launches == len(rows) >= 2 and all(r["model"] == "mlp" for r in rows)
    if fail:  # each failure is reported and the original kernel keeps the program correct
        assert all("fake driver" in r["error"] for r in rows) and res["models"]["mlp"]["output_matches_eager"]
        assert res["summary"]["launch_failures"] == len(rows)
    else:  # only site 0 "ran", at the first parameter's view start: the report turns it into a relative extent
        for r in rows:
            first, rest = r["params"][0], r["params"][1:]
            start = first["static_extent"][0]
            assert r["executed_sites"] == 1 and first["observed_extent"][0] == start and first["extent_sound"]
            assert all(p["observed_extent"] is None for p in rest) and not r["stray"]
            assert all(d["changed"] is None for d in r["changed_bytes"])  # the fake wrote no data
    saved = json.loads((tmp_path / "ptx_extents.json").read_text())
    assert saved["summary"] == res["summary"]
    assert "| mlp |" in (tmp_path / "ptx_extents.md").read_text()


def test_gpu_extents_bench_assembles_instrumented_ptx_with_triton_ptxas():
    from bench.gpu_ptx_extents import DriverError, assemble, ptxas_path

    if ptxas_path() is None:
        pytest.skip("no ptxas")
    assert assemble(instrument_ptx(MIXED).ptx, "sm_90a")[:4] == b"\x7fELF"
    with pytest.raises(DriverError, match="ptxas"):
        assemble(MIXED.replace("red.global.add.f32", "red.global.add.f99"), "sm_90a")
