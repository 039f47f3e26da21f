"""Cost of one cross-GPU hop inside ONE CUDA graph, for each way of moving the bytes (issue 5: target <= 10 us).

A chain of ``--hops`` hops ping-pongs a float32 buffer between two devices (default ``cuda:0,cuda:1``): each hop
runs a small producer kernel (+1 in place) on the current device, then moves the buffer to the other device, which
produces the next hop. The whole chain is captured ONCE (on device 0's stream, the other streams joined to the capture
by events, as the runtime's ``cuda_graphs="whole"`` does) and replayed; every variant is checked (after one replay from
zeros the final buffer must equal ``hops``) and timed as wall time per replay (replay, then synchronise both devices;
median of ``--repeats``). Per hop = (variant - ``one_gpu``) / hops. Variants:

* ``copy_stream`` (1, the runtime's way today, ``graph_copies="link"``): the copy is a memcpy node
  (``cuMemcpyAsync``) on a copy stream of the destination device, after an event from the producer's stream; the
  consumer's stream waits on the copy stream.
* ``producer_stream`` (2, ``graph_copies="producer"``): the memcpy node on the producer's own stream, no copy stream;
  the consumer's stream waits on the producer's.
* ``push_kernel`` (3): the producer's device runs a Triton copy kernel that writes the peer's buffer directly (needs
  peer access), then the consumer waits on the producer's stream.
* ``pull_kernel`` (4): the consumer waits on the producer's stream, then its device runs a Triton copy kernel that
  reads the peer's buffer (needs peer access).
* ``fused_pull``: no transfer node at all: the consumer's +1 kernel reads the producer's buffer over the link and
  writes its own (what a runtime gets if kernels read peer memory directly; needs peer access).
* ``one_gpu`` (5, the baseline subtracted): the same number of +1 kernels, all on device 0's stream, no transfers.
* ``one_gpu_memcpy`` / ``one_gpu_copy_kernel``: variants 2 and 3 with both buffers on device 0 and one stream: what
  the extra node costs without crossing devices (``vs same-GPU equivalent`` subtracts these from 1-2 and 3-4).

Sizes (``--sizes``, bytes per hop): 8 KiB, 256 KiB, 4 MiB. Each variant is guarded: one failure is recorded in the
JSON and the rest still run. Writes ``hop_variants.json`` (after every size) and ``hop_variants.md`` under ``--out``.
``--devices cuda:0,cuda:0`` runs every variant between two streams of one GPU (no peer access needed). Self-contained:
needs torch; Triton for the kernel variants; cuda-python (``cuda.bindings``) for raw memcpy nodes (else torch's
``copy_``, which adds a two-way barrier between the devices' streams; the JSON says which ran).

Run: ``python3 bench/gpu_hop_variants.py --out $OUT/hops`` (about 20-40 s on two H200s).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

BLOCK = 1024
VARIANTS = ("one_gpu", "one_gpu_memcpy", "one_gpu_copy_kernel", "copy_stream", "producer_stream", "push_kernel",
            "pull_kernel", "fused_pull")
#: variant -> the same-GPU variant with the same extra node per hop
SAME_GPU_EQUIVALENT = {"copy_stream": "one_gpu_memcpy", "producer_stream": "one_gpu_memcpy",
                       "push_kernel": "one_gpu_copy_kernel", "pull_kernel": "one_gpu_copy_kernel",
                       "fused_pull": "one_gpu"}
#: variants whose kernels touch the other device's memory (in both directions: the chain ping-pongs)
NEEDS_PEER = ("push_kernel", "pull_kernel", "fused_pull")

try:  # Triton kernels for the push / pull variants (defined at import: @triton.jit reads this file's source)
    import triton
    import triton.language as tl

    @triton.jit
    def _copy_kernel(src, dst, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)

    @triton.jit
    def _add_one_kernel(src, dst, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(dst + offs, tl.load(src + offs, mask=mask) + 1.0, mask=mask)

    TRITON_ERROR = None
except Exception as e:  # noqa: BLE001 - the other variants still run
    triton = None
    TRITON_ERROR = f"{type(e).__name__}: {e}"


def _grid(n: int) -> tuple[int]:
    return ((n + BLOCK - 1) // BLOCK,)


class Chain:
    """Two sides (device, stream, buffer) a chain ping-pongs between, and how a memcpy is issued."""

    local = False  # LocalChain: both sides on one stream of one device

    def __init__(self, devs: list[torch.device], nbytes: int, memcpy_api: str) -> None:
        self.devs = devs
        self.bufs = [torch.zeros(nbytes // 4, dtype=torch.float32, device=d) for d in devs]
        first = torch.cuda.Stream(device=devs[0])
        self.streams = [first, first if self.local else torch.cuda.Stream(device=devs[1])]
        # a copy stream per direction, on the destination device (as the runtime's link copy streams)
        self.links = {} if self.local else {(0, 1): torch.cuda.Stream(device=devs[1]),
                                            (1, 0): torch.cuda.Stream(device=devs[0])}
        self.memcpy_api = memcpy_api

    def all_streams(self) -> list:
        return list({id(s): s for s in [*self.streams, *self.links.values()]}.values())

    def sync(self) -> None:
        for d in {str(d): d for d in self.devs}.values():
            torch.cuda.synchronize(d)

    def reset(self) -> None:
        for b in self.bufs:
            b.zero_()
        self.sync()

    def memcpy(self, src: int, dst: int, stream) -> None:
        """Copy side ``src``'s buffer into side ``dst``'s as one memcpy on ``stream``."""
        a, b = self.bufs[src], self.bufs[dst]
        if self.memcpy_api == "cuMemcpyAsync":
            from cuda.bindings import driver as drv

            (err,) = drv.cuMemcpyAsync(b.data_ptr(), a.data_ptr(), a.numel() * a.element_size(), stream.cuda_stream)
            if err != drv.CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"cuMemcpyAsync failed: {err}")
        elif a.device == b.device:
            with torch.cuda.device(a.device), torch.cuda.stream(stream):
                b.copy_(a, non_blocking=True)
        else:  # torch copies between GPUs on the source's current stream, with a barrier on the destination's
            with torch.cuda.stream(self.streams[src]), torch.cuda.stream(self.streams[dst]):
                b.copy_(a, non_blocking=True)

    def add_one(self, side: int) -> None:
        with torch.cuda.device(self.devs[side]), torch.cuda.stream(self.streams[side]):
            self.bufs[side].add_(1)

    def kernel(self, fn, src: int, dst: int, on: int) -> None:
        """Triton ``fn(bufs[src] -> bufs[dst])`` launched on side ``on``'s device and stream."""
        n = self.bufs[0].numel()
        with torch.cuda.device(self.devs[on]), torch.cuda.stream(self.streams[on]):
            fn[_grid(n)](self.bufs[src], self.bufs[dst], n, BLOCK=BLOCK)


class LocalChain(Chain):
    local = True

    def __init__(self, dev: torch.device, nbytes: int, memcpy_api: str) -> None:
        super().__init__([dev, dev], nbytes, memcpy_api)


def join(waiter, stream) -> None:
    if waiter is not stream:
        waiter.wait_stream(stream)


def hop(variant: str, c: Chain, cur: int, nxt: int) -> None:
    """One hop of ``variant`` from side ``cur`` to side ``nxt``."""
    s_cur, s_nxt = c.streams[cur], c.streams[nxt]
    if variant == "one_gpu":
        c.add_one(0)
        return
    if variant == "fused_pull":
        join(s_nxt, s_cur)
        c.kernel(_add_one_kernel, cur, nxt, on=nxt)
        return
    c.add_one(cur)
    if variant == "copy_stream":
        link = c.links[(cur, nxt)]
        join(link, s_cur)
        c.memcpy(cur, nxt, link)
        join(s_nxt, link)
    elif variant in ("producer_stream", "one_gpu_memcpy"):
        c.memcpy(cur, nxt, s_cur)
        join(s_nxt, s_cur)
    elif variant in ("push_kernel", "one_gpu_copy_kernel"):
        c.kernel(_copy_kernel, cur, nxt, on=cur)
        join(s_nxt, s_cur)
    elif variant == "pull_kernel":
        join(s_nxt, s_cur)
        c.kernel(_copy_kernel, cur, nxt, on=nxt)
    else:
        raise ValueError(variant)


def chain(variant: str, c: Chain, hops: int) -> None:
    cur = 0
    for _ in range(hops):
        nxt = 0 if variant == "one_gpu" else 1 - cur
        hop(variant, c, cur, nxt)
        cur = nxt
    join(c.streams[0], c.streams[cur])


def expected_buffer(variant: str, c: Chain, hops: int) -> torch.Tensor:
    return c.bufs[0] if variant == "one_gpu" else c.bufs[hops % 2]


def capture(variant: str, c: Chain, hops: int) -> torch.cuda.CUDAGraph:
    """The chain as one graph: captured on side 0's stream, every other stream forked from it and joined back."""
    g = torch.cuda.CUDAGraph()
    c.sync()
    main = c.streams[0]
    with torch.cuda.device(c.devs[0]), torch.cuda.graph(g, stream=main):
        others = [s for s in c.all_streams() if s is not main]
        for s in others:
            s.wait_stream(main)
        chain(variant, c, hops)
        for s in others:
            main.wait_stream(s)
    return g


def timed(replay, c: Chain, repeats: int) -> tuple[float, float]:
    """Median wall seconds per replay (replay, then synchronise both devices) and median GPU seconds between CUDA
    events recorded around the replay on device 0's current stream (where ``CUDAGraph.replay`` launches)."""
    for _ in range(3):
        replay()
    c.sync()
    walls, gpu = [], []
    stream = torch.cuda.current_stream(c.devs[0])
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record(stream)
        replay()
        end.record(stream)
        c.sync()
        walls.append(time.perf_counter() - t0)
        gpu.append(start.elapsed_time(end) * 1e-3)
    return statistics.median(walls), statistics.median(gpu)


def run_variant(variant: str, devs: list[torch.device], nbytes: int, hops: int, repeats: int, memcpy_api: str,
                peer: dict) -> dict:
    row: dict = {"variant": variant, "bytes": nbytes, "hops": hops}
    if variant in ("push_kernel", "pull_kernel", "fused_pull", "one_gpu_copy_kernel") and triton is None:
        row["skipped"] = f"no triton ({TRITON_ERROR})"
        return row
    if variant in NEEDS_PEER and not (peer.get("forward") and peer.get("backward")):
        row["skipped"] = f"no peer access ({peer})"
        return row
    local = variant.startswith("one_gpu")
    c = LocalChain(devs[0], nbytes, memcpy_api) if local else Chain(devs, nbytes, memcpy_api)
    try:
        c.reset()
        chain(variant, c, hops)  # eager once: compiles and loads the Triton kernels on each device before capture
        c.sync()
        row["eager_correct"] = bool((expected_buffer(variant, c, hops) == hops).all().item())
        g = capture(variant, c, hops)
        c.reset()
        g.replay()
        c.sync()
        row["graph_correct"] = bool((expected_buffer(variant, c, hops) == hops).all().item())
        row["graph_s"], row["graph_gpu_s"] = timed(g.replay, c, repeats)
    except Exception:  # noqa: BLE001 - record and go on with the other variants
        row["error"] = traceback.format_exc()
        print(f"{variant} {nbytes} B failed:\n{row['error']}", file=sys.stderr, flush=True)
    return row


def enable_peer_access(devs: list[torch.device]) -> dict:
    """Whether each direction can and does have peer access: torch enables it on its first copy between the two
    GPUs (``at::cuda::get_p2p_access``); cuda-python's ``cudaDeviceEnablePeerAccess`` is tried as well."""
    info: dict = {}
    if devs[0] == devs[1]:
        return {"forward": True, "backward": True, "note": "one device: no peer access needed"}
    a, b = devs[0].index, devs[1].index
    info["can_access_forward"] = torch.cuda.can_device_access_peer(a, b)
    info["can_access_backward"] = torch.cuda.can_device_access_peer(b, a)
    x = [torch.ones(256, device=d) for d in devs]
    x[1].copy_(x[0])
    x[0].copy_(x[1])
    torch.cuda.synchronize(devs[0])
    torch.cuda.synchronize(devs[1])
    try:
        from cuda.bindings import runtime as cudart

        ok = (cudart.cudaError_t.cudaSuccess, cudart.cudaError_t.cudaErrorPeerAccessAlreadyEnabled)
        current = torch.cuda.current_device()
        for name, (dev, peer) in {"forward": (a, b), "backward": (b, a)}.items():
            cudart.cudaSetDevice(dev)
            (err,) = cudart.cudaDeviceEnablePeerAccess(peer, 0)
            info[f"enable_{name}"] = str(err)
            info[name] = bool(info[f"can_access_{name}"] and err in ok)
        cudart.cudaSetDevice(current)
        torch.cuda.set_device(current)
    except Exception as e:  # noqa: BLE001 - no cuda-python: rely on torch having enabled it
        info["cuda_python"] = f"{type(e).__name__}: {e}"
        info["forward"], info["backward"] = info["can_access_forward"], info["can_access_backward"]
    return info


def per_hop(rows: list[dict]) -> None:
    """Fill, per timing (``wall``: ``graph_s``; ``gpu``: ``graph_gpu_s``), ``us_per_hop_<timing>`` (vs ``one_gpu``)
    and ``us_vs_same_gpu_<timing>`` (vs the same-GPU equivalent) of each row."""
    by = {(r["bytes"], r["variant"]): r for r in rows}
    for r in rows:
        for timing, key in (("wall", "graph_s"), ("gpu", "graph_gpu_s")):
            if key not in r:
                continue
            base = by.get((r["bytes"], "one_gpu"), {})
            if key in base:
                r[f"us_per_hop_{timing}"] = (r[key] - base[key]) * 1e6 / r["hops"]
            eq = by.get((r["bytes"], SAME_GPU_EQUIVALENT.get(r["variant"], "")), {})
            if key in eq:
                r[f"us_vs_same_gpu_{timing}"] = (r[key] - eq[key]) * 1e6 / r["hops"]


def table(res: dict) -> str:
    """Markdown: one table per timing, a row per variant, a column per size."""
    rows, sizes = res["rows"], sorted({r["bytes"] for r in res["rows"]})
    by = {(r["bytes"], r["variant"]): r for r in rows}

    def cell(r: dict | None, timing: str) -> str:
        if r is None:
            return "-"
        if "skipped" in r:
            return f"skipped ({r['skipped'].split(' (')[0]})"
        if "error" in r:
            return "FAILED (" + r["error"].strip().splitlines()[-1][:60] + ")"
        key = "graph_s" if timing == "wall" else "graph_gpu_s"
        if r["variant"] == "one_gpu":
            s = f"{r[key] * 1e6 / r['hops']:.2f} per kernel (baseline)"
        else:
            s = f"**{r[f'us_per_hop_{timing}']:.1f}**" if f"us_per_hop_{timing}" in r else "no baseline"
            if f"us_vs_same_gpu_{timing}" in r and r["variant"] != "fused_pull":
                s += f" ({r[f'us_vs_same_gpu_{timing}']:.1f})"
        return s + ("" if r.get("graph_correct") and r.get("eager_correct") else " WRONG VALUE")

    lines = [f"devices {res['devices']} ({', '.join(res['names'])}), {res['hops']} hops, torch {res['torch']}, "
             f"triton {res['triton']}, memcpy via {res['memcpy_api']}; peer access: {res['peer']}; "
             f"{res.get('seconds', 0):.0f} s", ""]
    for timing, what in (("wall", "wall time per replay (replay + synchronise)"),
                         ("gpu", "GPU time per replay (CUDA events around it on device 0's stream)")):
        lines += [f"us per hop inside one graph from {what}, minus `one_gpu`; in brackets: minus the same-GPU "
                  "equivalent (the same extra node per hop on one GPU and one stream)", "",
                  "| variant | " + " | ".join(f"{s // 1024} KiB" for s in sizes) + " |",
                  "| --- | " + " | ".join("---" for _ in sizes) + " |"]
        for v in VARIANTS:
            if any((s, v) in by for s in sizes):
                lines.append(f"| {v} | " + " | ".join(cell(by.get((s, v)), timing) for s in sizes) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--devices", default="cuda:0,cuda:1", help="two devices; cuda:0,cuda:0 = two streams of one GPU")
    ap.add_argument("--hops", type=int, default=64)
    ap.add_argument("--sizes", default="8192,262144,4194304", help="bytes per hop (multiples of 4)")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args(argv)
    devs = [torch.device(d.strip()) for d in args.devices.split(",")]
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    sizes = [int(s) for s in args.sizes.split(",")]
    bad = [v for v in variants if v not in VARIANTS]
    if len(devs) != 2 or any(d.type != "cuda" or d.index is None for d in devs) or bad or \
            any(s <= 0 or s % 4 for s in sizes) or args.hops < 2 or args.hops % 2:
        ap.error(f"need two cuda:N devices, variants from {VARIANTS}, sizes that are positive multiples of 4 and an "
                 f"even --hops >= 2 (got devices {args.devices}, unknown variants {bad}, sizes {sizes})")
    if "one_gpu" not in variants:
        variants.insert(0, "one_gpu")  # the baseline every per-hop figure subtracts
    if not torch.cuda.is_available() or torch.cuda.device_count() <= max(d.index for d in devs):
        print(f"needs CUDA devices {args.devices} (this machine has {torch.cuda.device_count()})", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        from cuda.bindings import driver  # noqa: F401

        memcpy_api = "cuMemcpyAsync"
    except ImportError:
        memcpy_api = "torch copy_"
    t0 = time.perf_counter()
    res = {"devices": args.devices, "hops": args.hops, "torch": torch.__version__,
           "triton": getattr(triton, "__version__", None), "triton_error": TRITON_ERROR, "memcpy_api": memcpy_api,
           "names": [torch.cuda.get_device_name(d) for d in devs], "peer": enable_peer_access(devs), "rows": []}
    for nbytes in sizes:
        for v in variants:
            row = run_variant(v, devs, nbytes, args.hops, args.repeats, memcpy_api, res["peer"])
            res["rows"].append(row)
            per_hop(res["rows"])
            print({k: (round(x, 9) if isinstance(x, float) else x) for k, x in row.items() if k != "error"},
                  flush=True)
        res["seconds"] = time.perf_counter() - t0
        (out / "hop_variants.json").write_text(json.dumps(res, indent=1))
    md = table(res)
    (out / "hop_variants.md").write_text(md)
    print(md)
    return 0 if not any("error" in r or r.get("graph_correct") is False for r in res["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
