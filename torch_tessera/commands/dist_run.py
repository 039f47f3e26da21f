"""``tessera dist-run``: run a registry model's plan with one process per device, and check it.

Launch with torchrun, one rank per device (rank r runs device r of ``--devices``)::

    torchrun --nproc-per-node 2 -m torch_tessera.cli dist-run --model llama --size tiny --devices cpu:0,cpu:1
    torchrun --nproc-per-node 2 -m torch_tessera.cli dist-run --model llama --devices cuda:0,cuda:1 --policy af

Every rank builds the model with the same seed and lowers it on its own device; rank 0 chooses the placement and
broadcasts it; every rank checks it holds the same program (:func:`agree_on_plan`). Rank 0 then compares the
distributed outputs with eager PyTorch and with the in-process runtime on the same devices, and checks that the ranks
together transferred exactly the placement's cut edges. Each rank prints one ``DIST-RUN {json}`` line.

``--inject-failure RANK:exit`` (or ``:hang``) makes that rank exit (or stop answering) just before its first send: the
other ranks must then fail with :class:`~torch_tessera.errors.PeerFailureError` within ``--timeout``. It exists to
test the failure path.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from torch_tessera.errors import ConfigError, TesseraError

HELP = "run a model's plan with one process per device (launch with torchrun) and check it against eager"

#: Policies: ours (``home``, ``random``, ``attention``: attention launches on device 1) and the scheduler's.
POLICIES = ("random", "attention", "home", "throughput", "latency", "af", "layer", "homo-L", "homo-R")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``tessera dist-run``."""
    parser.add_argument("--model", default="llama", help="registry model name (default llama)")
    parser.add_argument("--size", default="tiny", choices=["tiny", "full"], help="model size (default tiny)")
    parser.add_argument("--batch", type=int, default=None, help="batch size (default: the model's)")
    parser.add_argument("--seq", type=int, default=None, help="tokens per sequence (default: the model's)")
    parser.add_argument("--devices", default=None,
                        help="one device per rank, comma-separated (default cuda:0..N-1 with CUDA, else cpu:0..N-1)")
    parser.add_argument("--policy", default="random", choices=POLICIES, help="placement policy (default random)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random placement")
    parser.add_argument("--network", default="rdma400", help="link model for devices on different hosts")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds any wait on a peer may take")
    parser.add_argument("--calls", type=int, default=2, help="distributed calls to run (default 2)")
    parser.add_argument("--weights", default="local", choices=["local", "send"],
                        help="local: every rank uses its own copy of the weights; send: rank 0 sends them")
    parser.add_argument("--no-inprocess", action="store_true", help="skip the comparison with the in-process runtime")
    parser.add_argument("--json", default=None, help="write this rank's result here ({rank} is replaced)")
    parser.add_argument("--inject-failure", default=None, metavar="RANK:MODE",
                        help="testing: RANK exits (MODE exit) or stops answering (MODE hang) before its first send")


def _fault_hook(spec: str | None, rank: int) -> Any:
    if not spec:
        return None
    who, _, mode = spec.partition(":")
    if mode not in ("exit", "hang"):
        raise ConfigError(f"--inject-failure {spec!r}: MODE must be exit or hang")
    if int(who) != rank:
        return None
    from torch_tessera.runtime.schedule import CopyStep

    def hook(call: int, step: Any) -> None:
        if isinstance(step, CopyStep) and step.src == rank:
            print(f"DIST-RUN-FAULT {time.time():.3f} rank {rank} {mode} before sending {step.buffer} (edge {step.edge})",
                  flush=True)
            if mode == "exit":
                os._exit(17)
            time.sleep(3600)

    return hook


def _placement(args: argparse.Namespace, runner: Any, specs: list, hosts: tuple[str, ...]) -> dict[int, int]:
    from torch_tessera.backend.pipeline import estimate, place

    program, dag = runner.program, runner.dag
    if args.policy == "attention":
        attn = {v for v, d in dag.graph.nodes(data=True) if d.get("op_class") == "attention"}
        return {launch.index: int(launch.index in attn) for launch in program.launches}
    if args.policy in ("home", "random"):
        placement, _ = place(program, dag, specs, args.policy, seed=args.seed)
        return dict(placement)
    costs, topology = estimate(program, specs, hosts=hosts)
    placement, _ = place(program, dag, specs, args.policy, costs=costs, topology=topology)
    return dict(placement)


def run(args: argparse.Namespace) -> int:
    """Run one rank of ``tessera dist-run``; returns 0 on success, 1 when a check fails."""
    from torch_tessera.runtime.distributed import init_distributed, shutdown

    rank, world = int(os.environ.get("RANK", "-1")), int(os.environ.get("WORLD_SIZE", "0"))
    if rank < 0:
        raise ConfigError("tessera dist-run runs under torchrun: torchrun --nproc-per-node N -m torch_tessera.cli "
                          "dist-run ...")
    import torch

    devices = args.devices.split(",") if args.devices else [
        f"cuda:{i}" if torch.cuda.is_available() else f"cpu:{i}" for i in range(world)]
    if len(devices) != world:
        raise ConfigError(f"--devices names {len(devices)} devices for {world} ranks; give one per rank")
    ctx = None
    try:
        from torch_tessera.runtime.devices import parse_device

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
    from torch_tessera.runtime.devices import parse_device
    from torch_tessera.runtime.distributed import DistributedExecutor, agree_on_plan
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
        placement = _placement(args, runner, [parse_device(d) for d in devices], ctx.hosts) if home else None
        placement = agree_on_plan(ctx, runner.program, placement)
        inprocess = None
        if home and not args.no_inprocess:
            runner.set_placement(placement)
            inprocess = [t.clone() for t in _as_list(compiled(*inputs))]
        import torch.distributed as dist

        dist.barrier(group=ctx.control)  # start together: a peer's wait should not count rank 0's reference run
        executor = DistributedExecutor(runner.program, runner.dag, placement, ctx, runner.kernel_objects,
                                       weights=args.weights, step_hook=_fault_hook(args.inject_failure, ctx.rank))
        runner.executor = executor  # the compiled model now runs this rank's part of the plan
        seconds, got = [], None
        for _ in range(args.calls):
            t0 = time.perf_counter()
            got = compiled(*inputs)
            if ctx.device.type == "cuda":
                torch.cuda.synchronize(ctx.device)
            seconds.append(time.perf_counter() - t0)
    stats = executor.stats
    mine = {"rank": ctx.rank, "device": str(ctx.device), "host": ctx.hosts[ctx.rank],
            "launches": executor.launches_executed // max(1, executor.calls),
            "cut_edges_sent": sorted(stats.cut_edges_sent), "cut_edges_received": sorted(stats.cut_edges_received),
            "ranges": dict(stats.ranges), "messages": stats.messages, "bytes_sent": dict(stats.bytes_sent), "batches": stats.batches}
    every: list = [None] * ctx.world_size
    dist.all_gather_object(every, mine, group=ctx.control)
    result = {**mine, "compile_s": compile_s, "seconds_per_call": seconds, "policy": args.policy,
              "world_size": ctx.world_size, "total_launches": len(runner.program.launches)}
    if home:
        result.update(_checks(got, want, inprocess, every, cut_edge_count(runner.dag, placement),
                              len(runner.program.launches)))
    return result


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
    line = json.dumps(result, default=str)
    print(f"DIST-RUN {line}", flush=True)
    if args.json:
        path = args.json.replace("{rank}", str(result["rank"]))
        with open(path, "w") as f:
            f.write(line + "\n")
    if result.get("failures"):
        for f in result["failures"]:
            print(f"tessera dist-run: rank {result['rank']}: check failed: {f}", flush=True)
