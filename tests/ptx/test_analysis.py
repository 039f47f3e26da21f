import logging

from torch_tessera.ptx import AccessMode, access_from_ptx
from tests.ptx.snippets import INDIRECT, MIXED, PTR, entry

NAMES = ["in_ptr0", "in_ptr1", "in_ptr2", "in_out_ptr0", "out_ptr0", "xnumel"]


def test_mixed_memory_forms_are_attributed():
    acc = access_from_ptx(MIXED, NAMES).by_name
    assert set(acc) == set(NAMES) - {"xnumel"}  # scalars are not summarised
    assert acc["in_ptr0"].mode == AccessMode.READ  # predicated vector ld.global.nc with cache hint
    assert acc["in_ptr1"].mode == AccessMode.READ  # cp.async global -> shared
    assert acc["in_ptr2"].mode == AccessMode.READ and acc["in_ptr2"].data_dependent  # gather via cp.async'd index
    assert not acc["in_ptr0"].data_dependent
    # pointer stored to shared and reloaded, then red in a loop: still attributed to its parameter
    assert acc["in_out_ptr0"].mode == AccessMode.READ_WRITE and acc["in_out_ptr0"].atomic
    assert acc["out_ptr0"].mode == AccessMode.READ_WRITE and acc["out_ptr0"].atomic  # atom
    assert not access_from_ptx(MIXED, NAMES).indirect


def test_pointer_loaded_from_memory_is_indirect():
    acc = access_from_ptx(INDIRECT, ["table", "src", "n"])
    assert acc.indirect and acc.unsure
    assert acc.by_name["table"].indirect and acc.by_name["table"].mode == AccessMode.READ
    assert acc.by_name["src"].mode == AccessMode.READ and not acc.by_name["src"].indirect
    assert "table" in acc.unsure_reason


def test_unknown_instruction_on_a_pointer_is_read_write_and_logged(caplog):
    body = """
\t.reg .b64 \t%rd<8>;
\t.reg .b32 \t%r<4>;
\tld.param.b64 \t%rd1, [k_param_0];
\tld.param.b64 \t%rd2, [k_param_1];
\tld.global.b32 \t%r1, [%rd1];
\tfrobnicate.global.b32 \t%rd3, %rd2, %r1;
\tret;
"""
    with caplog.at_level(logging.WARNING, logger="torch_tessera"):
        acc = access_from_ptx(entry("k", [PTR, PTR], body), ["in_ptr0", "in_ptr1"])
    assert acc.by_name["in_ptr0"].mode == AccessMode.READ
    assert acc.by_name["in_ptr1"].mode == AccessMode.READ_WRITE  # never a silent read-only
    assert acc.unknown == ("frobnicate.global.b32",)
    assert acc.by_name["in_ptr1"].notes and "frobnicate" in acc.by_name["in_ptr1"].notes[0]
    assert any("frobnicate" in r.getMessage() for r in caplog.records)


def test_untouched_and_store_only_params():
    body = """
\t.reg .b64 \t%rd<8>;
\t.reg .b32 \t%r<4>;
\tld.param.b64 \t%rd1, [k_param_0];
\tld.param.b64 \t%rd2, [k_param_1];
\tmov.b32 \t%r1, 0;
\tst.global.v2.b32 \t[%rd2+8], {%r1, %r1};
\tret;
"""
    acc = access_from_ptx(entry("k", [PTR, PTR], body), ["in_ptr0", "out_ptr0"]).by_name
    assert acc["in_ptr0"].mode == AccessMode.UNTOUCHED
    assert acc["out_ptr0"].mode == AccessMode.WRITE


def test_bulk_tensor_copies_through_tensor_map_params():
    tmap = ".align 64 .b8"
    body = """
\t.reg .b32 \t%r<8>;
\t.reg .b64 \t%rd<8>;
\tmov.b64 \t%rd1, k_param_0;
\tmov.b64 \t%rd2, k_param_1;
\tmov.b32 \t%r1, global_smem;
\tmov.b32 \t%r2, 0;
\tadd.s32 \t%r3, %r1, 8192;
\tcp.async.bulk.tensor.2d.shared::cta.global.mbarrier::complete_tx::bytes [%r1], [%rd1, {%r2, %r2}], [%r3];
\tcp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%rd2, {%r2, %r2}], [%r1];
\tret;
"""
    ptx = entry("k", [tmap, tmap], body).replace("k_param_0", "k_param_0[128]", 1).replace(
        "k_param_1,", "k_param_1[128],", 1)
    ptx = ptx.replace("\t.param .align 64 .b8 k_param_1\n", "\t.param .align 64 .b8 k_param_1[128]\n")
    acc = access_from_ptx(ptx, ["a_desc", "c_desc"]).by_name
    assert acc["a_desc"].mode == AccessMode.READ
    assert acc["c_desc"].mode == AccessMode.WRITE
