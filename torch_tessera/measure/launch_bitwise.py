"""Which launches compute different bits on another device: a program replayed launch by launch on its home device
and, from bitwise copies of the buffers each launch touches, on every alternate device (``bench/gpu_launch_bitwise.py``
runs it on GPUs; tests on CPU virtual devices).
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils._pytree import tree_flatten


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
