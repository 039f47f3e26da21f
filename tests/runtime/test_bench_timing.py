"""The pure logic of the GPU timing tools, on CPU: interleaved rounds and their figures
(``torch_tessera.measure.paired_timing``), the fresh-input replays of ``bench/gpu_home_gap.py``
(``torch_tessera.compat.cudagraph_trees``, ``torch_tessera.measure.gpu_checks``), and the must-show verdict of
``bench/gpu_generate_check.py`` (``torch_tessera.measure.gpu_checks``).

The GPU runs themselves (CUDA graphs, reduce-overhead's cudagraph trees, two H200s) only the GPU machine can check.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from torch_tessera.compat.cudagraph_trees import fresh_ro_replay
from torch_tessera.measure import gpu_checks


@pytest.fixture
def pt():
    from torch_tessera.measure import paired_timing

    return paired_timing


def test_rounds_alternate_order_and_keep_per_round_medians(pt):
    order, clock = [], iter(range(1000))
    fns = {"a": lambda: order.append("a"), "b": lambda: order.append("b"), "c": lambda: order.append("c")}

    def time_call(fn):
        fn()
        return float(next(clock))

    got = pt.interleaved_rounds(fns, rounds=3, calls=2, time_call=time_call)
    assert order == ["a", "a", "b", "b", "c", "c"] + ["c", "c", "b", "b", "a", "a"] + ["a", "a", "b", "b", "c", "c"]
    assert got == {"a": [0.5, 10.5, 12.5], "b": [2.5, 8.5, 14.5], "c": [4.5, 6.5, 16.5]}
    with pytest.raises(ValueError):
        pt.interleaved_rounds(fns, rounds=0, calls=1, time_call=time_call)


def test_drift_cancels_in_paired_ratios(pt):
    # the machine slows down 20 % over the run; B is 3 % faster than A in every round
    a = [1.0 * (1 + 0.01 * r) for r in range(20)]
    b = [x / 1.03 for x in a]
    ratios = pt.paired_ratios(a, b)
    assert all(r == pytest.approx(1.03) for r in ratios)
    assert pt.spread(a)["max"] / pt.spread(a)["min"] == pytest.approx(1.19)
    with pytest.raises(ValueError):
        pt.paired_ratios(a, b[:-1])


def test_spread_quartiles_match_numpy(pt):
    import numpy as np

    xs = [5.0, 1.0, 4.0, 2.0, 3.0, 10.0]
    s = pt.spread(xs, scale=2.0)
    assert s["median"] == pytest.approx(2 * np.median(xs))
    assert (s["p25"], s["p75"]) == pytest.approx((2 * np.quantile(xs, 0.25), 2 * np.quantile(xs, 0.75)))
    assert (s["min"], s["max"], s["n"]) == (2.0, 20.0, 6)
    assert pt.spread([]) == {"n": 0}


@pytest.mark.parametrize("ratios, verdict", [([0.99, 1.0, 1.01, 1.02], "met"), ([1.05, 1.06, 1.07, 1.08], "MISSED"),
                                             ([1.0, 1.02, 1.04, 1.06], "undecided"), ([], "no data")])
def test_ratio_verdict_uses_quartiles(pt, ratios, verdict):
    assert pt.judge_ratio(ratios, 0.03) == verdict


def test_hop_estimate_subtracts_the_moved_kernels_compute(pt):
    # three launches; launches 1 and 2 moved to device 1, which runs launch 1 20 us slower and launch 2 5 us faster
    costs = [{0: 10e-6, 1: 40e-6, 2: 30e-6}, {0: 12e-6, 1: 60e-6, 2: 25e-6}]
    placement = {0: 0, 1: 1, 2: 1}
    assert pt.compute_difference_s(costs, placement) == pytest.approx(15e-6)
    assert pt.compute_difference_s(costs, {0: 0, 1: 0, 2: 0}) == 0.0
    home, placed = [1.000e-3, 1.010e-3], [1.075e-3, 1.085e-3]  # 75 us more per round, 2 cut edges
    assert pt.per_cut_us(placed, home, 2) == pytest.approx([37.5, 37.5])
    assert pt.per_cut_us(placed, home, 2, compute_s=15e-6) == pytest.approx([30.0, 30.0])
    with pytest.raises(ValueError):
        pt.per_cut_us(placed, home, 0)


def _spec(name, model="NVIDIA H200", sms=132, total=132, requested=None, gpu=True, throttle=0, budget=None):
    return SimpleNamespace(name=name, model=model, sm_count=sms, total_sms=total, requested_sms=requested,
                           is_gpu=gpu, throttle_sms=throttle, memory_budget=budget)


def test_whole_identical_devices(pt):
    ok, why = pt.whole_identical([_spec("cuda:0"), _spec("cuda:1")])
    assert ok and "2 whole NVIDIA H200" in why
    for other, word in [(_spec("cuda:1@72sm", sms=72, requested=72), "partition"),
                        (_spec("cuda:1", model="NVIDIA H100", sms=132), "differs"),
                        (_spec("cuda:1", throttle=36), "throttled"), (_spec("cpu:1", gpu=False), "not a GPU")]:
        ok, why = pt.whole_identical([_spec("cuda:0"), other])
        assert not ok and word in why, why
    assert not pt.whole_identical([_spec("cuda:0")])[0]


def test_whole_identical_on_parsed_device_strings(pt):
    from torch_tessera.target.devices import parse_devices

    assert not pt.whole_identical(parse_devices("cpu:0,cpu:1"))[0]
    specs = parse_devices("cuda:0,cuda:1@72sm", assume_gpu="h200")
    ok, why = pt.whole_identical(specs)
    assert not ok and "cuda:1@72sm" in why
    assert pt.whole_identical(parse_devices("cuda:0,cuda:1", assume_gpu="h200"))[0]


def _stale_node(inputs):
    """A cudagraph-trees node stand-in: input 1 is non-static; its buffer holds what the pool reused it for."""
    from torch._inductor.cudagraph_trees import CUDAGraphNode

    node = SimpleNamespace(non_static_input_idx=[1], expanded_dims=[[], []],
                           reconstructed_inputs=[inputs[0], torch.full_like(inputs[1], 31999 * 7)])
    node._copy_inputs_and_remove_from_src = CUDAGraphNode._copy_inputs_and_remove_from_src.__get__(node)
    seen = []
    node.graph = SimpleNamespace(replay=lambda: seen.append(node.reconstructed_inputs[1].clone()))
    return node, seen


def test_reduce_overhead_replay_copies_fresh_inputs_first():
    ids = torch.randint(0, 100, (4, 1))
    weight = torch.randn(3)
    node, seen = _stale_node([weight, ids])
    replay, copied = fresh_ro_replay(node, [weight, ids])
    assert copied == 1
    replay()
    replay()
    assert len(seen) == 2 and all(torch.equal(s, ids) for s in seen)  # each replay read this call's ids
    node.reconstructed_inputs[1].fill_(-1)  # the graph reused the buffer: the next replay copies again
    replay()
    assert torch.equal(seen[-1], ids)


def test_reduce_overhead_replay_refuses_when_copy_does_not_land():
    ids = torch.randint(0, 100, (4, 1))
    node, seen = _stale_node([torch.randn(3), ids])
    node._copy_inputs_and_remove_from_src = lambda dsts, srcs: None  # internals moved: nothing copied
    with pytest.raises(RuntimeError, match="do not hold"):
        fresh_ro_replay(node, [torch.randn(3), ids])
    assert not seen


def test_our_replay_copies_fresh_inputs_first():
    static = torch.zeros(4, 1, dtype=torch.long)
    seen = []
    state = SimpleNamespace(copy_list=[(1, static)], whole=SimpleNamespace(replay=lambda: seen.append(static.clone())))
    ids = torch.randint(1, 100, (4, 1))
    replay = gpu_checks.fresh_ours_replay(state, [torch.randn(3), ids])
    static.zero_()
    replay()
    assert torch.equal(seen[0], ids)


def test_generate_must_show_verdict():
    gen = gpu_checks
    per_layer = gen.per_layer_cuts({None: 1, 0: 6, 1: 5})
    assert per_layer == {"0": 6, "1": 5, "outside": 1, "min": 5, "max": 6, "layers_without_cut": 0, "layers": 2}
    row = {"cut_edges_per_layer": [per_layer, per_layer], "cosine_min_decode_before_difference": 0.9995,
           "tokens_equal_inductor": True}
    m = gen.must_show(row, 32)
    assert m["all"] and m["min_cut_edges_per_layer"] == [5, 5]
    assert "=> MET" in gen.must_show_summary("tessera af +graphs", {**row, "must_show": m})
    for change in [{"tokens_equal_inductor": False}, {"cosine_min_decode_before_difference": 0.998},
                   {"cosine_min_decode_before_difference": None},
                   {"cut_edges_per_layer": [per_layer, gen.per_layer_cuts({0: 3, 1: 0})]},
                   {"cut_edges_per_layer": [gen.per_layer_cuts({None: 4})]}, {"cut_edges_per_layer": []}]:
        assert not gen.must_show({**row, **change}, 32)["all"], change
    assert "MUST-SHOW x: no result" in gen.must_show_summary("x", {"error": "child exited 1"})


def test_concurrent_counts_give_the_rare_program_enough_calls():
    from torch_tessera.measure.execute import MIN_CONCURRENT_CALLS, concurrent_counts

    freq = {"denoise": 0.8242, "denoise@1": 0.1758}  # a request-streams plan of the MMDiT, 2026-11-30
    assert concurrent_counts(freq, 8) == {"denoise": 7, "denoise@1": 1}  # the old counts: off by up to half a call
    counts = concurrent_counts(freq, 8, MIN_CONCURRENT_CALLS)
    assert counts["denoise@1"] == MIN_CONCURRENT_CALLS
    steps = [counts[n] / f for n, f in freq.items()]  # workload steps each program's calls cover
    assert max(steps) / min(steps) - 1 < 1 / 32
    # frequent programs only: the settings' step count stands
    assert concurrent_counts({"prefill": 1.0, "decode": 2.016}, 32, MIN_CONCURRENT_CALLS) == {"prefill": 32,
                                                                                             "decode": 65}


def test_concurrent_counts_are_capped_and_ignore_programs_that_never_run():
    from torch_tessera.measure.execute import MAX_CONCURRENT_STEPS, MIN_CONCURRENT_CALLS, concurrent_counts

    counts = concurrent_counts({"big": 0.999, "tiny": 0.001}, 8, MIN_CONCURRENT_CALLS)
    assert counts["big"] == round(0.999 * MAX_CONCURRENT_STEPS)  # not 16 / 0.001 steps
    assert concurrent_counts({"a": 1.0, "idle": 0.0}, 8, MIN_CONCURRENT_CALLS) == {"a": 16, "idle": 1}


def test_cut_diagnose_times_more_calls_for_short_steps_and_measures_the_call_cost():
    """bench/gpu_cut_diagnose.py: ``timed_calls`` gives each mode about ``--min-timed-s`` of calls over all rounds
    (at least ``--calls``, at most ``--max-calls``); ``measured_call`` takes per plan host - graph - the call's copies
    (CallCost's copy term) and the model's median over plans, leaving failed plans and CPU runs alone."""
    from bench.gpu_cut_diagnose import measured_call, timed_calls

    args = SimpleNamespace(min_timed_s=0.3, rounds=2, calls=3, max_calls=200)
    assert timed_calls(args, 5e-3) == 30  # 0.3 s / 2 rounds / 5 ms
    assert timed_calls(args, 0.1) == 3 and timed_calls(args, 1e-6) == 200
    plans = {"a": {"seconds": {"executed": 5.0e-3, "device:executed@graph": 4.5e-3}},
             "b": {"seconds": {"executed": 6.0e-3, "device:executed@graph": 5.2e-3}},
             "c": {"seconds": {"executed": 4.0e-3, "device:executed@graph": 3.9e-3}},
             "d": {"error": "skipped"}}
    m = {"output_bytes": 1500, "input_bytes": 500, "sim_inputs": {"memory": {"device_bandwidth": [1e9]}},
         "plans": plans}
    measured_call(m, 2)  # copies: 2 micro-batches x 2000 bytes, read and written at 1 GB/s: 8 us
    assert [plans[k]["call_host_s"] for k in "abc"] == pytest.approx([492e-6, 792e-6, 92e-6])
    assert m["call_host_s"] == pytest.approx(492e-6) and "call_host_s" not in plans["d"]
    cpu = {"plans": {"a": {"seconds": {"executed": 5.0e-3}}}}
    measured_call(cpu, 2)
    assert "call_host_s" not in cpu
