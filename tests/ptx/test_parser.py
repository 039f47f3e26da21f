import pytest

from torch_tessera.errors import PTXParseError
from torch_tessera.ptx.parser import parse_entry_params, parse_ptx
from tests.ptx.snippets import INDIRECT, MIXED


def test_parses_params_instructions_and_loops():
    fn = parse_ptx(MIXED)
    assert fn.name == "mixed"
    assert [p.is_pointer for p in fn.params] == [True] * 5 + [False]
    assert fn.params[5].width == 32
    assert "global_smem" in fn.shared_symbols
    ld = next(i for i in fn.instrs if i.opcode.startswith("ld.global.nc"))
    assert ld.pred == "%p1"
    assert ld.operands == ("{ %r6, %r7, %r8, %r9 }", "[ %rd7 + 0 ]", "%rd8")
    assert len(fn.loop_heads) == 1  # the backward bra.uni
    assert parse_entry_params(MIXED) == fn.params


def test_instruction_line_numbers_match_the_text():
    fn = parse_ptx(INDIRECT)
    lines = INDIRECT.split("\n")
    for ins in fn.instrs:
        assert ins.opcode in lines[ins.line - 1]


@pytest.mark.parametrize("bad, why", [
    ("\tst.global.b32 \t[%rd5+4], %r2", "does not end with ';'"),
    ("\tst.global.b32 \t[%rd5+4, %r2;", "unbalanced"),
    ("\tld.param.b64 \t%rd9, [nonexistent_param_7];", "undeclared parameter"),
    ("\t@%p1 bra.uni \t$L__nowhere;", "undefined label"),
    ("\t1nvalid %r1, %r2;", "not a PTX instruction|bad opcode"),
])
def test_malformed_ptx_names_kernel_line_and_text(bad, why):
    lines = INDIRECT.split("\n")
    at = next(i for i, l in enumerate(lines) if "st.global" in l)
    broken = "\n".join(lines[:at] + [bad] + lines[at + 1:])
    with pytest.raises(PTXParseError, match=why) as err:
        parse_ptx(broken, kernel="my_kernel")
    msg = str(err.value)
    assert "my_kernel" in msg
    assert f"line {at + 1}" in msg
    assert bad.strip() in msg


def test_missing_entry_and_unclosed_body():
    with pytest.raises(PTXParseError, match="no '.entry'"):
        parse_ptx(".version 8.7\n.target sm_90\n")
    with pytest.raises(PTXParseError, match="not closed"):
        parse_ptx(INDIRECT.rstrip().rstrip("}"))
