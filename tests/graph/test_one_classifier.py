"""One op classifier: the af baseline (through the DAG), the cost model and reports label every launch the same."""

import pytest
import torch

from torch_tessera.backend.pipeline import analyze, estimate
from torch_tessera.graph.op_class import OP_CLASSES, op_class
from torch_tessera.lowering.fake import lower_without_weights
from torch_tessera.lowering.op_class import OpClass, classify
from torch_tessera.lowering.program import ExternLaunch, Provenance, TensorArg, TritonLaunch
from torch_tessera.backend.recording import RecordingBackend
from torch_tessera.models import REGISTRY, build_model, build_module, get_model
from torch_tessera.scheduler import plan
from torch_tessera.target.costmodel import launch_features
from torch_tessera.target.devices import parse_devices

_PROGRAMS: dict = {}


def _program(name):
    """The tiny model's program: lowered without weights, or (qwen2-vl, whose image grid is data-dependent) compiled
    with real tiny weights on CPU through the recording backend."""
    if name not in _PROGRAMS:
        if name == "qwen2-vl":
            module, inputs = build_model(name, "tiny")
            backend = RecordingBackend(devices="cpu:0,cpu:1", policy="home")
            with torch.no_grad():
                torch.compile(module, backend=backend, dynamic=False)(*inputs)
            _PROGRAMS[name] = backend.programs[0]
        else:
            def build():
                return build_module(name, "tiny", device="meta"), get_model(name).example_inputs("tiny", device="meta")

            _PROGRAMS[name] = lower_without_weights(build).program
    return _PROGRAMS[name]


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_dag_and_cost_model_agree_on_every_launch(name):
    prog = _program(name)
    dag = analyze(prog)
    for launch in prog.launches:
        node = dag.node(launch.index).op_class
        assert node == launch_features(launch).kernel_class.value == classify(launch).value, launch
    assert {k.op_class for k in dag.nodes()} <= set(OP_CLASSES)


def test_af_places_exactly_the_attention_class_apart():
    prog = _program("llama")
    dag = analyze(prog)
    specs = parse_devices("sim:a100,sim:l40s")
    costs, topo = estimate(prog, specs)
    p = plan(dag, costs, topo, policy="af", cache_dir=False)
    attention = {l.index for l in prog.launches if classify(l) is OpClass.ATTENTION}
    assert attention and len(attention) < len(prog.launches)
    dev = dict(p.placement)
    assert len({dev[k] for k in attention}) == 1
    assert {dev[k] for k in dev if k not in attention}.isdisjoint({dev[k] for k in attention})


def _t(*size, dtype=torch.bfloat16):
    return TensorArg("b", 0, size, tuple(1 for _ in size), dtype)


def test_rules_the_two_old_classifiers_disagreed_on():
    attn = ("model.layers.0.self_attn",)
    qk = ExternLaunch(0, "aten::bmm.out", (_t(8, 16, 64), _t(8, 64, 16)), {}, (), (),
                      Provenance(aten_ops=("aten.bmm",), module_paths=attn))
    proj = ExternLaunch(1, "aten::mm.out", (_t(16, 64), _t(64, 64)), {}, (), (),
                        Provenance(aten_ops=("aten.mm",), module_paths=attn))
    rotary = TritonLaunch(2, "triton_poi_fused_bmm_cat_cos_sin_0", ("in_ptr0", "xnumel"), (_t(16), ), (1, 1, 1), {},
                          provenance=Provenance(aten_ops=("aten.bmm", "aten.cat", "aten.cos"),
                                                module_paths=("model.rotary_emb",)))
    softmax = TritonLaunch(3, "triton_per_fused__softmax_1", ("in_ptr0", "xnumel", "r0_numel"), (_t(16),), (1, 1, 1),
                           {}, provenance=Provenance(aten_ops=("aten._softmax",), module_paths=attn))
    red = TritonLaunch(4, "triton_red_fused_2", ("in_ptr0", "xnumel", "r0_numel"), (_t(16),), (1, 1, 1), {})
    assert classify(qk) is OpClass.ATTENTION and op_class(qk) == "attention"
    assert launch_features(qk).flops == 2.0 * 8 * 16 * 16 * 64 and launch_features(qk).tensor_core
    assert classify(proj) is OpClass.GEMM
    assert classify(rotary) is OpClass.ELEMENTWISE  # decomposed into FMAs, no tensor cores
    assert classify(softmax) is OpClass.ATTENTION
    assert classify(red) is OpClass.REDUCTION
