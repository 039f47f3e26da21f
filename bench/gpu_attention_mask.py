"""What an explicit mask costs a fused attention: cuDNN's attention timed with and without an additive mask, on the
whole GPU and on green-context partitions (issue 21, the kernel cost model's ``mask_ops``).

The registry's LLMs (llama, moe, qwen2-vl) call ``aten::_scaled_dot_product_cudnn_attention`` with an additive bf16
mask broadcast over batch and heads (a static KV cache is longer than the prompt, so the mask hides its empty tail);
the diffusion model calls it without one. The cost model charges a fused attention's softmax per score; this script
measures what a mask adds per score, and what a length that is not a multiple of the 128-row tile adds, on shapes that are none of the registry models' own (so held-out figures stay
held out): for each ``(B, H, L, S, E)`` and device, the median of ``--repeats`` launches timed with CUDA events,
with the mask (``[1, 1, L, S]`` bf16, causal over the key axis: ``-inf`` where key ``j > i + S - L``, as the
models' masks over a static KV cache) and without it. One JSON file, ``attention_mask.json``: per row the shape,
the device (``cuda:0`` or ``cuda:0@Nsm``), the granted SMs, the seconds without and with the mask, and the score
elements ``B*H*L*S``.

    python3 bench/gpu_attention_mask.py --out $OUT/attn

``tessera calibrate``'s ``mask_ops`` comes from it (docs/BENCHMARKS.md, kernel cost model). Dry run without a GPU
(CPU math backend, host clock; the numbers mean nothing):

    python bench/gpu_attention_mask.py --out /tmp/attn --dry-run
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

#: (B, H, L, S, E): prefill-like shapes with head dims 64 and 128, none of them a registry model's; the last three
#: (and the key lengths 576 and 3,136) are not multiples of the 128-row tile (a ragged last tile).
SHAPES = ((1, 32, 2048, 2048, 128), (1, 16, 2048, 2048, 64), (2, 32, 512, 576, 128), (1, 32, 4096, 4096, 64),
          (1, 8, 3072, 3136, 128), (1, 24, 4160, 4160, 64), (1, 16, 3000, 3000, 64), (2, 16, 1100, 1100, 128))


def _attention(q, k, v, mask):
    """The models' op where it exists (CUDA), else the math SDPA (dry run)."""
    if q.is_cuda:
        return torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, mask, False)[0]
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


#: Cycles the GPU spins before each timed launch (about half a millisecond), so the host has queued the launch, and
#: every kernel of a library call that runs several, before the first event: the events time the GPU's work alone,
#: not the host's dispatch.
HOLD_CYCLES = 1_000_000


def _time(fn, stream, repeats: int, cuda: bool) -> float:
    """Median seconds of ``fn`` on ``stream`` over ``repeats`` launches (after 3 warm-up launches), each timed with
    CUDA events behind a :data:`HOLD_CYCLES` spin on the same stream (GPU time only; host clock on CPU)."""
    times = []
    for i in range(repeats + 3):
        if cuda:
            with torch.cuda.stream(stream):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda._sleep(HOLD_CYCLES)
                a.record()
                fn()
                b.record()
            b.synchronize()
            t = a.elapsed_time(b) / 1e3
        else:
            t0 = time.perf_counter()
            fn()
            t = time.perf_counter() - t0
        if i >= 3:
            times.append(t)
    return statistics.median(times)


def sweep_setup(description: str, out_file: str, repeats: int):
    """The sweeps' shared command line (``--out``, ``--sms``, ``--repeats``, ``--dry-run``): parsed arguments, the
    output folder (created) and the devices to time, ``[(name, partition or None)]`` (the whole GPU first); or an
    exit status of 2 with the reason on stderr (no GPU without ``--dry-run``, an unwritable ``--out``)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out", required=True, help=f"folder for {out_file} (created)")
    ap.add_argument("--sms", default="16,24,72",
                    help="SMs of the green-context partitions to time besides the whole GPU (default: 16,24,72)")
    ap.add_argument("--repeats", type=int, default=repeats,
                    help=f"launches timed per shape and device; their median is kept (default: {repeats})")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, host clock: checks the script only")
    args = ap.parse_args()
    cuda = not args.dry_run
    if cuda and not torch.cuda.is_available():
        print("no CUDA GPU: run on the GPU machine, or pass --dry-run to check the script on CPU", file=sys.stderr)
        return 2
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"cannot write --out {args.out}: {e.strerror}; pass a writable folder", file=sys.stderr)
        return 2
    devices = [("cuda:0" if cuda else "cpu", None)]
    if not cuda:
        print("DRY RUN on CPU (tiny shapes, host clock): checks the script only; the numbers mean nothing", flush=True)
    if cuda:
        from torch_tessera.target.green import create_partition

        for n in (int(x) for x in args.sms.split(",") if x.strip()):
            part, _ = create_partition(0, n)
            devices.append((f"cuda:0@{part.granted_sms}sm", part))
    return args, out, devices


def main() -> int:
    setup = sweep_setup(__doc__.split("\n\n")[0], "attention_mask.json", 15)
    if setup == 2:
        return 2
    args, out, devices = setup
    cuda = not args.dry_run
    shapes = SHAPES if cuda else ((1, 2, 64, 80, 16),)
    rows = []
    for b, h, length, s, e in shapes:
        dev = "cuda" if cuda else "cpu"
        g = torch.Generator(device=dev).manual_seed(0)
        dtype = torch.bfloat16 if cuda else torch.float32
        q = torch.randn(b, length, h, e, device=dev, dtype=dtype, generator=g).transpose(1, 2)  # the models' layout
        k = torch.randn(b, h, s, e, device=dev, dtype=dtype, generator=g)
        v = torch.randn(b, h, s, e, device=dev, dtype=dtype, generator=g)
        # causal over a longer key axis, as the models' masks over a static KV cache: row i sees keys j <= i + S - L
        seen = torch.arange(s, device=dev)[None, :] <= torch.arange(length, device=dev)[:, None] + (s - length)
        mask = torch.zeros(length, s, device=dev, dtype=dtype).masked_fill(~seen, float("-inf"))[None, None]
        for name, part in devices:
            stream = part.stream if part is not None else (torch.cuda.current_stream() if cuda else None)
            plain = _time(lambda: _attention(q, k, v, None), stream, args.repeats, cuda)
            masked = _time(lambda: _attention(q, k, v, mask), stream, args.repeats, cuda)
            sms = part.granted_sms if part is not None else (
                torch.cuda.get_device_properties(0).multi_processor_count if cuda else 0)
            rows.append({"shape": [b, h, length, s, e], "device": name, "sms": sms, "seconds_plain": plain,
                         "seconds_masked": masked, "scores": b * h * length * s})
            print(f"{str((b, h, length, s, e)):28} {name:14} plain {plain * 1e6:9.1f} us  masked {masked * 1e6:9.1f} us"
                  f"  x{masked / plain:.2f}", flush=True)
    meta = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0) if cuda else "cpu (dry run)",
            "cudnn": torch.backends.cudnn.version() if cuda else None, "repeats": args.repeats}
    (out / "attention_mask.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"wrote {out / 'attention_mask.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
