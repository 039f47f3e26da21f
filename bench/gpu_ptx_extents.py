"""GPU cross-check of the PTX access analysis against the addresses kernels really touch (issue 3, as the paper does).

For every model of the validation corpus (``tests/ptx/zoo.py``) lowered on CUDA, each Triton launch (up to
``--max-launches``) is run from its sm_XX PTX rewritten by :func:`torch_tessera.ptx.instrument.instrument_ptx`: every
global load/store/atomic also records the min and max address it used in an extra buffer (loaded with cuda-python:
``cuModuleLoadData`` / ``cuModuleGetFunction`` / ``cuLaunchKernel``). The instrumented kernel does the launch's real
work inside the program (the rest of the program runs as usual), so buffers hold real data (valid gather indices).
Per launch and pointer parameter the report compares:

- the static mode (``torch_tessera.ptx`` on the same PTX) with the observed one (some executed site inside the view
  loaded / stored / ran an atomic): *sound* when nothing observed is missing from the static mode, *exact* when equal;
- the static extent (the byte span of the view the launch passes) with the observed ``[min, max)``: *sound* when
  inside; *coverage* is the fraction of the static span between them;
- stray accesses: executed sites inside no parameter's view;
- a second, independent write check: the bytes each storage changed during the launch (before/after diff) must lie
  inside the static write extents.

The model's output with instrumented kernels is compared with eager. Per-launch failures (compile, JIT, launch) are
caught and reported; a CUDA error that poisons the context stops the run and is reported.

Run (one H200, torch 2.11 + triton 3.6 + cuda-python; < 3 minutes):
    python -m bench.gpu_ptx_extents --out results/ptx_extents      # from the repository root (it reads tests/ptx/zoo.py)
Writes ``ptx_extents.json`` and ``ptx_extents.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from torch_tessera.errors import TesseraError
from torch_tessera.lowering.program import ScalarArg, TensorArg, TritonLaunch
from torch_tessera.ptx import access_from_ptx, compile_ptx
from torch_tessera.ptx.instrument import ViewSpan, check_launch, decode_trace, instrument_ptx
from torch_tessera.runtime.executor import KernelLauncher, ProgramExecutor

#: ctypes type of each scalar Triton signature type, as the PTX ``.param`` holds it.
CTYPES = {"i1": ctypes.c_uint8, "i8": ctypes.c_int8, "u8": ctypes.c_uint8, "i16": ctypes.c_int16,
          "u16": ctypes.c_uint16, "i32": ctypes.c_int32, "u32": ctypes.c_uint32, "i64": ctypes.c_int64,
          "u64": ctypes.c_uint64, "fp32": ctypes.c_float, "f32": ctypes.c_float, "fp64": ctypes.c_double}
SCRATCH_BYTES = 64 << 20  # passed for Triton's trailing scratch pointers (global / profile scratch)


class DriverError(TesseraError):
    """A CUDA driver call failed; ``sticky`` when the context is unusable afterwards."""

    def __init__(self, message: str, sticky: bool = False) -> None:
        super().__init__(message)
        self.sticky = sticky


class Driver:
    """Loads and launches PTX through cuda-python's driver bindings, in torch's (primary) context."""

    STICKY = {"CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_MISALIGNED_ADDRESS",
              "CUDA_ERROR_ILLEGAL_INSTRUCTION", "CUDA_ERROR_HARDWARE_STACK_ERROR", "CUDA_ERROR_INVALID_PC",
              "CUDA_ERROR_ASSERT"}

    def __init__(self, device: torch.device) -> None:
        try:
            from cuda.bindings import driver as cu
        except ImportError:  # older cuda-python
            from cuda import cuda as cu  # type: ignore[no-redef]
        self.cu = cu
        torch.zeros(1, device=device)  # torch creates and binds the primary context
        self._ok(cu.cuInit(0), "cuInit")
        dev = self._ok(cu.cuDeviceGet(device.index or 0), "cuDeviceGet")
        if not _handle(self._ok(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")):
            self._ok(cu.cuCtxSetCurrent(self._ok(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")),
                     "cuCtxSetCurrent")
        attr = cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        self.max_shared = int(self._ok(cu.cuDeviceGetAttribute(attr, dev), "cuDeviceGetAttribute"))
        major, minor = torch.cuda.get_device_capability(device)
        self.arch = f"sm_{major}{minor}" + ("a" if major == 9 else "")  # Triton targets sm_90a on Hopper
        self.modules: list[Any] = []

    def _ok(self, result: Any, call: str) -> Any:
        err, *values = result if isinstance(result, tuple) else (result,)
        if int(err) != 0:
            name = self.cu.cuGetErrorName(err)[1]
            name = name.decode() if isinstance(name, bytes) else str(name)
            raise DriverError(f"{call} failed: {name}", sticky=name in self.STICKY)
        return values[0] if len(values) == 1 else (tuple(values) or None)

    def load(self, ptx: str, name: str) -> tuple[Any, int]:
        """``(function, dynamic shared bytes to launch with)``: all the opt-in shared memory the static part leaves
        (Triton's dynamic shared size is not in the PTX; more than needed is harmless).

        The PTX is assembled by Triton's bundled ``ptxas`` (the toolchain Triton itself uses; its error message names
        the bad line) when it is found, else JIT-compiled by the driver.
        """
        cu = self.cu
        cubin = assemble(ptx, self.arch)
        data = cubin if cubin is not None else ptx.encode()
        image = ctypes.create_string_buffer(data, len(data) + 1)  # NUL-terminated for PTX; passed by address
        module = self._ok(cu.cuModuleLoadData(ctypes.addressof(image)), f"cuModuleLoadData({name})")
        self.modules.append(module)
        fn = self._ok(cu.cuModuleGetFunction(module, name.encode()), f"cuModuleGetFunction({name})")
        static = int(self._ok(cu.cuFuncGetAttribute(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn),
                              "cuFuncGetAttribute"))
        dynamic = max(0, self.max_shared - static)
        self._ok(cu.cuFuncSetAttribute(fn, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                       dynamic), "cuFuncSetAttribute")
        return fn, dynamic

    def launch(self, fn: Any, grid: tuple, block: tuple, shared: int, values: list, stream: int) -> None:
        """Launch with ``values`` (ctypes scalars, one per PTX param) on the raw CUDA ``stream``."""
        pointers = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        self._ok(self.cu.cuLaunchKernel(fn, *grid, *block, shared, self.cu.CUstream(stream), ctypes.addressof(pointers),
                                        0), "cuLaunchKernel")

    def unload(self) -> None:
        for m in self.modules:
            self.cu.cuModuleUnload(m)
        self.modules.clear()


def ptxas_path() -> str | None:
    """Triton's bundled ``ptxas`` (``triton/backends/nvidia/bin/ptxas``), else one on ``PATH``."""
    import shutil

    try:
        import triton.backends.nvidia as nvidia
    except ImportError:
        return shutil.which("ptxas")
    path = Path(nvidia.__file__).parent / "bin" / "ptxas"
    return str(path) if path.exists() else shutil.which("ptxas")


def assemble(ptx: str, arch: str) -> bytes | None:
    """cubin of ``ptx`` for ``arch`` (e.g. ``sm_90a``) by ptxas, or ``None`` when no ptxas is found.

    Raises:
        DriverError: ptxas rejected the PTX (the message carries its error output).
    """
    import subprocess
    import tempfile

    tool = ptxas_path()
    if tool is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        src.write_text(ptx)
        proc = subprocess.run([tool, f"-arch={arch}", str(src), "-o", str(out)], capture_output=True, text=True,
                              timeout=120, check=False)
        if proc.returncode != 0:
            if "Unsupported .version" in proc.stderr:
                return None  # this ptxas is older than the PTX ISA Triton emitted: let the driver JIT it
            raise DriverError(f"ptxas -arch={arch} rejected the instrumented PTX: {proc.stderr.strip()[:800]}")
        return out.read_bytes()


def _handle(obj: Any) -> int:
    """Integer value of a cuda-python handle (``CUcontext``...), 0 for none."""
    if obj is None:
        return 0
    try:
        return int(obj)
    except TypeError:
        return int(obj.getPtr())


def byte_diff(before: torch.Tensor, after: torch.Tensor) -> tuple[int, int] | None:
    """``[first, last + 1)`` of the bytes that differ between two ``uint8`` storages, or ``None``."""
    changed = torch.nonzero(before != after)
    return None if changed.numel() == 0 else (int(changed[0]), int(changed[-1]) + 1)


class InstrumentingLauncher(KernelLauncher):
    """Runs (up to ``limit``) Triton launches from instrumented PTX; everything else as usual."""

    def __init__(self, program, kernel_objects, device, driver, target: int, model: str, limit: int, rows: list,
                 scratch: torch.Tensor) -> None:
        super().__init__(program, kernel_objects, device)
        self.driver, self.target, self.model, self.limit, self.rows = driver, target, model, limit, rows
        self.scratch = scratch

    def launch(self, launch, pool, stream=None):
        if not isinstance(launch, TritonLaunch) or sum(r["model"] == self.model for r in self.rows) >= self.limit:
            return super().launch(launch, pool, stream)
        row: dict[str, Any] = {"model": self.model, "kernel": launch.kernel, "launch": launch.index,
                               "grid": list(launch.grid), "config": {k: v for k, v in launch.config.items()}}
        self.rows.append(row)
        t0 = time.perf_counter()
        try:
            self._instrumented(launch, pool, row)
            return None
        except DriverError as e:
            row["error"] = str(e)
            if e.sticky:
                row["context_lost"] = True
                raise
        except (TesseraError, RuntimeError, ValueError, KeyError) as e:
            row["error"] = f"{type(e).__name__}: {e}"
        finally:
            row["seconds"] = round(time.perf_counter() - t0, 3)
        if row.get("ran"):  # the instrumented kernel did the work; only reading its trace failed
            return None
        return super().launch(launch, pool, stream)  # the original kernel keeps the program going

    def _instrumented(self, launch: TritonLaunch, pool, row: dict) -> None:
        source = self.program.kernels[launch.kernel]
        compiled = compile_ptx(source, launch.config, self.target)
        static = access_from_ptx(compiled.ptx, compiled.param_names, launch.kernel, self.target)
        inst = instrument_ptx(compiled.ptx, launch.kernel)
        row.update(sites=len(inst.sites), untraced=[f"line {u.line} {u.opcode}: {u.reason}" for u in inst.untraced],
                   static_indirect=static.indirect)
        if 0 in launch.grid:
            raise TesseraError(f"launch {launch.index} of {launch.kernel}: grid unknown (lowering recorded (0,0,0))")
        by_name = dict(zip(launch.param_names, launch.args))
        values, views = [], []
        for name in compiled.param_names:
            arg = by_name.get(name)
            if name.startswith("<scratch"):
                values.append(ctypes.c_uint64(self.scratch.data_ptr()))
            elif isinstance(arg, TensorArg):
                storage = pool.storages[arg.buffer]
                values.append(ctypes.c_uint64(pool.view(arg).data_ptr()))
                start, end = arg.byte_span
                views.append(ViewSpan(name, arg.buffer, storage.data_ptr(), start, end, storage.numel()))
            elif isinstance(arg, ScalarArg):
                values.append(CTYPES[source.signature[name]](arg.value))
            else:
                raise TesseraError(f"{launch.kernel}: no argument for PTX parameter {name}")
        device = pool.device
        trace = torch.tensor([w - (1 << 64) if w >= 1 << 63 else w for w in inst.initial_trace()],
                             dtype=torch.int64, device=device)
        values.append(ctypes.c_uint64(trace.data_ptr()))
        before = {v.buffer: pool.storages[v.buffer].clone() for v in views}
        fn, shared = self.driver.load(inst.ptx, inst.kernel)
        block = inst.block or (32 * int(launch.config.get("num_warps", 4)), 1, 1)
        stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
        self.driver.launch(fn, launch.grid, block, shared, values, stream)
        row["ran"] = True
        if device.type == "cuda":
            try:
                torch.cuda.synchronize(device)
            except RuntimeError as e:
                raise DriverError(f"{launch.kernel}: kernel failed: {e}", sticky=True) from e
        observed = decode_trace(inst, trace.cpu().tolist())
        modes = {p.name: (p.mode.reads, p.mode.writes, p.atomic) for p in static.params}
        checks, stray = check_launch(observed, views, modes)
        row["executed_sites"] = len(observed)
        row["stray"] = [f"line {s.line} {s.opcode} [{s.start:#x}, {s.end:#x}): {s.where}" for s in stray]
        row["params"] = [dict(param=c.param, buffer=c.buffer, static=_mode(c.static_reads, c.static_writes,
                                                                           c.static_atomic),
                              observed=_mode(c.observed_reads, c.observed_writes, c.observed_atomic),
                              static_extent=list(c.static_extent),
                              observed_extent=list(c.observed_extent) if c.observed_extent else None,
                              coverage=round(c.coverage, 4), mode_sound=c.mode_sound, mode_exact=c.mode_exact,
                              extent_sound=c.extent_sound, ambiguous=c.ambiguous) for c in checks]
        row["changed_bytes"] = _diff_check(before, pool, views, modes)


def _mode(reads: bool, writes: bool, atomic: bool) -> str:
    text = {(False, False): "-", (True, False): "R", (False, True): "W", (True, True): "RW"}[(reads, writes)]
    return text + ("+atomic" if atomic else "")


def _diff_check(before: dict, pool, views: list[ViewSpan], modes: dict) -> list[dict]:
    """Per storage: the range of bytes the launch changed, and how many changed bytes lie outside every static write
    extent (view span of a parameter the analysis says is written) on that storage."""
    out = []
    for buffer, old in before.items():
        changed = old != pool.storages[buffer]
        span = byte_diff(old, pool.storages[buffer])
        writers = [v for v in views if v.buffer == buffer and modes.get(v.param, (True, True, True))[1]]
        for v in writers:
            changed[v.start:v.end] = False
        out.append(dict(buffer=buffer, changed=list(span) if span else None, static_writers=[v.param for v in writers],
                        changed_outside_static_writes=int(changed.sum())))
    return out


def run_model(name: str, fn: Any, inputs: tuple, device: torch.device, driver: Any, target: int, limit: int,
              rows: list) -> dict:
    """Lower one corpus model on ``device``, run it once with instrumented launches, compare with eager."""
    import copy

    from torch_tessera.lowering import lower

    if isinstance(fn, torch.nn.Module):
        fn = fn.to(device)
    inputs = tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs)
    eager = copy.deepcopy(fn) if isinstance(fn, torch.nn.Module) else fn
    scratch = torch.zeros(SCRATCH_BYTES if device.type == "cuda" else 1 << 16, dtype=torch.uint8, device=device)

    def on_captured(captured: Any) -> ProgramExecutor:
        executor = ProgramExecutor(captured.program, captured.kernel_objects)
        executor.launcher = InstrumentingLauncher(captured.program, captured.kernel_objects, device, driver, target,
                                                  name, limit, rows, scratch)
        return executor

    torch._dynamo.reset()
    with torch.no_grad():
        want = eager(*inputs)
        got = torch.compile(fn, backend=lambda gm, ex: lower(gm, ex, on_captured), dynamic=False)(*inputs)
    flat_got, flat_want = torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)
    diff = max((float((a.float() - b.float()).abs().max()) for a, b in zip(flat_got, flat_want)
                if isinstance(a, torch.Tensor) and a.numel()), default=0.0)
    try:
        torch.testing.assert_close(got, want)
        close = True
    except AssertionError:
        close = False
    return {"output_matches_eager": close, "max_abs_diff": diff}


def summarize(rows: list[dict]) -> dict:
    params = [p for r in rows for p in r.get("params", [])]
    return {
        "launches_instrumented": sum("params" in r for r in rows),
        "launch_failures": sum("error" in r for r in rows),
        "kernels": len({r["kernel"] for r in rows if "params" in r}),
        "params": len(params),
        "params_observed": sum(p["observed_extent"] is not None for p in params),
        "mode_sound": sum(p["mode_sound"] for p in params),
        "mode_exact": sum(p["mode_exact"] for p in params),
        "extent_sound": sum(p["extent_sound"] for p in params),
        "stray_accesses": sum(len(r.get("stray", [])) for r in rows),
        "diff_outside_static_writes": sum(d["changed_outside_static_writes"] for r in rows
                                          for d in r.get("changed_bytes", [])),
        "median_coverage": _median([p["coverage"] for p in params if p["observed_extent"] is not None]),
    }


def _median(xs: list[float]) -> float | None:
    xs = sorted(xs)
    return None if not xs else (xs[len(xs) // 2] + xs[(len(xs) - 1) // 2]) / 2


def markdown(res: dict) -> str:
    s = res["summary"]
    lines = [f"PTX extents cross-check on {res['device']} (torch {res['torch']}, triton {res['triton']}, "
             f"sm_{res['target']}), {res['seconds']:.0f} s", "",
             f"- {s['launches_instrumented']} launches of {s['kernels']} kernels instrumented, "
             f"{s['launch_failures']} failed; {s['params']} pointer parameters, {s['params_observed']} touched",
             f"- static mode sound (nothing observed is missing): {s['mode_sound']}/{s['params']}; "
             f"exact: {s['mode_exact']}/{s['params']}",
             f"- static extent (view span) sound: {s['extent_sound']}/{s['params']}; median coverage of the span "
             f"by observed [min, max): {s['median_coverage']}",
             f"- stray accesses (in no view): {s['stray_accesses']}; bytes changed outside static write extents: "
             f"{s['diff_outside_static_writes']}", "",
             "| model | output = eager |", "| --- | --- |"]
    for m, info in res["models"].items():
        lines.append(f"| {m} | {info.get('output_matches_eager', info.get('error', 'skipped'))} |")
    lines += ["", "| model | kernel | launch | param | static | observed | static extent | observed extent | "
              "coverage | sound (mode/extent) |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in res["launches"]:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['kernel']} | {r['launch']} | FAILED: {r['error'][:120]} | | | | | | |")
        for p in r.get("params", []):
            lines.append(f"| {r['model']} | {r['kernel'][:48]} | {r['launch']} | {p['param']} | {p['static']} | "
                         f"{p['observed']} | {p['static_extent']} | {p['observed_extent']} | {p['coverage']} | "
                         f"{'yes' if p['mode_sound'] else 'NO'}/{'yes' if p['extent_sound'] else 'NO'} |")
    for r in res["launches"]:
        for st in r.get("stray", []):
            lines.append(f"\nstray: {r['model']} {r['kernel']} launch {r['launch']}: {st}")
    return "\n".join(lines) + "\n"


def run(out: Path, models: list[str] | None, limit: int, budget_s: float, device: torch.device, driver: Any,
        target: int) -> dict:
    """Instrument the corpus on ``device`` and write ``ptx_extents.json`` / ``.md`` under ``out``."""
    import triton

    from tests.ptx.zoo import zoo

    t0 = time.perf_counter()
    torch.manual_seed(0)
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else str(device),
                           "torch": torch.__version__, "triton": triton.__version__,
                           "python": platform.python_version(), "target": target, "models": {}, "launches": []}
    for name, fn, inputs in zoo():
        if models and name not in models:
            continue
        if time.perf_counter() - t0 > budget_s:
            res["models"][name] = {"error": f"skipped: time budget of {budget_s:.0f} s spent"}
            continue
        try:
            res["models"][name] = run_model(name, fn, inputs, device, driver, target, limit, res["launches"])
        except Exception as e:  # noqa: BLE001 - one model's failure is reported, the others still run
            res["models"][name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
            if any(r.get("context_lost") for r in res["launches"]):
                res["aborted"] = "the CUDA context was lost (sticky error); later models were not run"
                break
    res["seconds"] = time.perf_counter() - t0
    res["summary"] = summarize(res["launches"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "ptx_extents.json").write_text(json.dumps(res, indent=1, default=str))
    (out / "ptx_extents.md").write_text(markdown(res))
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="folder for ptx_extents.json and ptx_extents.md")
    ap.add_argument("--models", default="", help="comma-separated corpus models (default: all)")
    ap.add_argument("--max-launches", type=int, default=40, help="instrumented Triton launches per model")
    ap.add_argument("--budget-s", type=float, default=120.0, help="start no new model after this many seconds")
    ap.add_argument("--device", default="cuda:0")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_ptx_extents: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    major, minor = torch.cuda.get_device_capability(device)
    try:
        driver = Driver(device)
    except (ImportError, DriverError) as e:
        print(f"gpu_ptx_extents: cuda-python driver bindings unavailable: {e}", file=sys.stderr)
        return 2
    models = [m for m in args.models.split(",") if m] or None
    res = run(args.out, models, args.max_launches, args.budget_s, device, driver, major * 10 + minor)
    print(markdown(res))
    return 0 if not res["summary"]["launch_failures"] and not res.get("aborted") else 1


if __name__ == "__main__":
    sys.exit(main())
