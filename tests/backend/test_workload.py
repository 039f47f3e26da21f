"""Planning workloads built from registry models lowered without weights."""

from __future__ import annotations

import numpy as np

from torch_tessera.backend.workload import model_workload
from torch_tessera.target.devices import parse_devices


def test_llm_workload_has_prefill_and_decode_and_recosts_on_other_devices():
    mw = model_workload("llama", parse_devices("sim:a100,sim:l40s"), size="tiny", prefill_tokens=16, decode_batch=4,
                        mean_output_tokens=8)
    names = [p.name for p in mw.workload.programs]
    assert names == ["prefill", "decode"] and len(mw.programs) == 2
    assert mw.workload.programs[1].frequency == 8 / 4  # decode steps per request, shared by the batch
    other = mw.on_devices(parse_devices("sim:h100,sim:l4"))
    assert other.topology.devices == ("sim:h100", "sim:l4")
    for a, b in zip(mw.workload.programs, other.workload.programs):
        assert a.dag is b.dag and a.costs.kernels == b.costs.kernels
        assert b.costs.devices == ("sim:h100", "sim:l4")
        # the L4 (121 TFLOP/s, 300 GB/s) is faster than the H100 at no kernel by more than its boost clock is
        # higher (2,040 vs 1,980 MHz: latency-bound tiny kernels)
        assert np.all(b.costs.seconds[:, 1] >= b.costs.seconds[:, 0] * 1980 / 2040 * (1 - 1e-9))


# -- decode with a KV context ------------------------------------------------------------------------------------------
PROMPT, BATCH, OUT = 16, 4, 8


def _kv_geometry():
    from torch_tessera.models import llama_config

    c = llama_config("tiny")
    return c.num_hidden_layers, c.num_key_value_heads * (c.hidden_size // c.num_attention_heads) * 4  # fp32 bytes


def _reads(launch):
    from torch_tessera.lowering.capture import extern_accesses
    from torch_tessera.lowering.program import ExternLaunch

    if isinstance(launch, ExternLaunch):
        return extern_accesses(launch)[0]
    return {a.buffer for n, a in launch.tensor_args.items() if n.startswith(("in_ptr", "in_out_ptr"))}


def _attention_reads(program, name):
    """Attention launches reading buffer ``name``, directly or through one intermediate launch's output (a GQA
    ``repeat_kv`` copy of the cache is fused into an attention-named kernel by some Inductor versions, not others)."""
    from torch_tessera.lowering.capture import launch_writes
    from torch_tessera.target.costmodel import KernelClass, classify

    attention = [l for l in program.launches if classify(l) is KernelClass.ATTENTION]
    direct = [l for l in attention if name in _reads(l)]
    copies = set()
    for launch in program.launches:
        if name in _reads(launch):
            copies |= launch_writes(launch) - {name}
    return direct + [l for l in attention if l not in direct and _reads(l) & copies]


def test_decode_reads_a_context_sized_kv_cache_marked_state_and_prefill_hands_it_over():
    from torch_tessera.backend.workload import default_decode_context
    from torch_tessera.lowering.program import BufferKind
    from torch_tessera.scheduler.problem import compile_problem

    mw = model_workload("llama", parse_devices("sim:a100,sim:l40s"), size="tiny", prefill_tokens=PROMPT,
                        decode_batch=BATCH, mean_output_tokens=OUT)
    context = default_decode_context(PROMPT, OUT)
    assert context == PROMPT + OUT // 2
    layers, per_position = _kv_geometry()
    prefill, decode = mw.programs
    for prog, batch in ((prefill, 1), (decode, BATCH)):
        state = {b.name: b for b in prog.buffers_of(BufferKind.STATE)}
        for i in range(layers):
            for kind in ("key", "value"):
                b = state[f"b_kv_{kind}_{i}"]  # written in place: a graph input the program mutates
                assert b.nbytes == batch * context * per_position
    # Decode attention reads the whole cache of every layer (directly or through its GQA-expanded copy).
    for i in range(layers):
        for kind in ("key", "value"):
            readers = _attention_reads(decode, f"b_kv_{kind}_{i}")
            assert readers, f"no attention launch reads b_kv_{kind}_{i}"
    # The kernels writing the cache count as attention (the attention side owns the cache under ``af``).
    ddag = mw.workload.programs[1].dag
    writers = [k for k in ddag.nodes() if any(b.startswith("b_kv_key_") for b in k.writes)]
    assert writers and all(k.op_class == "attention" for k in writers)
    # The prompt's K/V are handed over from the prefill's owner to the decode's owner: one STATE edge per cache
    # buffer, carrying the prompt's rows (at least PROMPT positions, at most the prefill's whole cache).
    pb = compile_problem(mw.workload, mw.topology)
    handed = {pb.eranges[e][0][0]: pb.ebytes[e] for e in range(len(pb.ekind)) if pb.ekind[e] == "STATE"}
    for i in range(layers):
        for kind in ("key", "value"):
            nbytes = handed[f"b_kv_{kind}_{i}"]
            assert PROMPT * per_position <= nbytes <= context * per_position
            # both programs' writers of one cache buffer are grouped (one owner per program)
            src = [e for e in range(len(pb.ekind)) if pb.ekind[e] == "STATE"
                   and pb.eranges[e][0][0] == f"b_kv_{kind}_{i}"][0]
            assert pb.prog[pb.esrc[src]] == 0 and pb.prog[pb.edst[src]] == 1


def test_predicted_decode_cost_grows_with_the_context():
    from torch_tessera.backend.workload import _cached_build_fn
    from torch_tessera.lowering.fake import lower_without_weights
    from torch_tessera.target.costmodel import KernelClass, RooflineModel, estimate_costs, launch_features

    specs = parse_devices("sim:a100,sim:l40s")
    attention_bytes, seconds, roofline = [], [], []
    for context in (64, 2048):
        program = lower_without_weights(_cached_build_fn("llama", "tiny", BATCH, 1, context)).program
        feats = [launch_features(l) for l in program.launches]
        attention_bytes.append(sum(f.nbytes for f in feats if f.kernel_class is KernelClass.ATTENTION))
        seconds.append(estimate_costs(program, specs).seconds.sum(axis=0))
        roofline.append(estimate_costs(program, specs, model=RooflineModel()).seconds.sum(axis=0))
    _, per_position = _kv_geometry()
    # attention moves at least the whole K and V caches of every layer: bytes grow with the context, ~linearly
    assert attention_bytes[1] >= 2 * 2 * BATCH * 2048 * per_position
    assert attention_bytes[1] / attention_bytes[0] > 0.5 * 2048 / 64
    assert np.all(seconds[1] > seconds[0])  # on both devices
    # over bandwidth alone (the roofline), the slower-memory L40S (864 GB/s) loses more time to the longer context
    # than the A100 (2039 GB/s); the kernel model adds the L40S's 4.7x fp32 CUDA-core rate for the tiny model's
    # fp32 attention arithmetic, so there the comparison can go either way
    growth = roofline[1] - roofline[0]
    assert growth[1] > growth[0]


def test_a_context_shorter_than_the_prompt_is_refused():
    import pytest

    with pytest.raises(ValueError, match="decode_context"):
        model_workload("llama", parse_devices("sim:a100,sim:l40s"), size="tiny", prefill_tokens=PROMPT,
                       decode_batch=BATCH, mean_output_tokens=OUT, decode_context=PROMPT - 1)
