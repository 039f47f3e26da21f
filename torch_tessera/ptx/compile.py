"""Compile Inductor's Triton kernels to PTX without a GPU, with an on-disk cache.

Triton ships LLVM's NVPTX backend, so ``triton.compile(..., target=GPUTarget("cuda", cap, 32))`` produces PTX on a
machine with no GPU. Under ``TRITON_INTERPRET=1`` (the CPU test path) ``@triton.jit`` yields interpreter functions that
cannot be compiled, and so does every ``@triton.jit`` helper Triton and Inductor import; compilation then runs in one
subprocess per batch without that variable.

The cache key is the kernel source hash, signature, constants, config, target and Triton version; the cache lives in
``$TESSERA_CACHE_DIR/ptx`` (default ``~/.cache/torch_tessera/ptx``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from torch_tessera import knobs
from torch_tessera.errors import TesseraCacheWarning, warn_user
from torch_tessera.lowering.program import KernelSource
from torch_tessera.ptx import _triton_compat as compat
from torch_tessera.ptx.types import CompiledPTX, PTXCompileError

log = logging.getLogger(__name__)

#: Targets every kernel is compiled for unless the caller says otherwise (sm_80 and sm_90, see DESIGN.md).
DEFAULT_TARGETS = (80, 90)

#: PTX register width of each scalar Triton type (pointers are 64-bit ``.ptr`` params).
_PTX_PARAM_WIDTH = {"i1": 8, "i8": 8, "u8": 8, "i16": 16, "u16": 16, "i32": 32, "u32": 32, "i64": 64, "u64": 64,
                    "fp16": 16, "bf16": 16, "fp32": 32, "f32": 32, "fp64": 64}


def cache_dir() -> Path:
    """Directory of the PTX cache: ``$TESSERA_CACHE_DIR/ptx``, default ``~/.cache/torch_tessera/ptx``."""
    return knobs.cache_dir("ptx")


def runtime_params(source: KernelSource) -> list[str]:
    """The kernel's parameters that survive into PTX, in order: not ``constexpr``, not specialised to a constant."""
    return [n for n, t in source.signature.items() if t != "constexpr" and n not in source.constants]


def _cache_key(source: KernelSource, config: Mapping[str, Any], target: int) -> str:
    blob = json.dumps(
        [source.source_hash, source.name, dict(source.signature), {k: repr(v) for k, v in source.constants.items()},
         {k: repr(v) for k, v in sorted(config.items())}, target, compat.triton_version()],
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _request(source: KernelSource, config: Mapping[str, Any], target: int) -> dict:
    return {"source": source.source, "kernel": source.name, "signature": dict(source.signature),
            "constants": dict(source.constants), "config": dict(config), "capability": target}


def _compile_in_subprocess(requests: Sequence[dict]) -> list[dict]:
    """Compile in a fresh interpreter without ``TRITON_INTERPRET`` (see the module docstring)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH")]
                                        if p)
    proc = subprocess.run([sys.executable, "-m", "torch_tessera.ptx._compile_worker"], input=json.dumps(requests),
                          capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise PTXCompileError(f"the PTX compile worker failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _compile_here_or_again(requests: list[dict]) -> list[dict]:
    """Compile in this process; once Triton's interpreter was used here, the requests that failed are compiled again
    in a subprocess: a kernel calling an ``@triton.jit`` helper first imported under the interpreter (Inductor's
    ``triton_helpers``) cannot be compiled in this process any more."""
    from torch_tessera.compat.triton import interpreter_was_used

    results = compile_here(requests)
    redo = [i for i, r in enumerate(results) if "error" in r]
    if redo and interpreter_was_used():
        log.info("compiling %d kernel/target pairs again in a subprocess (Triton's interpreter was used in this "
                 "process: helpers imported under it stay interpreted)", len(redo))
        for i, r in zip(redo, _compile_in_subprocess([requests[i] for i in redo])):
            results[i] = r
    return results


def compile_here(requests: Sequence[dict]) -> list[dict]:
    """Compile each request in this process: ``{"ptx": text}`` or ``{"error": message}`` per request, in order
    (the subprocess worker's body; needs ``TRITON_INTERPRET`` unset)."""
    results = []
    for r in requests:
        try:
            results.append({"ptx": compat.compile_to_ptx(r["source"], r["kernel"], r["signature"], r["constants"],
                                                         r["config"], r["capability"])})
        except Exception as e:  # Triton raises many unrelated types; the worker reports them as data
            results.append({"error": f"{type(e).__name__}: {e}"})
    return results


def _param_names(source: KernelSource, ptx_params: list[tuple[str, int, bool]]) -> tuple[str, ...]:
    """Name each PTX param; check that pointers land on pointers and scalar widths match the signature."""
    names = runtime_params(source)
    if len(ptx_params) < len(names):
        raise PTXCompileError(
            f"kernel {source.name}: PTX has {len(ptx_params)} params but the signature has {len(names)} runtime "
            f"parameters ({', '.join(names)}); the Triton version's parameter numbering is not supported")
    for name, (_, width, is_ptr) in zip(names, ptx_params):
        ty = source.signature[name]
        want_ptr = ty.startswith("*")
        if want_ptr != is_ptr or (not want_ptr and _PTX_PARAM_WIDTH.get(ty, width) != width):
            raise PTXCompileError(
                f"kernel {source.name}: parameter {name} ({ty}) maps to a PTX param of width {width} "
                f"(pointer={is_ptr}); the PTX parameter numbering differs from the signature's")
    extra = [f"<scratch{i}>" for i in range(len(ptx_params) - len(names))]
    return tuple(names) + tuple(extra)


def compile_many(jobs: Iterable[tuple[KernelSource, Mapping[str, Any], int]]) -> list[CompiledPTX]:
    """Compile (or fetch from the cache) several ``(source, config, target)`` jobs, in one subprocess if needed.

    Raises:
        PTXCompileError: Triton failed on a kernel; the message names the kernel, target and Triton's error.
    """
    from torch_tessera.ptx.parser import parse_entry_params

    jobs = list(jobs)
    folder = cache_dir()
    paths = [folder / f"{s.name[:80]}-{_cache_key(s, c, t)}.ptx" for s, c, t in jobs]  # names can exceed NAME_MAX
    todo = [i for i, p in enumerate(paths) if not p.exists()]
    texts: dict[int, str] = {}
    if todo:
        requests = [_request(*jobs[i]) for i in todo]
        log.info("compiling %d kernel/target pairs to PTX%s", len(todo),
                 " in a subprocess (TRITON_INTERPRET is set)" if compat.interpreting() else "")
        results = _compile_in_subprocess(requests) if compat.interpreting() else _compile_here_or_again(requests)
        for i, res in zip(todo, results):
            s, _, t = jobs[i]
            if "error" in res:
                raise PTXCompileError(f"kernel {s.name} failed to compile for sm_{t}: {res['error']}")
            texts[i] = res["ptx"]
        _store(folder, [(paths[i], texts[i]) for i in todo])
    out = []
    for i, ((s, c, t), p) in enumerate(zip(jobs, paths)):
        text = texts[i] if i in texts else p.read_text()
        params = [(q.name, q.width, q.is_pointer) for q in parse_entry_params(text, kernel=s.name)]
        out.append(CompiledPTX(kernel=s.name, target=t, ptx=text, param_names=_param_names(s, params),
                               config=dict(c)))
    return out


def _store(folder: Path, files: list[tuple[Path, str]]) -> None:
    """Write PTX files into the cache atomically; a cache that cannot be written is warned about
    (:class:`~torch_tessera.errors.TesseraCacheWarning`) and the PTX stays in memory for this call."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for path, text in files:
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(text)
            tmp.replace(path)  # atomic: concurrent readers never see half a file
    except OSError as e:
        message = (f"the PTX cache {folder} cannot be written ({type(e).__name__}: {e}); kernels are compiled to PTX "
                   "again in every process. Set TESSERA_CACHE_DIR to a writable directory.")
        log.warning("%s", message)
        warn_user(message, TesseraCacheWarning)


def compile_ptx(source: KernelSource, config: Mapping[str, Any], target: int) -> CompiledPTX:
    """PTX of one kernel for ``sm_<target>``, with its runtime parameter names.

    Args:
        source: the kernel (module source, signature, constants).
        config: block-size constexprs (``XBLOCK``, ``R0_BLOCK``...) plus ``num_warps`` / ``num_stages``.
        target: compute capability, e.g. 80, 89, 90.
    """
    return compile_many([(source, config, target)])[0]
