"""Two processes, one per GPU, run a Llama-3.1-8B-shaped decode plan over NCCL; compare with the in-process runtime.

Run on the two-H200 machine (torch 2.11)::

    torchrun --nproc-per-node 2 bench/gpu_distributed.py --out results/dist

Dry run of everything but the GPUs (gloo, CPU virtual devices, Triton interpreter, a tiny model)::

    torchrun --nproc-per-node 2 bench/gpu_distributed.py --cpu --out /tmp/dist

What it does, per rank (rank r = device r):

1. Builds the model (hidden 4096, GQA 32/8 heads, FFN 14336, ``--layers`` layers, bf16, random weights seeded
   identically on both ranks, built on CPU then moved) and a decode-shaped forward: ``--batch`` sequences of
   ``--seq`` tokens (no KV cache). Lowers it with the tessera backend on its own GPU; rank 0 lowers it for both GPUs
   so that it can also run the in-process :class:`PlacedExecutor` as the reference.
2. Placements ``home`` (all on rank 0) and ``af`` (attention launches on rank 1: two cuts per layer at least), agreed
   between the ranks (:func:`agree_on_plan`). For each: the distributed run (NCCL, ``NCCL_NVLS_ENABLE=0``) and, on rank
   0 while rank 1 waits, the in-process run on ``cuda:0,cuda:1``. Outputs are compared (bitwise and max abs diff) and
   both are compared with eager PyTorch (cosine). Time per forward: median of ``--repeats``.
3. Pipelined micro-batches (``--micro-batches``, default 4, each other token ids): per placement, milliseconds per
   micro-batch with ``slots`` 1 and 2, distributed (:meth:`DistributedExecutor.run_pipelined`) and in-process
   (:meth:`PlacedExecutor.run_pipelined`, rank 0 while rank 1 waits); the distributed outputs must equal the
   in-process ones bitwise, micro-batch by micro-batch.
4. Per-hop cost for message sizes 4 KiB .. 64 MiB: NCCL send/recv between the two processes (ping-pong, half the round
   trip, queued without host syncs and host-synced per hop) beside the in-process peer copy cuda:0 -> cuda:1 (CUDA
   events, and host-synced per copy).

Writes ``distributed.json`` and ``distributed.md`` under ``--out`` (rank 0). Never hangs: every wait on a peer has
``--timeout`` (the runtime raises PeerFailureError naming the rank and edge), and a watchdog ends the process after
``--max-seconds``. On any error the rank writes ``error_rank<r>.txt`` and exits non-zero.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

SIZES = tuple(4096 << (2 * k) for k in range(8))  # 4 KiB .. 64 MiB
CPU_SIZES = tuple(4096 << (2 * k) for k in range(6))  # 4 KiB .. 4 MiB


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--hop-repeats", type=int, default=50)
    ap.add_argument("--micro-batches", type=int, default=4, help="micro-batches of the pipelined rows (0: none)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds any wait on the peer may take")
    ap.add_argument("--max-seconds", type=float, default=1500.0, help="watchdog: exit non-zero after this long")
    ap.add_argument("--cpu", action="store_true", help="dry run: gloo, cpu:0/cpu:1, interpreter, tiny model")
    return ap.parse_args(argv)


def build(args, device):
    """The model on ``device`` (weights from seed 0, identical on every rank) and its token ids."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from torch_tessera.models import CausalLMLogits

    if args.cpu:
        cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=args.layers,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                          rms_norm_eps=1e-5, tie_word_embeddings=False)
        dtype = torch.float32
    else:
        cfg = LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=args.layers,
                          num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096,
                          rms_norm_eps=1e-5, tie_word_embeddings=False)
        dtype = torch.bfloat16
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(dtype)  # on CPU: the same weights on every rank
    model = CausalLMLogits(model).to(device).eval()
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), generator=gen).to(device)
    return model, ids


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, repeats: int) -> float:
    """Median seconds of ``fn()`` (host-synced), after two warm-up calls."""
    for _ in range(2):
        fn()
    sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def wait_works(works, timeout: float, what: str) -> None:
    """Wait for ``works`` (host side), failing after ``timeout`` seconds instead of hanging.

    NCCL work completes on the GPU: poll ``is_completed``. Gloo work makes progress only inside ``wait``: give it the
    timeout.
    """
    import datetime

    deadline = time.monotonic() + timeout
    for w in works:
        if not torch_cuda_work(w):
            try:
                w.wait(timeout=datetime.timedelta(seconds=timeout))
            except RuntimeError as e:
                raise TimeoutError(f"{what}: {e} (the peer rank may have died)") from e
            continue
        while not w.is_completed():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: no completion within {timeout} s (the peer rank may have died)")
            time.sleep(20e-6)
        w.wait()


def torch_cuda_work(work) -> bool:
    return _BACKEND == "nccl"


_BACKEND = "gloo"


def placements(dag, n: int) -> dict:
    attn = {k.index for k in dag.nodes() if k.op_class == "attention"}
    return {"home": {i: 0 for i in range(n)}, "af": {i: int(i in attn) for i in range(n)}}


def run_plans(args, ctx, devices, out: dict) -> None:
    """Distributed vs in-process runs of each placement; fills ``out['plans']``."""
    import torch
    import torch.distributed as dist

    from torch_tessera.backend.recording import RecordingBackend
    from torch_tessera.runtime.distributed import DistributedExecutor, agree_on_plan
    from torch_tessera.runtime.schedule import cut_edge_count

    home = ctx.rank == 0
    model, ids = build(args, ctx.device)
    with torch.no_grad():
        ref = model(ids).float() if home else None
        torch._dynamo.reset()
        backend = RecordingBackend(devices=",".join(devices) if home else devices[ctx.rank], policy="home")
        compiled = torch.compile(model, backend=backend, dynamic=False)
        t0 = time.perf_counter()
        compiled(ids)
        out["compile_s"] = time.perf_counter() - t0
        runner = backend.executors[0]
        n = len(runner.program.launches)
        out["launches"] = n
        rows = []
        for name, pl in placements(runner.dag, n).items():
            pl = agree_on_plan(ctx, runner.program, pl if home else None)
            row = {"placement": name, "cut_edges": cut_edge_count(runner.dag, pl)}
            if home:  # in-process reference on cuda:0,cuda:1 while rank 1 waits
                runner.set_placement(pl)
                inproc = compiled(ids).float().clone()
                row["inprocess_ms"] = timed(lambda: compiled(ids), ctx.device, args.repeats) * 1e3
                row["inprocess_cosine_vs_eager"] = torch.nn.functional.cosine_similarity(
                    inproc.flatten(), ref.flatten(), dim=0).item()
            dist.barrier(group=ctx.control)
            ex = DistributedExecutor(runner.program, runner.dag, pl, ctx, runner.kernel_objects)
            inproc_ex, runner.executor = runner.executor, ex
            seen: list = []  # the program's inputs, in its order: the template of the micro-batches
            ex.run = lambda a: (seen.append(list(a)), DistributedExecutor.run(ex, a))[1]
            got = compiled(ids)
            del ex.run
            sync(ctx.device)
            row["dist_ms"] = timed(lambda: compiled(ids), ctx.device, args.repeats) * 1e3
            row["messages_per_call"] = ex.stats.messages // max(1, ex.calls)
            row["cut_bytes_per_call"] = (sum(ex.stats.bytes_sent.values()) + sum(ex.stats.bytes_received.values())) \
                // max(1, ex.calls)
            if home:
                got = got.float()
                row["bitwise_equal_inprocess"] = bool(torch.equal(got, inproc))
                row["max_abs_diff_inprocess"] = float((got - inproc).abs().max())
                row["max_abs_output"] = float(inproc.abs().max())
                row["dist_cosine_vs_eager"] = torch.nn.functional.cosine_similarity(
                    got.flatten(), ref.flatten(), dim=0).item()
                row["argmax_agreement_inprocess"] = float((got.argmax(-1) == inproc.argmax(-1)).float().mean())
            dist.barrier(group=ctx.control)
            if args.micro_batches:
                row.update(pipelined(args, ctx, ex, inproc_ex if home else None, seen[0], ids))
            rows.append(row)
        base = {r["placement"]: r for r in rows}.get("home")
        for r in rows:
            if home and base and r["cut_edges"]:
                r["dist_us_per_cut_edge"] = (r["dist_ms"] - base["dist_ms"]) * 1e3 / r["cut_edges"]
                r["inprocess_us_per_cut_edge"] = (r["inprocess_ms"] - base["inprocess_ms"]) * 1e3 / r["cut_edges"]
        out["plans"] = rows


def pipelined(args, ctx, ex, inproc_ex, template: list, ids) -> dict:
    """Milliseconds per micro-batch of ``--micro-batches`` micro-batches, slots 1 and 2, distributed and (rank 0)
    in-process; whether the distributed outputs equal the in-process ones bitwise."""
    import torch
    import torch.distributed as dist

    hits = [i for i, a in enumerate(template) if a is ids]
    if not hits:
        raise RuntimeError("the token ids are not among the program's inputs: cannot build micro-batches")
    gen = torch.Generator().manual_seed(2)
    batches = []
    for _ in range(args.micro_batches):
        other = torch.randint(0, int(ids.max()) + 1, tuple(ids.shape), generator=gen).to(ids.device, ids.dtype)
        batches.append([other if i in hits else a for i, a in enumerate(template)])
    row: dict = {"micro_batches": args.micro_batches}
    for slots in (1, 2):
        got = ex.run_pipelined(batches, slots)
        sync(ctx.device)
        row[f"dist_pipelined_s{slots}_ms"] = timed(lambda: ex.run_pipelined(batches, slots), ctx.device,
                                                   args.repeats) * 1e3 / args.micro_batches
        dist.barrier(group=ctx.control)
        if inproc_ex is not None:  # rank 0, while rank 1 waits
            ref = inproc_ex.run_pipelined(batches, slots)
            sync(ctx.device)
            row[f"inprocess_pipelined_s{slots}_ms"] = timed(lambda: inproc_ex.run_pipelined(batches, slots),
                                                            ctx.device, args.repeats) * 1e3 / args.micro_batches
            row[f"pipelined_s{slots}_bitwise_equal_inprocess"] = all(
                torch.equal(a, b) for g, r in zip(got, ref) for a, b in zip(g, r) if isinstance(a, torch.Tensor))
        dist.barrier(group=ctx.control)
    return row


def hop_costs(args, ctx, out: dict) -> None:
    """NCCL (gloo with --cpu) send/recv between the ranks beside the in-process copy, per message size."""
    import torch
    import torch.distributed as dist

    rows = []
    peer = 1 - ctx.rank
    for size in (CPU_SIZES if args.cpu else SIZES):
        buf = torch.empty(size, dtype=torch.uint8, device=ctx.device)
        reps = args.hop_repeats if size <= (4 << 20) else max(5, args.hop_repeats // 5)

        def pingpong(k: int, synced: bool) -> float:
            t0 = time.perf_counter()
            for _ in range(k):
                first, second = (dist.isend, dist.irecv) if ctx.rank == 0 else (dist.irecv, dist.isend)
                w1 = first(buf, peer)
                if synced or ctx.device.type == "cpu":
                    wait_works([w1], args.timeout, f"hop of {size} bytes")
                else:
                    w1.wait()  # stream order only
                w2 = second(buf, peer)
                if synced or ctx.device.type == "cpu":
                    wait_works([w2], args.timeout, f"hop of {size} bytes")
                else:
                    w2.wait()
            if ctx.device.type == "cuda" and not synced:  # poll first: a synchronize would hang on a dead peer
                wait_works([w2], args.timeout, f"hop of {size} bytes")
            sync(ctx.device)
            return (time.perf_counter() - t0) / (2 * k)

        pingpong(3, True)  # warm-up (and the first call creates the pair's communicator)
        row = {"bytes": size, "dist_queued_us": pingpong(reps, False) * 1e6, "dist_synced_us": pingpong(reps, True) * 1e6}
        dist.barrier(group=ctx.control)
        if ctx.rank == 0:
            row.update(inprocess_copy(args, size, reps))
        dist.barrier(group=ctx.control)
        rows.append(row)
    for r in rows:
        r["dist_GBps"] = r["bytes"] / r["dist_queued_us"] / 1e3
        if "inprocess_event_us" in r:
            r["inprocess_GBps"] = r["bytes"] / r["inprocess_event_us"] / 1e3
    out["hops"] = rows


def inprocess_copy(args, size: int, reps: int) -> dict:
    """The in-process runtime's hop: a copy from device 0 to device 1 (peer copy on GPUs, memcpy on CPU)."""
    import torch

    if args.cpu:
        src, dst = torch.empty(size, dtype=torch.uint8), torch.empty(size, dtype=torch.uint8)
        dst.copy_(src)
        t0 = time.perf_counter()
        for _ in range(reps):
            dst.copy_(src)
        s = (time.perf_counter() - t0) / reps
        return {"inprocess_event_us": s * 1e6, "inprocess_synced_us": s * 1e6}
    src = torch.empty(size, dtype=torch.uint8, device="cuda:0")
    dst = torch.empty(size, dtype=torch.uint8, device="cuda:1")
    stream = torch.cuda.current_stream(torch.device("cuda:0"))
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize("cuda:0")
    events = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(stream)
        dst.copy_(src, non_blocking=True)
        b.record(stream)
        events.append((a, b))
    torch.cuda.synchronize("cuda:0")
    ev = statistics.median(a.elapsed_time(b) for a, b in events) * 1e3
    synced = []
    for _ in range(reps):
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize("cuda:0")
        synced.append(time.perf_counter() - t0)
    return {"inprocess_event_us": ev, "inprocess_synced_us": statistics.median(synced) * 1e6}


def write(args, out: dict) -> None:
    path = Path(args.out)
    path.mkdir(parents=True, exist_ok=True)
    (path / "distributed.json").write_text(json.dumps(out, indent=1))
    lines = [f"# Process-per-device runtime vs in-process ({out['backend']}, torch {out['torch']})", "",
             f"model: Llama-3.1-8B-shaped{' (tiny dims: --cpu dry run)' if args.cpu else ''}, {args.layers} layers, "
             f"batch {args.batch} x seq {args.seq}; "
             f"{out.get('launches')} launches; compile {out.get('compile_s', float('nan')):.1f} s", "",
             "| placement | cut edges | in-process ms | distributed ms | us/cut in-process | us/cut distributed | "
             "bitwise equal | max abs diff | cosine vs eager (dist) |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in out.get("plans", []):
        lines.append(f"| {r['placement']} | {r['cut_edges']} | {r['inprocess_ms']:.3f} | {r['dist_ms']:.3f} | "
                     f"{r.get('inprocess_us_per_cut_edge', float('nan')):.1f} | "
                     f"{r.get('dist_us_per_cut_edge', float('nan')):.1f} | {r['bitwise_equal_inprocess']} | "
                     f"{r['max_abs_diff_inprocess']:.3g} | {r['dist_cosine_vs_eager']:.6f} |")
    piped = [r for r in out.get("plans", []) if "dist_pipelined_s1_ms" in r]
    if piped:
        lines += ["", f"Pipelined: {args.micro_batches} micro-batches (other token ids each), ms per micro-batch:", "",
                  "| placement | in-process slots 1 | in-process slots 2 | distributed slots 1 | distributed slots 2 | "
                  "bitwise equal in-process (1, 2) |", "| --- | --- | --- | --- | --- | --- |"]
        for r in piped:
            lines.append(f"| {r['placement']} | {r['inprocess_pipelined_s1_ms']:.3f} | "
                         f"{r['inprocess_pipelined_s2_ms']:.3f} | {r['dist_pipelined_s1_ms']:.3f} | "
                         f"{r['dist_pipelined_s2_ms']:.3f} | {r['pipelined_s1_bitwise_equal_inprocess']}, "
                         f"{r['pipelined_s2_bitwise_equal_inprocess']} |")
    lines += ["", "Per hop (one message, rank 0 -> rank 1); distributed = half a ping-pong round trip:", "",
              "| bytes | dist queued us | dist host-synced us | dist GB/s | in-process event us | "
              "in-process host-synced us | in-process GB/s |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in out.get("hops", []):
        lines.append(f"| {r['bytes']} | {r['dist_queued_us']:.1f} | {r['dist_synced_us']:.1f} | {r['dist_GBps']:.2f} | "
                     f"{r['inprocess_event_us']:.1f} | {r['inprocess_synced_us']:.1f} | {r['inprocess_GBps']:.2f} |")
    (path / "distributed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    watchdog = threading.Timer(args.max_seconds, lambda: (print(f"rank {rank}: watchdog: still running after "
                                                                f"{args.max_seconds} s, exiting", flush=True),
                                                          os._exit(3)))
    watchdog.daemon = True
    watchdog.start()
    import torch

    from torch_tessera.runtime.distributed import init_distributed, shutdown

    ctx = None
    try:
        devices = ["cpu:0", "cpu:1"] if args.cpu else ["cuda:0", "cuda:1"]
        if int(os.environ.get("WORLD_SIZE", "0")) != 2:
            raise SystemExit("run with torchrun --nproc-per-node 2")
        ctx = init_distributed("cpu" if args.cpu else f"cuda:{rank}", args.timeout)
        global _BACKEND
        _BACKEND = ctx.backend
        out = {"args": vars(args), "torch": torch.__version__, "backend": ctx.backend, "hosts": ctx.hosts,
               "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE")}
        run_plans(args, ctx, devices, out)
        hop_costs(args, ctx, out)
        if rank == 0:
            write(args, out)
            bad = [r["placement"] for r in out["plans"] if r["max_abs_diff_inprocess"] > 1e-2 * r["max_abs_output"] + 1e-2
                   or r["dist_cosine_vs_eager"] < 0.99
                   or not all(r.get(f"pipelined_s{k}_bitwise_equal_inprocess", True) for k in (1, 2))]
            if bad:
                print(f"rank 0: distributed outputs differ from the in-process runtime's for {bad}", flush=True)
                shutdown(ctx, failed=True)
    except Exception:  # noqa: BLE001 - any failure: record it and exit non-zero, never hang
        text = traceback.format_exc()
        print(f"rank {rank}: {text}", file=sys.stderr, flush=True)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / f"error_rank{rank}.txt").write_text(text)
        shutdown(ctx, failed=True)
        return 2  # only when no process group was joined (shutdown exits otherwise)
    shutdown(ctx)
    return 0


if __name__ == "__main__":
    sys.exit(main())
