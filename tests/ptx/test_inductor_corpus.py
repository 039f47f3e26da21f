"""Validation corpus: every Triton kernel Inductor makes for the model zoo, analysed from its PTX on sm_80 and sm_90.

On every kernel the PTX summary must agree with Inductor's own metadata: ``in_ptr`` parameters are never written,
``out_ptr`` and ``in_out_ptr`` parameters are written, parameters Inductor declares mutated are written, and atomics
appear exactly when Inductor says it emitted an atomic add. The summaries of both targets must agree (else
``analyze_program`` raises). Run with ``-s`` to see the kernel count.
"""

import re

import pytest

from torch_tessera.graph import build_dependency_graph
from torch_tessera.ptx import AccessMode, analyze_program
from tests.ptx.zoo import lower_fn, zoo

CHECKED: dict[str, int] = {}
MODELS = {name: (fn, inputs) for name, fn, inputs in zoo()}


def role_disagreements(launch, access, source) -> list[str]:
    out = []
    by = access.by_name
    for name in launch.tensor_args:
        p = by.get(name)
        if p is None:
            out.append(f"{name}: no summary")
            continue
        if name.startswith("in_ptr") and p.mode.writes and name not in launch.mutated:
            out.append(f"{name}: Inductor reads it only, PTX writes it ({p.mode.value})")
        if name.startswith(("out_ptr", "in_out_ptr")) and not p.mode.writes:
            out.append(f"{name}: Inductor writes it, PTX {p.mode.value}")
        if name in launch.mutated and not p.mode.writes:
            out.append(f"{name}: Inductor mutates it, PTX {p.mode.value}")
    found = re.search(r"'atomic_add_found': (True|False)", source.source)
    if found and (found.group(1) == "True") != any(p.atomic for p in access.params):
        out.append(f"atomic_add_found={found.group(1)} but PTX atomics on "
                   f"{[p.name for p in access.params if p.atomic]}")
    return out


@pytest.mark.parametrize("model", list(MODELS))
def test_ptx_summary_agrees_with_inductor_roles(model):
    fn, inputs = MODELS[model]
    programs = lower_fn(fn, *inputs)
    assert programs, f"{model}: nothing was lowered"
    problems = []
    for program in programs:
        accesses = analyze_program(program, targets=(80, 90))
        for launch in program.triton_launches:
            acc = accesses[launch.kernel]
            assert acc.targets == (80, 90)
            problems += [f"{launch.kernel}: {p}" for p in role_disagreements(launch, acc, program.kernels[launch.kernel])]
            assert all(p.mode != AccessMode.UNTOUCHED or p.name.startswith("in_ptr") for p in acc.params)
        CHECKED[model] = CHECKED.get(model, 0) + len(accesses)
        dag = build_dependency_graph(program, accesses)
        assert dag.num_kernels == len(program.launches)
    assert not problems, "\n".join(problems)


def test_report_corpus_size():
    print(f"\nPTX validation corpus: {sum(CHECKED.values())} distinct Triton kernels over {len(CHECKED)} models: "
          f"{CHECKED}")
    assert sum(CHECKED.values()) >= 20 or not CHECKED
