"""``tessera dist-run``: run a registry model's plan with one process per device, and check it.

Launch with torchrun, one rank per device (rank r runs device r of ``--devices``)::

    torchrun --nproc-per-node 2 -m torch_tessera.cli dist-run --model llama --size tiny --devices cpu:0,cpu:1
    torchrun --nproc-per-node 2 -m torch_tessera.cli dist-run --model llama --devices cuda:0,cuda:1 --policy af

Every rank builds the model with the same seed and lowers it on its own device; rank 0 chooses the placement and
broadcasts it; every rank checks it holds the same program (:func:`agree_on_plan`). Rank 0 then compares the
distributed outputs with eager PyTorch and with the in-process runtime on the same devices, and checks that the ranks
together transferred exactly the placement's cut edges. Rank 0 prints the verdict and a table of the ranks
(:mod:`~torch_tessera.commands.dist_report`); ``--json`` makes every rank print its record as one JSON line instead,
``--json PATH`` writes each rank's record to a file. The default placement is the planner's (``--policy
throughput``, as ``tessera plan``).

A scheduler policy's plan carries its pipelined schedule (the one its simulator scored,
:attr:`~torch_tessera.scheduler.Plan.schedules`): rank 0 broadcasts it and every rank replays it for a call
or group of its micro-batch count (other counts, and the ``random``, ``attention`` and ``home`` placements, replay a
unit-cost schedule of the placement, logged; each rank reports ``schedule_sources``).

``--micro-batches N --slots S`` then runs N micro-batches with other inputs (seeded, the same on every rank) through
:meth:`DistributedExecutor.run_pipelined`: each group of S (default: the plan schedule's micro-batches, else 2)
replays the placement's explicit pipelined schedule over S micro-batches (a last smaller group its own); rank 0
compares each with eager, with the in-process replay of the same schedules and with the in-process single call, and
checks that every micro-batch transferred exactly the placement's cut edges and each rank ran its device's steps in
the schedule's order.

``--inject-failure RANK:exit[:CALL]`` (or ``:hang``) makes that rank exit (or stop answering) just before its first
send of call CALL (default 0; the micro-batches of a pipelined run count as calls after the ``--calls`` ones): the
other ranks must then fail with :class:`~torch_tessera.errors.PeerFailureError` within ``--timeout``. It exists to
test the failure path.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import Any

from torch_tessera import jsonout
from torch_tessera.commands.dist_report import format_result, rank_row
from torch_tessera.errors import ConfigError, TesseraError

log = logging.getLogger(__name__)

HELP = "run a model's plan with one process per device (launch with torchrun) and check it against eager"

#: Policies: the scheduler's (the planner's ``throughput`` first: the default) and ours (``home``, ``random``,
#: ``attention``: attention launches on device 1).
POLICIES = ("throughput", "latency", "af", "layer", "homo-L", "homo-R", "random", "attention", "home")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``tessera dist-run``."""
    parser.add_argument("--model", default="llama", help="registry model name (default: llama)")
    parser.add_argument("--size", default="tiny", choices=["tiny", "full"], help="model size (default: tiny)")
    parser.add_argument("--batch", type=int, default=None, help="batch size (default: the model's)")
    parser.add_argument("--seq", type=int, default=None, help="tokens per sequence (default: the model's)")
    parser.add_argument("--devices", default=None,
                        help="one device per rank, comma-separated (default: cuda:0..N-1 with CUDA, else cpu:0..N-1)")
    parser.add_argument("--policy", default="throughput", choices=POLICIES,
                        help="placement policy (default: throughput, the planner's, as tessera plan)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random placement")
    parser.add_argument("--network", default="rdma400", help="link model for devices on different hosts")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds any wait on a peer may take")
    parser.add_argument("--calls", type=int, default=2, help="distributed calls to run (default: 2)")
    parser.add_argument("--weights", default="local", choices=["local", "send"],
                        help="local: every rank uses its own copy of the weights; send: rank 0 sends them")
    parser.add_argument("--micro-batches", type=int, default=0,
                        help="then run this many micro-batches through run_pipelined (default: 0, none)")
    parser.add_argument("--slots", type=int, default=None,
                        help="micro-batches in flight with --micro-batches (default: the plan schedule's, else 2)")
    parser.add_argument("--no-inprocess", action="store_true", help="skip the comparison with the in-process runtime")
    parser.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH",
                        help="for machines: every rank prints its record as one JSON line instead of rank 0's table; "
                             "with PATH, each rank also writes its record there ({rank} is replaced)")
    parser.add_argument("--inject-failure", default=None, metavar="RANK:MODE",
                        help="testing: RANK exits (MODE exit) or stops answering (MODE hang) before its first send "
                             "(RANK:MODE:CALL: its first send of call CALL)")


def _fault_hook(spec: str | None, rank: int) -> Any:
    if not spec:
        return None
    who, _, mode = spec.partition(":")
    mode, _, at = mode.partition(":")
    if mode not in ("exit", "hang"):
        raise ConfigError(f"--inject-failure {spec!r}: MODE must be exit or hang")
    if int(who) != rank:
        return None
    from torch_tessera.runtime.schedule import CopyStep

    def hook(call: int, step: Any) -> None:
        if isinstance(step, CopyStep) and step.src == rank and call >= int(at or 0):
            print(f"DIST-RUN-FAULT {time.time():.3f} rank {rank} {mode} before sending {step.buffer} (edge {step.edge}) "
                  f"of call {call}", flush=True)
            if mode == "exit":
                os._exit(17)
            time.sleep(3600)

    return hook


def _placement(args: argparse.Namespace, runner: Any, specs: list,
               hosts: tuple[str, ...]) -> tuple[dict[int, int], tuple]:
    """The placement of ``args.policy`` and the plan's pipelined schedules (empty for our policies and for plans
    the simulator did not score)."""
    from torch_tessera.backend.pipeline import estimate, place

    program, dag = runner.program, runner.dag
    if args.policy == "attention":
        attn = {k.index for k in dag.nodes() if k.op_class == "attention"}
        return {launch.index: int(launch.index in attn) for launch in program.launches}, ()
    if args.policy in ("home", "random"):
        placement, _ = place(program, dag, specs, args.policy, seed=args.seed)
        return dict(placement), ()
    costs, topology = estimate(program, specs, hosts=hosts)
    placement, plan = place(program, dag, specs, args.policy, costs=costs, topology=topology)
    return dict(placement), _plan_schedules(plan, dag, costs, topology, len(specs))


def _plan_schedules(plan: Any, dag: Any, costs: Any, topology: Any, ranks: int) -> tuple:
    """The plan's pipelined schedule (:meth:`~torch_tessera.scheduler.Plan.schedule_of`), as one tuple, when the
    simulator scored it and ranks can replay it; a simulated plan that carries none (read from a file written before
    plans carried schedules) has it built again from its placement (logged)."""
    from torch_tessera.runtime.dist_replay import check_replayable
    from torch_tessera.scheduler.gantt import simulated_schedule

    if plan.simulated_seconds is None:
        log.warning("the %s plan was not simulated: it carries no schedule; replaying unit-cost schedules", plan.policy)
        return ()
    schedule = plan.schedule_of()
    if schedule is None:
        log.info("the %s plan carries no schedule: building it again from its placement", plan.policy)
        schedule = simulated_schedule(plan, dag, costs, topology).schedule
    try:
        check_replayable(schedule, plan.placement, ranks)
    except TesseraError as e:
        log.warning("ranks cannot replay the %s plan's schedule (%s): replaying unit-cost schedules", plan.policy, e)
        return ()
    return (schedule,)


def missing_gpu_fix(args: argparse.Namespace) -> str:
    """The remedy when --devices names a GPU this machine lacks."""
    return ("dist-run runs one process on each device it names: run it on a machine with them, or here with "
            "--devices cpu:0,cpu:1 (gloo).")


def run(args: argparse.Namespace) -> int:
    """Run one rank of ``tessera dist-run``; returns 0 on success, 1 when a check fails."""
    from torch_tessera.runtime.distributed import init_distributed, shutdown

    rank, world = int(os.environ.get("RANK", "-1")), int(os.environ.get("WORLD_SIZE", "0"))
    if rank < 0:
        raise ConfigError("tessera dist-run runs under torchrun: torchrun --nproc-per-node N -m torch_tessera.cli "
                          "dist-run ...")
    import torch

    from torch_tessera.target.devices import split_devices

    devices = split_devices(args.devices) if args.devices else [
        f"cuda:{i}" if torch.cuda.is_available() else f"cpu:{i}" for i in range(world)]
    if len(devices) != world:
        raise ConfigError(f"--devices names {len(devices)} devices for {world} ranks; give one per rank")
    ctx = None
    try:
        from torch_tessera.target.devices import parse_device

        spec = parse_device(devices[rank])
        ctx = init_distributed("cpu" if spec.kind.value == "cpu" else f"cuda:{spec.index}", args.timeout)
        result = _run_rank(args, ctx, devices)
    except TesseraError as e:
        if ctx is None:
            raise  # nothing joined yet: the CLI prints the error
        print(f"tessera dist-run: error: {e}", file=sys.stderr, flush=True)
        shutdown(ctx, failed=True)  # exits the process (status 2): teardown with a dead peer can hang
    _report(args, result)
    shutdown(ctx)
    return 0 if result.get("ok", True) else 1


def _run_rank(args: argparse.Namespace, ctx: Any, devices: list[str]) -> dict:
    import torch

    from torch_tessera.backend.recording import RecordingBackend
    from torch_tessera.models import build_module, get_model
    from torch_tessera.target.devices import parse_device
    from torch_tessera.runtime.distributed import DistributedExecutor, agree_on_plan, agree_on_schedules
    from torch_tessera.runtime.schedule import cut_edge_count

    model = build_module(args.model, args.size).to(ctx.device)
    dtype = next(model.parameters()).dtype
    inputs = get_model(args.model).example_inputs(args.size, args.batch, args.seq, device=ctx.device, dtype=dtype)
    home = ctx.rank == 0
    with torch.no_grad():
        want = model(*inputs) if home else None
        torch._dynamo.reset()
        # rank 0 lowers for all devices, so that it can also run the in-process executor as a reference
        local = ",".join(devices) if home and not args.no_inprocess else devices[ctx.rank]
        backend = RecordingBackend(devices=local, policy="home")
        compiled = torch.compile(model, backend=backend, dynamic=False)
        t0 = time.perf_counter()
        compiled(*inputs)
        compile_s = time.perf_counter() - t0
        if len(backend.executors) != 1:
            raise TesseraError(f"{args.model} lowered to {len(backend.executors)} programs; dist-run handles one")
        runner = backend.executors[0]
        placement, schedules = (_placement(args, runner, [parse_device(d) for d in devices], ctx.hosts) if home
                                else (None, None))
        placement = agree_on_plan(ctx, runner.program, placement)
        schedules = agree_on_schedules(ctx, schedules)
        if args.slots is None:
            args.slots = schedules[0].micro_batches if schedules else 2
        inprocess = None
        if home and not args.no_inprocess:
            runner.set_placement(placement)
            inprocess = [t.clone() for t in _as_list(compiled(*inputs))]
        import torch.distributed as dist

        dist.barrier(group=ctx.control)  # start together: a peer's wait should not count rank 0's reference run
        executor = DistributedExecutor(runner.program, runner.dag, placement, ctx, runner.kernel_objects,
                                       weights=args.weights, step_hook=_fault_hook(args.inject_failure, ctx.rank),
                                       schedules=schedules)
        inproc_executor = runner.executor if inprocess is not None else None
        runner.executor = executor  # the compiled model now runs this rank's part of the plan
        seen: list = []
        executor.run = lambda a: (seen.append(list(a)) if not seen else None, DistributedExecutor.run(executor, a))[1]
        seconds, got = [], None
        for _ in range(args.calls):
            t0 = time.perf_counter()
            got = compiled(*inputs)
            if ctx.device.type == "cuda":
                torch.cuda.synchronize(ctx.device)
            seconds.append(time.perf_counter() - t0)
        del executor.run
        single = {"calls": executor.calls, "messages": executor.stats.messages, "ranges": dict(executor.stats.ranges)}
        piped = _pipelined(args, ctx, model, inputs, seen, executor, inproc_executor) if args.micro_batches else None
    stats = executor.stats
    mine = {"rank": ctx.rank, "device": str(ctx.device), "host": ctx.hosts[ctx.rank],
            "launches": executor.launches_executed // max(1, executor.calls),
            "cut_edges_sent": sorted(stats.cut_edges_sent), "cut_edges_received": sorted(stats.cut_edges_received),
            "ranges": single["ranges"], "messages": single["messages"], "bytes_sent": dict(stats.bytes_sent),
            "batches": stats.batches, "schedule_sources": {str(m): w for m, w in executor.schedule_sources.items()}}
    if piped is not None:
        mine["pipelined"] = {**piped["rank"], "batch_cut_edges_sent": [sorted(e) for e in stats.batch_cut_edges_sent],
                             "batch_cut_edges_received": [sorted(e) for e in stats.batch_cut_edges_received],
                             "cut_ranges": stats.ranges["cut"] - single["ranges"].get("cut", 0)}
    every: list = [None] * ctx.world_size
    dist.all_gather_object(every, mine, group=ctx.control)
    result = {**mine, "compile_s": compile_s, "seconds_per_call": seconds, "policy": args.policy,
              "world_size": ctx.world_size, "total_launches": len(runner.program.launches)}
    if home:
        result["per_rank"] = [rank_row(r, devices[r["rank"]]) for r in every]
        cuts = cut_edge_count(runner.dag, placement)
        result.update(_checks(got, want, inprocess, every, cuts, len(runner.program.launches)))
        if piped is not None:
            result["pipelined"] = {**mine["pipelined"],
                                   **_pipelined_checks(piped, every, cuts, piped["cut_ranges"])}
            result["failures"] += result["pipelined"]["failures"]
            result["ok"] = not result["failures"]
    return result


def _micro_batch_inputs(inputs: tuple, m: int) -> list:
    """Other inputs of the same shapes for micro-batch ``m`` (seeded: the same on every rank): normal floats, integers
    in the range of the example's (token ids)."""
    import torch

    gen = torch.Generator().manual_seed(1000 + m)
    out = []
    for x in inputs:
        if x.is_floating_point():
            out.append(torch.randn(x.shape, generator=gen).to(x.device, x.dtype))
        else:
            lo, hi = int(x.min()), int(x.max()) + 1
            out.append(torch.randint(lo, hi, x.shape, generator=gen, dtype=x.dtype).to(x.device))
    return out


def _pipelined(args: argparse.Namespace, ctx: Any, model: Any, inputs: tuple, seen: list, executor: Any,
               inproc_executor: Any) -> dict:
    """The pipelined run (every rank) and, on rank 0, its references: eager, in-process pipelined and single call."""
    import torch

    if not seen:
        raise ConfigError("--micro-batches needs --calls >= 1 (the first call shows the program's input order)")
    template = seen[0]
    xs = [_micro_batch_inputs(inputs, m) for m in range(args.micro_batches)]
    batches = []
    for x in xs:
        b = list(template)
        for old, new in zip(inputs, x):
            hits = [i for i, a in enumerate(b) if a is old]
            if not hits:
                raise TesseraError("a model input is not among the program's inputs; cannot build micro-batches")
            for i in hits:
                b[i] = new
        batches.append(b)
    import torch.distributed as dist

    dist.barrier(group=ctx.control)
    executor.trace = []
    t0 = time.perf_counter()
    got = executor.run_pipelined(batches, args.slots)
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    seconds = time.perf_counter() - t0
    groups = [batches[g:g + args.slots] for g in range(0, len(batches), args.slots)]
    schedules = [executor.schedule_for(len(g)) for g in groups]
    in_order = _trace_in_order(executor.trace, schedules, ctx.rank)
    executor.trace = None
    out: dict = {"rank": {"seconds": seconds, "micro_batches": args.micro_batches, "slots": args.slots,
                          "schedule_order": in_order}}
    if got is None:
        return out
    from torch_tessera.scheduler.pipeline_schedule import TransferStep

    out["cut_ranges"] = sum(len(t.ranges) for s in schedules for t in s.steps(TransferStep))
    out["got"] = [[t.clone() if isinstance(t, torch.Tensor) else t for t in g] for g in got]
    out["eager"] = [_as_list(model(*x)) for x in xs]
    if inproc_executor is not None:
        out["inproc_pipelined"] = [o for g, s in zip(groups, schedules)
                                   for o in inproc_executor.run_pipelined(g, schedule=s)]
        out["inproc_single"] = [inproc_executor.run(b) for b in batches]
    return out


def _trace_in_order(trace: list, schedules: list, rank: int) -> bool:
    """Whether the steps this rank ran are its device's steps of each replayed schedule, in the schedule's order."""
    want = [s for sched in schedules for s in (sched.streams[rank] if rank < sched.devices else ())]
    return [s for _, s in trace] == want


def _pipelined_checks(piped: dict, every: list, cuts: int, cut_ranges: int) -> dict:
    """Rank 0's checks of the pipelined run: each micro-batch vs eager and in-process, its cut edges, the ranges its
    schedules' transfers carry (``cut_ranges``, all micro-batches) and each rank's issue order."""
    import torch

    got, n = piped["got"], len(piped["got"])
    out: dict = {**piped["rank"], "failures": [], "max_abs_diff_eager": 0.0}
    off = [r["rank"] for r in every if not r["pipelined"]["schedule_order"]]
    if off:
        out["failures"].append(f"ranks {off} ran steps outside their device's order in the schedule")
    for m, (g, w) in enumerate(zip(got, piped["eager"])):
        out["max_abs_diff_eager"] = max(out["max_abs_diff_eager"], float((g[0].float() - w[0].float()).abs().max()))
        if not torch.allclose(g[0], w[0], rtol=1.3e-6, atol=1e-5):
            out["failures"].append(f"micro-batch {m}: output differs from eager")
    if n > 1 and all(torch.equal(got[0][0], g[0]) for g in got[1:]):
        out["failures"].append("every micro-batch gave the same output: were the inputs different?")
    for key in ("inproc_pipelined", "inproc_single"):
        if key in piped:
            same = [all(torch.equal(a, b) for a, b in zip(g, r) if isinstance(a, torch.Tensor))
                    for g, r in zip(got, piped[key])]
            out[f"equal_{key}"] = all(same) and len(same) == n
            if not out[f"equal_{key}"]:
                out["failures"].append(f"micro-batches {[m for m, s in enumerate(same) if not s]} differ from {key}")
    per_batch = []
    for m in range(n):
        sent = {tuple(e) for r in every for e in r["pipelined"]["batch_cut_edges_sent"][m]}
        received = {tuple(e) for r in every for e in r["pipelined"]["batch_cut_edges_received"][m]}
        per_batch.append(len(sent))
        if len(sent) != cuts or sent != received:
            out["failures"].append(f"micro-batch {m}: {len(sent)} cut edges sent, {len(received)} received; the "
                                   f"placement cuts {cuts}")
    out["cut_edges_per_batch"] = per_batch
    out["cut_edges_transferred"] = sum(per_batch)
    sent_ranges = sum(r["pipelined"]["cut_ranges"] for r in every) // 2  # each range counted by sender and receiver
    out["cut_ranges"] = sent_ranges
    if sent_ranges != cut_ranges:
        out["failures"].append(f"{sent_ranges} cut ranges moved for {n} micro-batches; their schedules' transfers "
                               f"carry {cut_ranges}")
    return out


def _as_list(x: Any) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _checks(got: Any, want: Any, inprocess: list | None, every: list, cuts: int, launches: int) -> dict:
    """Rank 0's checks: outputs vs eager and in-process, cut edges transferred, launches run."""
    import torch

    out: dict = {"cut_edges": cuts, "failures": []}
    got_l, want_l = _as_list(got), _as_list(want)
    out["max_abs_diff_eager"] = max(float((g.float() - w.float()).abs().max()) for g, w in zip(got_l, want_l))
    try:
        torch.testing.assert_close(got_l, want_l)
    except AssertionError as e:
        out["failures"].append(f"outputs differ from eager: {e}")
    if inprocess is not None:
        out["equal_inprocess"] = all(torch.equal(g, r) for g, r in zip(got_l, inprocess))
        if not out["equal_inprocess"]:
            out["failures"].append("outputs differ from the in-process runtime's")
    sent = {tuple(e) for r in every for e in r["cut_edges_sent"]}
    received = {tuple(e) for r in every for e in r["cut_edges_received"]}
    out["cut_edges_transferred"] = len(sent)
    if len(sent) != cuts or sent != received:
        out["failures"].append(f"{len(sent)} cut edges sent, {len(received)} received; the placement cuts {cuts}")
    ran = sum(r["launches"] for r in every)
    if ran != launches:
        out["failures"].append(f"the ranks ran {ran} launches per call; the program has {launches}")
    out["ok"] = not out["failures"]
    return out


def _report(args: argparse.Namespace, result: dict) -> None:
    """Rank 0's table (or, with ``--json``, every rank's JSON line); ``--json PATH``: the record in a file too."""
    line = jsonout.dumps(result, default=str)
    if args.json == "-":
        print(line, flush=True)
    elif result["rank"] == 0:
        print(format_result(result, args.model, args.size), flush=True)
    if args.json not in (None, "-"):
        path = args.json.replace("{rank}", str(result["rank"]))
        with open(path, "w") as f:
            f.write(line + "\n")
    if result.get("failures"):
        for f in result["failures"]:
            print(f"tessera dist-run: rank {result['rank']}: check failed: {f}", flush=True)
