import networkx as nx

from torch_tessera.graph import build_dependency_graph
from torch_tessera.graph.op_class import op_class
from torch_tessera.lowering.program import BufferKind, ExternLaunch, Provenance, TritonLaunch
from tests.graph.programs import access, buffers, mm, program, triton, view

T, D = 4, 8  # tokens, head dim
READ_ONE = access("read_one", in_ptr0="read", out_ptr0="write")


def edges(dg):
    return {(u, v): d for u, v, d in dg.graph.edges(data=True)}


def test_qkv_split_of_one_gemm_output_carries_each_slice():
    bufs = buffers(x=(BufferKind.INPUT, T * D), w=(BufferKind.PARAMETER, D * 3 * T * D),
                   qkv=(BufferKind.TEMP, 3 * T * D), q=(BufferKind.TEMP, T * D), k=(BufferKind.TEMP, T * D),
                   v=(BufferKind.TEMP, T * D))
    launches = [mm(0, view("x", 0, (1, T * D)), view("w", 0, (T * D, 3 * T * D)), view("qkv", 0, (1, 3 * T * D)))]
    for i, name in enumerate("qkv"):  # qkv viewed as [3, T, D]: slice i is contiguous at offset i*T*D
        launches.append(triton(i + 1, "read_one", in_ptr0=view("qkv", i * T * D, (T, D)), out_ptr0=view(name, 0, (T, D))))
    dg = build_dependency_graph(program(bufs, launches), {"read_one": READ_ONE})
    e = edges(dg)
    slice_bytes = T * D * 4
    for i in range(3):
        assert e[(0, i + 1)]["kinds"] == {"RAW"}
        assert e[(0, i + 1)]["bytes"] == slice_bytes
        assert e[(0, i + 1)]["ranges"] == (("qkv", i * slice_bytes, (i + 1) * slice_bytes),)
    assert set(e) == {(0, 1), (0, 2), (0, 3)}  # the three readers are independent
    assert dg.raw_edges() == [(0, i, slice_bytes) for i in (1, 2, 3)]


def test_buffer_reuse_gives_war_and_waw_and_the_latest_writer_feeds_readers():
    bufs = buffers(x=(BufferKind.INPUT, 64), a=(BufferKind.TEMP, 64), b=(BufferKind.TEMP, 64),
                   c=(BufferKind.TEMP, 64))
    whole = lambda n: view(n, 0, (64,))
    launches = [
        triton(0, "read_one", in_ptr0=whole("x"), out_ptr0=whole("a")),  # a = f(x)
        triton(1, "read_one", in_ptr0=whole("a"), out_ptr0=whole("b")),  # b = g(a)
        triton(2, "read_one", in_ptr0=whole("b"), out_ptr0=whole("a")),  # a reused: a = h(b)
        triton(3, "read_one", in_ptr0=whole("a"), out_ptr0=whole("c")),  # reads the new a
    ]
    e = edges(build_dependency_graph(program(bufs, launches), {"read_one": READ_ONE}))
    assert e[(0, 1)]["kinds"] == {"RAW"} and e[(1, 2)]["kinds"] == {"RAW", "WAR"}
    assert e[(0, 2)]["kinds"] == {"WAW"} and e[(0, 2)]["bytes"] == 0
    assert e[(2, 3)]["kinds"] == {"RAW"} and e[(2, 3)]["bytes"] == 256
    assert (0, 3) not in e  # the old a was overwritten before launch 3 read it


def test_in_place_update_chains_writers():
    bufs = buffers(x=(BufferKind.INPUT, 32), y=(BufferKind.TEMP, 32), z=(BufferKind.TEMP, 32))
    whole = lambda n: view(n, 0, (32,))
    acc = {"read_one": READ_ONE, "inplace": access("inplace", in_out_ptr0="read-write", in_ptr0="read")}
    launches = [
        triton(0, "read_one", in_ptr0=whole("x"), out_ptr0=whole("y")),
        TritonLaunch(1, "inplace", ("in_out_ptr0", "in_ptr0"), (whole("y"), whole("x")), (1, 1, 1), {},
                     mutated=("in_out_ptr0",)),
        triton(2, "read_one", in_ptr0=whole("y"), out_ptr0=whole("z")),
    ]
    dg = build_dependency_graph(program(bufs, launches), acc)
    e = edges(dg)
    assert e[(0, 1)]["kinds"] == {"RAW", "WAW"} and e[(0, 1)]["bytes"] == 128
    assert e[(1, 2)]["kinds"] == {"RAW"} and (0, 2) not in e
    assert dg.node(1).reads == {"x", "y"} and dg.node(1).writes == {"y"}
    assert nx.is_directed_acyclic_graph(dg.graph)


def test_kv_cache_state_update_carries_only_the_new_slot():
    slots, width = 16, 8
    bufs = buffers(cache=(BufferKind.STATE, slots * width), kv=(BufferKind.INPUT, width),
                   out=(BufferKind.TEMP, width))
    pos = 5
    launches = [
        triton(0, "read_one", in_ptr0=view("kv", 0, (width,)), out_ptr0=view("cache", pos * width, (width,))),
        triton(1, "read_one", in_ptr0=view("cache", 0, (slots, width)), out_ptr0=view("out", 0, (width,))),
    ]
    e = edges(build_dependency_graph(program(bufs, launches), {"read_one": READ_ONE}))
    assert e[(0, 1)]["bytes"] == width * 4
    assert e[(0, 1)]["ranges"] == (("cache", pos * width * 4, (pos + 1) * width * 4),)


def test_strided_views_use_their_exact_bytes():
    bufs = buffers(m=(BufferKind.TEMP, 4 * 6), o=(BufferKind.TEMP, 8))
    launches = [
        triton(0, "read_one", in_ptr0=view("o", 0, (8,)), out_ptr0=view("m", 0, (4, 2), (6, 1))),  # columns 0:2
        triton(1, "read_one", in_ptr0=view("m", 4, (4, 2), (6, 1)), out_ptr0=view("o", 0, (8,))),  # columns 4:6
    ]
    e = edges(build_dependency_graph(program(bufs, launches), {"read_one": READ_ONE}))
    # the envelopes [0, 80) and [16, 96) overlap, the columns do not: no dependency of 1 on 0's bytes
    assert (0, 1) not in e or "RAW" not in e[(0, 1)]["kinds"]


def test_interleaved_strided_writes_both_reach_the_reader():
    """Two launches each write half the columns of one buffer (RoPE's neg-half and cat); a reader needs both.

    Treating a strided write as writing its whole envelope would make the second launch the last writer of the
    first one's columns and lose them when the launches run on different devices.
    """
    bufs = buffers(m=(BufferKind.TEMP, 4 * 16), o=(BufferKind.TEMP, 16), r=(BufferKind.TEMP, 64))
    launches = [
        triton(0, "read_one", in_ptr0=view("o", 0, (16,)), out_ptr0=view("m", 0, (4, 8), (16, 1))),  # cols 0:8
        triton(1, "read_one", in_ptr0=view("o", 0, (16,)), out_ptr0=view("m", 8, (4, 8), (16, 1))),  # cols 8:16
        triton(2, "read_one", in_ptr0=view("m", 0, (4, 16)), out_ptr0=view("r", 0, (4, 16))),
    ]
    e = edges(build_dependency_graph(program(bufs, launches), {"read_one": READ_ONE}))
    assert e[(0, 2)]["ranges"] == tuple(("m", 64 * i, 64 * i + 32) for i in range(4))
    assert e[(1, 2)]["ranges"] == tuple(("m", 64 * i + 32, 64 * i + 64) for i in range(4))
    assert e[(0, 2)]["bytes"] + e[(1, 2)]["bytes"] == 4 * 16 * 4


def test_a_write_known_only_by_its_envelope_is_read_modify_write():
    """A view with too many contiguous runs to enumerate: its write also reads the envelope, so the earlier
    writer's bytes between its runs still flow (through it) to later readers."""
    n = 5000  # 5000 runs of one element with stride 2 > MAX_RUNS
    bufs = buffers(m=(BufferKind.TEMP, 4 * 2 * n), o=(BufferKind.TEMP, 4 * n), r=(BufferKind.TEMP, 8 * n))
    launches = [
        triton(0, "read_one", in_ptr0=view("o", 0, (n,)), out_ptr0=view("m", 0, (2 * n,))),
        triton(1, "read_one", in_ptr0=view("o", 0, (n,)), out_ptr0=view("m", 0, (n,), (2,))),
        triton(2, "read_one", in_ptr0=view("m", 0, (2 * n,)), out_ptr0=view("r", 0, (2 * n,))),
    ]
    dg = build_dependency_graph(program(bufs, launches), {"read_one": READ_ONE})
    e = edges(dg)
    assert "m" in dg.node(1).reads
    assert "RAW" in e[(0, 1)]["kinds"] and "RAW" in e[(1, 2)]["kinds"]


def test_extern_schema_reads_and_writes():
    bufs = buffers(a=(BufferKind.INPUT, 16), b=(BufferKind.INPUT, 16), c=(BufferKind.TEMP, 16),
                   d=(BufferKind.TEMP, 16))
    launches = [
        mm(0, view("a", 0, (4, 4)), view("b", 0, (4, 4)), view("c", 0, (4, 4))),
        ExternLaunch(1, "aten::add_.Tensor", (view("c", 0, (4, 4)), view("a", 0, (4, 4))), {}, ("self",)),
        ExternLaunch(2, "aten::relu.default", (view("c", 0, (4, 4)),), {}, (), (view("d", 0, (4, 4)),)),
    ]
    dg = build_dependency_graph(program(bufs, launches), {})
    n = dg.nodes()
    assert n[0].reads == {"a", "b"} and n[0].writes == {"c"}  # out= is write-only
    assert n[1].reads == {"a", "c"} and n[1].writes == {"c"}  # self(a!) of an in-place op is read-write
    assert n[2].reads == {"c"} and n[2].writes == {"d"}  # a fresh output
    e = edges(dg)
    assert e[(0, 1)]["kinds"] == {"RAW", "WAW"} and e[(1, 2)]["kinds"] == {"RAW"}


def test_unsure_launches_are_marked():
    bufs = buffers(t=(BufferKind.INPUT, 8), y=(BufferKind.TEMP, 8))
    launches = [triton(0, "ptr_table", in_ptr0=view("t", 0, (8,)), out_ptr0=view("y", 0, (8,))),
                triton(1, "unknown_kernel", in_ptr0=view("y", 0, (8,)), out_ptr0=view("t", 0, (8,)))]
    acc = {"ptr_table": access("ptr_table", indirect=True, in_ptr0="read", out_ptr0="write")}
    n = build_dependency_graph(program(bufs, launches), acc).nodes()
    assert n[0].unsure and "no parameter" in n[0].unsure_reason
    assert n[1].unsure and "no PTX access summary" in n[1].unsure_reason
    assert n[1].writes == {"t"}  # Inductor's out_ptr role is the fallback


def test_op_classes_from_provenance():
    def launch(ops, paths=(), kernel="triton_poi_fused_0"):
        return TritonLaunch(0, kernel, (), (), (1, 1, 1), {}, provenance=Provenance(ops, (), paths))

    assert op_class(mm(0, None, None, None)) == "gemm"
    assert op_class(ExternLaunch(0, "aten::_scaled_dot_product_flash_attention.default", (), {}, ())) == "attention"
    assert op_class(launch(("aten.amax", "aten._softmax"), ("model.layers.0.self_attn",))) == "attention"
    assert op_class(launch(("aten.amax", "aten._softmax"), ("model.head",))) == "reduction"
    assert op_class(launch(("aten.var_mean", "aten.rsqrt", "aten.mul"))) == "norm"
    assert op_class(launch(("aten.pow", "aten.mean", "aten.rsqrt", "aten.mul"))) == "norm"  # RMSNorm
    assert op_class(launch(("aten.cumsum",))) == "reduction"
    assert op_class(launch(("aten.mul", "aten.silu"))) == "elementwise"
    assert op_class(ExternLaunch(0, "aten::index_put_.default", (), {}, ("self",))) == "other"


def test_scatter_write_does_not_hide_earlier_writers():
    from torch_tessera.ptx.types import AccessMode, KernelAccess, ParamAccess

    bufs = buffers(idx=(BufferKind.INPUT, 4), src=(BufferKind.INPUT, 4), out=(BufferKind.TEMP, 16),
                   res=(BufferKind.TEMP, 16))
    scatter = KernelAccess("scatter", (ParamAccess("in_ptr0", AccessMode.READ), ParamAccess("in_ptr1", AccessMode.READ),
                                       ParamAccess("out_ptr0", AccessMode.WRITE, data_dependent=True)))
    launches = [
        triton(0, "read_one", in_ptr0=view("src", 0, (4,)), out_ptr0=view("out", 0, (16,))),  # zero-fill
        TritonLaunch(1, "scatter", ("in_ptr0", "in_ptr1", "out_ptr0"),
                     (view("idx", 0, (4,)), view("src", 0, (4,)), view("out", 0, (16,))), (1, 1, 1), {}),
        triton(2, "read_one", in_ptr0=view("out", 0, (16,)), out_ptr0=view("res", 0, (16,))),
    ]
    e = edges(build_dependency_graph(program(bufs, launches), {"read_one": READ_ONE, "scatter": scatter}))
    assert "RAW" in e[(0, 1)]["kinds"] and e[(0, 1)]["bytes"] == 64  # the fill reaches the scatter's device
    assert e[(1, 2)]["bytes"] == 64


def test_each_node_is_one_frozen_record_with_derived_reads_and_writes():
    import dataclasses
    import pickle

    import pytest

    from torch_tessera.graph.types import NODE_KEY, KernelNode

    bufs = buffers(x=(BufferKind.INPUT, 32), y=(BufferKind.TEMP, 32), z=(BufferKind.TEMP, 32))
    whole = lambda n: view(n, 0, (32,))
    launches = [triton(0, "read_one", in_ptr0=whole("x"), out_ptr0=whole("y")),
                triton(1, "read_one", in_ptr0=whole("y"), out_ptr0=whole("z"))]
    dg = build_dependency_graph(program(bufs, launches), {"read_one": READ_ONE})
    assert all(set(d) == {NODE_KEY} for _, d in dg.graph.nodes(data=True))  # nothing stored beside the record
    k = dg.node(1)
    assert isinstance(k, KernelNode) and k.index == 1 and k.name == "read_one" and k.kind == "triton"
    assert k.read_ranges == (("y", 0, 128),) and k.write_ranges == (("z", 0, 128),)
    assert k.reads == {"y"} and k.writes == {"z"} and k.touched_bytes == 256
    with pytest.raises(dataclasses.FrozenInstanceError):
        k.name = "other"
    assert [n.index for n in dg.nodes()] == [0, 1]
    with pytest.raises(KeyError, match="launch 7 is not a kernel node"):
        dg.node(7)
    dg.graph.add_node(9, name="old-style")  # a node without its record, as an older pickle holds
    with pytest.raises(KeyError, match="DAG node 9 holds no KernelNode"):
        dg.node(9)
    dg.graph.remove_node(9)
    back = pickle.loads(pickle.dumps(dg))
    assert back.nodes() == dg.nodes() and back.node(1).writes == {"z"}
