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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from gpu_generate_check import SDPA_BACKENDS, build_llama, use_sdpa  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

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


def _config(launcher, kernel: str) -> str | None:
    try:
        k = launcher.kernel(kernel)
        ls = getattr(k, "launchers", None) or []
        return str(getattr(ls[0], "config", None)) if len(ls) == 1 else f"{len(ls)} candidates"
    except Exception as e:  # noqa: BLE001 - diagnostic only
        return f"? {type(e).__name__}"


def compare_launches(program, inputs, home_launcher, home: torch.device, alts: list[str]) -> dict:
    """Run ``program`` launch by launch on ``home`` (with ``home_launcher``'s kernels: the live ones from lowering);
    before each launch copy the buffers it touches to every alternate device, run it there too and compare, bitwise,
    every buffer it touches (and an extern op's fresh result). Returns per alternate the count of launches compared
    and differing, and the differing launches."""
    from torch_tessera.target.devices import open_device
    from torch_tessera.runtime.executor import (BufferPool, KernelLauncher, bind_input, fresh_extern_outputs,
                                                launch_buffers)
    from torch_tessera.lowering.program import ExternLaunch, TensorArg

    devs = {}
    for a in [f"{home.type}:{home.index or 0}:fresh" if home.type == "cuda" else "cpu:fresh", *alts]:
        spec = a.rsplit(":fresh", 1)[0]
        d = open_device(spec)
        stream = d.default_stream if d.torch_device.type == "cuda" else None
        devs[a] = (d, KernelLauncher(program, None, d.torch_device), stream)
    fresh = fresh_extern_outputs(program)
    pool = BufferPool(home)
    for i, (spec, v) in enumerate(zip(program.inputs, inputs)):
        if isinstance(spec, TensorArg) and spec.buffer not in pool:
            bind_input(pool, spec, v, i)
    rows = {a: {"compared": 0, "differing": 0, "first": []} for a in devs}
    for launch in program.launches:
        bufs = sorted(launch_buffers(launch))
        for b in bufs:
            if b not in pool and b not in fresh.get(launch.index, ()):
                pool.allocate(b, program.buffers[b].nbytes)
        copies = {}
        for a, (d, _, _) in devs.items():
            p = BufferPool(d.torch_device)
            for b in bufs:
                if b in pool:  # a host-resident input (a CPU scalar tensor) stays on the host
                    src = pool.storages[b]
                    p.storages[b] = src.clone() if src.device.type == "cpu" else src.to(d.torch_device, copy=True)
            copies[a] = p
        _sync_all(home)  # the copies are on each device's current stream; a partition's launch runs on its own
        result = home_launcher.launch(launch, pool)
        results = {}
        for a, (d, launcher, stream) in devs.items():
            with d.guard(), (torch.cuda.stream(stream) if stream is not None else _null()):
                results[a] = launcher.launch(launch, copies[a], stream)
        _sync_all(home)
        outs = _fresh_tensors(launch, result, fresh)
        for spec_buf, t in outs.items():
            pool.bind(spec_buf, t)
        is_extern = isinstance(launch, ExternLaunch)
        what = str(launch.overload) if is_extern else launch.kernel
        for a, p in copies.items():
            diff = 0.0
            same = True
            for b, t in _fresh_tensors(launch, results[a], fresh).items():
                p.bind(b, t)
            for b in bufs:
                if b not in pool or b not in p:
                    continue
                x = pool.storages[b]
                y = p.storages[b].to(x.device)
                if x.numel() != y.numel() or not torch.equal(x, y):
                    same = False
                    diff = max(diff, _max_abs(program, launch, b, pool, p, home))
            rows[a]["compared"] += 1
            if not same:
                rows[a]["differing"] += 1
                if len(rows[a]["first"]) < 40:
                    prov = getattr(launch, "provenance", None)
                    rows[a]["first"].append({
                        "index": launch.index, "what": what, "extern": is_extern,
                        "layer": getattr(prov, "layer", None) if prov is not None else None,
                        "max_abs_diff": diff,
                        "config_home": None if is_extern else _config(home_launcher, launch.kernel),
                        "config_there": None if is_extern else _config(devs[a][1], launch.kernel)})
    for d, _, _ in devs.values():
        d.close()
    return {"alternates": rows}


def _sync_all(home: torch.device) -> None:
    if home.type == "cuda":
        for i in range(torch.cuda.device_count()):
            torch.cuda.synchronize(i)


def _null():
    import contextlib

    return contextlib.nullcontext()


def _fresh_tensors(launch, result, fresh) -> dict:
    from torch_tessera.lowering.program import ExternLaunch

    if not isinstance(launch, ExternLaunch) or launch.index not in fresh:
        return {}
    leaves = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
    return {spec.buffer: t for spec, t in zip(launch.outputs, leaves) if spec.buffer in fresh[launch.index]}


def _max_abs(program, launch, buffer: str, a, b, home) -> float:
    """Largest elementwise difference over the launch's views of ``buffer`` (as the launch's dtype)."""
    from torch_tessera.lowering.program import TensorArg

    leaves = tree_flatten(list(getattr(launch, "args", [])) + list(dict(getattr(launch, "kwargs", {}) or {}).values())
                          + list(getattr(launch, "outputs", [])))[0]
    best = 0.0
    for arg in leaves:
        if isinstance(arg, TensorArg) and arg.buffer == buffer and arg.dtype.is_floating_point:
            try:
                x = a.view(arg)
                best = max(best, float((x.float() - b.view(arg).to(x.device).float()).abs().max()))
            except Exception:  # noqa: BLE001 - a view the pool cannot form: bytes differ, size unknown
                best = max(best, float("nan"))
    return best


if __name__ == "__main__":
    sys.exit(main())
