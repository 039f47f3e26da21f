"""Compile hand-written Triton kernels to PTX for sm_80 and sm_90 (no GPU needed) and check their summaries."""

import pytest

from torch_tessera.lowering.program import KernelSource
from torch_tessera.ptx import AccessMode, TargetDisagreementError, analyze_kernel, compile_ptx
from torch_tessera.ptx import _agree, access_from_ptx
from torch_tessera.ptx.compile import cache_dir
from torch_tessera.ptx.types import KernelAccess, ParamAccess

MODULE = '''
import triton
import triton.language as tl


@triton.jit
def scatter_add(in_ptr0, in_ptr1, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    x = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    m = x < xnumel
    idx = tl.load(in_ptr0 + x, m, other=0)
    v = tl.load(in_ptr1 + x, m, other=0.0)
    tl.atomic_add(out_ptr0 + idx, v, m)


@triton.jit
def gather_scale(in_ptr0, in_ptr1, in_out_ptr0, ks0, xnumel, XBLOCK: tl.constexpr):
    x = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    m = x < xnumel
    idx = tl.load(in_ptr0 + x, m, other=0)
    w = tl.load(in_ptr1 + idx * ks0, m, other=0.0)
    y = tl.load(in_out_ptr0 + x, m, other=0.0)
    tl.store(in_out_ptr0 + x, y * w, m)


@triton.jit
def copy_unused(in_ptr0, in_ptr1, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    x = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    tl.store(out_ptr0 + x, tl.load(in_ptr0 + x, x < xnumel), x < xnumel)
'''


def source(name, signature, constants=None):
    return KernelSource(name=name, source=MODULE, signature=signature, constants=constants or {})


SCATTER = source("scatter_add", {"in_ptr0": "*i64", "in_ptr1": "*fp32", "out_ptr0": "*fp32", "xnumel": "i32",
                                 "XBLOCK": "constexpr"})
# ks0 specialised to 1, as Inductor does for arguments equal to 1: it disappears from the PTX params.
GATHER = source("gather_scale", {"in_ptr0": "*i32", "in_ptr1": "*fp16", "in_out_ptr0": "*fp16", "ks0": "i32",
                                 "xnumel": "i32", "XBLOCK": "constexpr"}, {"ks0": 1})
COPY = source("copy_unused", {"in_ptr0": "*fp32", "in_ptr1": "*fp32", "out_ptr0": "*fp32", "xnumel": "i32",
                              "XBLOCK": "constexpr"})
CONFIG = {"XBLOCK": 256, "num_warps": 4, "num_stages": 1}


def test_atomic_scatter_agrees_on_sm80_and_sm90():
    acc = analyze_kernel(SCATTER, CONFIG, targets=(80, 90))
    assert acc.targets == (80, 90)
    by = acc.by_name
    assert by["in_ptr0"].mode == AccessMode.READ and by["in_ptr1"].mode == AccessMode.READ
    assert by["out_ptr0"].mode == AccessMode.READ_WRITE and by["out_ptr0"].atomic
    assert by["out_ptr0"].data_dependent and not by["in_ptr1"].data_dependent
    assert not acc.indirect


def test_gather_and_in_place_with_a_constant_specialised_param():
    acc = analyze_kernel(GATHER, CONFIG, targets=(80, 89, 90))
    assert [p.name for p in acc.params] == ["in_ptr0", "in_ptr1", "in_out_ptr0"]
    by = acc.by_name
    assert by["in_ptr1"].mode == AccessMode.READ and by["in_ptr1"].data_dependent
    assert by["in_out_ptr0"].mode == AccessMode.READ_WRITE and not by["in_out_ptr0"].atomic
    compiled = compile_ptx(GATHER, CONFIG, 90)
    assert compiled.param_names[:4] == ("in_ptr0", "in_ptr1", "in_out_ptr0", "xnumel")
    assert all(n.startswith("<scratch") for n in compiled.param_names[4:])


def test_unused_pointer_is_untouched():
    by = analyze_kernel(COPY, CONFIG).by_name
    assert by["in_ptr1"].mode == AccessMode.UNTOUCHED
    assert by["out_ptr0"].mode == AccessMode.WRITE


def test_ptx_is_cached_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    first = compile_ptx(COPY, CONFIG, 80)
    files = list(cache_dir().glob("copy_unused-*.ptx"))
    assert len(files) == 1 and files[0].read_text() == first.ptx
    files[0].write_text(first.ptx.replace("// Generated", "// cached copy, generated"))
    assert "cached copy" in compile_ptx(COPY, CONFIG, 80).ptx  # served from disk, not recompiled
    assert len(list(cache_dir().glob("copy_unused-*.ptx"))) == 1
    compile_ptx(COPY, {**CONFIG, "XBLOCK": 128}, 80)
    assert len(list(cache_dir().glob("copy_unused-*.ptx"))) == 2  # the config is part of the key


def test_disagreeing_targets_raise():
    def summary(mode, target):
        return KernelAccess("k", (ParamAccess("out_ptr0", mode),), targets=(target,))

    assert _agree("k", [summary(AccessMode.WRITE, 80), summary(AccessMode.WRITE, 90)]).targets == (80, 90)
    with pytest.raises(TargetDisagreementError, match="out_ptr0: write on sm_80 vs read-write on sm_90"):
        _agree("k", [summary(AccessMode.WRITE, 80), summary(AccessMode.READ_WRITE, 90)])


def test_ptx_of_a_compiled_kernel_reanalyses_identically():
    compiled = compile_ptx(SCATTER, CONFIG, 90)
    again = access_from_ptx(compiled.ptx, compiled.param_names, target=90)
    assert again.summary() == analyze_kernel(SCATTER, CONFIG, targets=(90,)).summary()



HELPER_MODULE = '''
import triton
import triton.language as tl
from torch._inductor.runtime import triton_helpers


@triton.jit
def clamp_max(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    x = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    m = x < xnumel
    v = tl.load(in_ptr0 + x, m, other=0.0)
    tl.store(out_ptr0 + x, triton_helpers.maximum(v, 0.0), m)
'''


def test_ptx_compiles_a_kernel_whose_helper_was_imported_under_the_interpreter(tmp_path):
    """Inductor's ``triton_helpers`` first imported inside the CPU interpreter scope stay interpreter functions after
    it closes; a kernel calling them then cannot compile in this process ("Unsupported function referenced"): it is
    compiled again in a subprocess. Runs in a fresh process, so the import happens under the interpreter."""
    import os
    import subprocess
    import sys

    code = (
        "import sys, json\n"
        "from torch_tessera.compat.triton import cpu_interpreter, interpreter_was_used\n"
        "from torch_tessera.lowering.program import KernelSource\n"
        "from torch_tessera.ptx import compile_ptx\n"
        "assert not interpreter_was_used()\n"
        "with cpu_interpreter():\n"
        "    from torch._inductor.runtime import triton_helpers  # jitted as interpreter functions\n"
        "assert interpreter_was_used()\n"
        "src = KernelSource(name='clamp_max', source=sys.stdin.read(), signature={'in_ptr0': '*fp32', "
        "'out_ptr0': '*fp32', 'xnumel': 'i32', 'XBLOCK': 'constexpr'}, constants={})\n"
        "out = compile_ptx(src, {'XBLOCK': 128, 'num_warps': 4, 'num_stages': 1}, 90)\n"
        "print('ENTRY' if '.entry clamp_max' in out.ptx else 'NO ENTRY')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TESSERA_CACHE_DIR"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", code], input=HELPER_MODULE, capture_output=True, text=True, env=env,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "ENTRY", out.stdout
