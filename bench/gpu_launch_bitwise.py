"""Which launches compute different bits on another device? Localises issue 5's token differences (CUDA).

Greedy generation of a Llama-3.1-8B-shaped model (random bf16 weights, static KV cache; ``--layers`` decoder layers)
under three forwards: single-GPU Inductor (the reference), our lowering run launch by launch on the home GPU (no
placement: ``ProgramExecutor``), and nothing else. It reports whether our lowering's logits are BITWISE Inductor's
(``lowering``), then replays the first prefill call and the first decode call of our programs launch by launch on
the home GPU and, for each launch, the same launch on every ``--alt`` device with bitwise copies of the buffers it
touches (``launches``): a launch whose results differ there, from identical inputs, computes differently on that
device (another GPU, an SM partition of one: work splits that depend on the SM count, such as cuBLAS split-K or
flash-decoding's KV splits, or an autotuner that chose another configuration on a fresh load). The alternates
include the home GPU itself with freshly loaded kernels (``<home>:fresh``): a difference there is not the device's.
The replay launches through the runtime's :class:`~torch_tessera.runtime.executor.KernelLauncher`, so a Triton kernel
launches everywhere with the configuration its first launch settled on, as in the runtime (before that pinning
existed, ``<home>:fresh`` showed reductions settling on other block sizes); the extern ops (cuBLAS, SDPA) are
whatever the library does there.

    python3 bench/gpu_launch_bitwise.py --out DIR --layers 4 --alt cuda:1,cuda:1@72sm,cuda:0@72sm,cuda:1@24sm \
        --sdpa efficient

Writes ``bitwise.json`` under ``--out``: per program, per alternate, the differing launches (index, kernel or ATen
op, decoder layer, max abs difference over the launch's floating-point views of the buffers it touches, Triton
configuration chosen at home and there). A launch listed with a difference of 0.0 differs only in bytes outside
those views (an op's integer outputs, or storage no view covers).
Measured 2026-11-30 on two H200s: docs/BENCHMARKS.md, session 7. Without a GPU, ``TRITON_INTERPRET=1 python
bench/gpu_launch_bitwise.py --out DIR --device cpu --size tiny --layers 2 --batch 2 --prompt 8 --new 4 --alt cpu:1``
runs the same logic on CPU virtual devices (the CPU Inductor reference there uses C++ kernels, so its logits are not
bitwise ours); ``tests/runtime/test_launch_bitwise_tool.py`` tests the comparison.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from gpu_generate_check import SDPA_BACKENDS, build_llama, use_sdpa

from torch_tessera.measure.launch_bitwise import compare_launches

NEW = 8


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=NEW, help="new tokens per generate (the lowering check)")
    ap.add_argument("--alt", default="cuda:1,cuda:1@72sm,cuda:0@72sm",
                    help="devices each launch is repeated on (the home GPU with fresh kernels is always added)")
    ap.add_argument("--deterministic", action="store_true", help="torch._inductor.config.deterministic for compiles")
    ap.add_argument("--sdpa", default="default", choices=tuple(SDPA_BACKENDS),
                    help="the only attention backend enabled (as in bench/gpu_generate_check.py)")
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # "cpu": a smoke run of the logic
    ap.add_argument("--size", default="full", choices=("full", "tiny"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.deterministic:
        import torch._inductor.config as inductor_config

        inductor_config.deterministic = True
    use_sdpa(args.sdpa)
    from torch_tessera.backend.recording import RecordingBackend
    from torch_tessera.runtime.executor import ProgramExecutor

    model, ids = build_llama(args.size, args.layers, args.batch, args.prompt, args.device)
    kw = dict(max_new_tokens=args.new, do_sample=False, cache_implementation="static", disable_compile=True,
              return_dict_in_generate=True, output_logits=True)
    orig = model.forward
    res: dict[str, Any] = {"args": vars(args), "torch": torch.__version__, "lowering": {}, "launches": {}}

    def generate(fwd):
        model.forward = fwd
        with torch.no_grad():
            out = model.generate(ids, **kw)
        model.forward = orig
        return out.sequences, torch.stack([x.float() for x in out.logits])

    t0 = time.time()
    torch._dynamo.reset()
    ref_seq, ref_logits = generate(torch.compile(orig, backend="inductor", dynamic=False))
    # our lowering, one device, launch by launch; the first two calls of each program keep a copy of their inputs
    snaps: dict[int, list] = {}
    real_run = ProgramExecutor.run

    def snap_run(self, inputs, order=None):
        if id(self) not in snaps:
            snaps[id(self)] = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
        return real_run(self, inputs, order)

    ProgramExecutor.run = snap_run
    try:
        torch._dynamo.reset()
        rec = RecordingBackend()
        seq, logits = generate(torch.compile(orig, backend=rec, dynamic=False))
    finally:
        ProgramExecutor.run = real_run
    res["lowering"] = {
        "tokens_equal_inductor": bool(torch.equal(seq, ref_seq)),
        "logits_bitwise_equal_inductor": bool(torch.equal(logits, ref_logits)),
        "max_abs_logit_diff": float((logits - ref_logits).abs().max()),
        "per_step_max_abs": [round(float((logits[s] - ref_logits[s]).abs().max()), 6) for s in range(len(logits))],
        "seconds": round(time.time() - t0, 1),
    }
    print("lowering vs Inductor:", res["lowering"], flush=True)
    alts = [a.strip() for a in args.alt.split(",") if a.strip()]
    home = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    for n, ex in enumerate(rec.executors):  # compile order: the prefill's program, then the decode step's
        if id(ex) not in snaps:
            continue
        program = ex.program
        name = f"program {n} ({len(program.launches)} launches)"
        t1 = time.time()
        res["launches"][name] = compare_launches(program, snaps[id(ex)], ex.launcher, home, alts)
        res["launches"][name]["seconds"] = round(time.time() - t1, 1)
        for alt, row in res["launches"][name]["alternates"].items():
            print(f"{name} on {alt}: {row['differing']} of {row['compared']} launches differ; first: "
                  f"{row['first'][:3]}", flush=True)
        _write(res, args.out)
    _write(res, args.out)
    return 0


def _write(res: dict, out: str) -> None:
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "bitwise.json").write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    sys.exit(main())
