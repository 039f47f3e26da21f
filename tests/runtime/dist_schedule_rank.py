"""One gloo rank of ``test_distributed.test_two_gloo_ranks_replay_the_explicit_schedule``.

Run as ``python -m tests.runtime.dist_schedule_rank MODEL OUT.json`` with torchrun's environment (``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``). Every rank builds the registry model ``MODEL`` (tiny, seed 0) and
lowers it; then, for random placements (``PLACEMENTS`` seeds) and every micro-batch count in 1..4, both ranks replay
the placement's explicit pipelined schedule (one memory domain per rank) on fresh inputs per micro-batch. Each rank
records whether the steps it ran are its device's stream of the schedule, in order; rank 0 also records the largest
difference from eager and whether the outputs equal the in-process replay of the same schedule bitwise.
"""

from __future__ import annotations

import json
import sys

import torch

#: placement seeds per model
PLACEMENTS = (0, 1, 2)


def main(name: str, out: str) -> None:
    from tests.runtime.test_pipelining import _compile, _substitute
    from torch_tessera.models import build_model, get_model
    from torch_tessera.runtime.distributed import DistributedExecutor, agree_on_plan, init_distributed
    from torch_tessera.runtime.runner import random_placement
    from torch_tessera.scheduler.modulo import build_pipelined_schedule
    from torch_tessera.scheduler.pipeline_schedule import TransferStep

    ctx = init_distributed("cpu", timeout_s=60.0)
    torch.manual_seed(0)
    model, inputs = build_model(name, "tiny")
    runner, template = _compile(model, inputs)
    spec = get_model(name)
    cases = []
    for seed in PLACEMENTS:
        placement = agree_on_plan(ctx, runner.program, random_placement(runner.dag, 2, seed))
        ex = DistributedExecutor(runner.program, runner.dag, placement, ctx, runner.kernel_objects)
        for m in range(1, 5):
            sched = build_pipelined_schedule(runner.dag, placement, m, domains=(0, 1), devices=2)
            xs = [spec.example_inputs("tiny", seed=100 * seed + 10 * m + k) for k in range(m)]
            batches = [_substitute(template, inputs, x) for x in xs]
            ex.trace = []
            with torch.no_grad():
                got = ex.run_pipelined(batches, schedule=sched)
            ran = [s for _, s in ex.trace]
            case = {"seed": seed, "micro_batches": m, "order": ran == list(sched.streams[ctx.rank]), "steps": len(ran),
                    "transfers": len(sched.steps(TransferStep)),
                    "sent": [sorted(e) for e in ex.stats.batch_cut_edges_sent],
                    "received": [sorted(e) for e in ex.stats.batch_cut_edges_received]}
            if got is not None:
                with torch.no_grad():
                    want = [_first(model(*x)) for x in xs]
                    runner.set_placement(placement)
                    ref = runner.executor.run_pipelined(batches, schedule=sched)
                case["max_abs_diff_eager"] = max(float((g[0].float() - w.float()).abs().max())
                                                 for g, w in zip(got, want))
                case["allclose_eager"] = all(torch.allclose(g[0], w, rtol=1.3e-6, atol=1e-5)
                                             for g, w in zip(got, want))
                case["equal_inprocess"] = all(torch.equal(a, b) for g, r in zip(got, ref)
                                              for a, b in zip(g, r) if isinstance(a, torch.Tensor))
            cases.append(case)
    with open(out, "w") as f:
        json.dump({"rank": ctx.rank, "cases": cases}, f)


def _first(out: object) -> torch.Tensor:
    """A model's first output tensor."""
    return out[0] if isinstance(out, (list, tuple)) else out


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
