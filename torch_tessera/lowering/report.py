"""Human-readable views of a :class:`KernelProgram` (used by ``tessera inspect``)."""

from __future__ import annotations

from torch.utils._pytree import tree_flatten

from torch_tessera.lowering.capture import extern_accesses, launch_writes
from torch_tessera.lowering.program import ExternLaunch, KernelProgram, Launch, TensorArg, TritonLaunch


def human_bytes(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def launch_views(launch: Launch) -> list[TensorArg]:
    """Every tensor view a launch passes (arguments, then extern results)."""
    if isinstance(launch, TritonLaunch):
        return [a for a in launch.args if isinstance(a, TensorArg)]
    leaves = tree_flatten((launch.args, dict(launch.kwargs)))[0]
    return [a for a in leaves if isinstance(a, TensorArg)] + list(launch.outputs)


def launch_reads(launch: Launch) -> set[str]:
    """Buffers a launch may read, from Inductor's metadata (``in_ptr``/``in_out_ptr``; extern inputs)."""
    if isinstance(launch, TritonLaunch):
        return {a.buffer for n, a in launch.tensor_args.items() if n.startswith(("in_ptr", "in_out_ptr"))}
    return extern_accesses(launch)[0]


def launch_bytes(launch: Launch) -> int:
    """Bytes the launch's views span (each distinct view once): a rough traffic figure for display."""
    seen = set()
    total = 0
    for v in launch_views(launch):
        key = (v.buffer, v.byte_span)
        if key not in seen:
            seen.add(key)
            total += v.byte_span[1] - v.byte_span[0]
    return total


def format_program(program: KernelProgram, limit: int | None = None) -> str:
    """A table of launches (kind, kernel, buffers read/written, bytes) followed by totals."""
    rows = []
    for launch in program.launches[:limit]:
        name = launch.kernel if isinstance(launch, TritonLaunch) else launch.op
        reads = ",".join(sorted(launch_reads(launch)))
        writes = ",".join(sorted(launch_writes(launch)))
        layer = launch.provenance.layer
        rows.append((str(launch.index), launch.kind, name, "" if layer is None else str(layer), reads, writes,
                     human_bytes(launch_bytes(launch))))
    header = ("#", "kind", "kernel / op", "layer", "reads", "writes", "bytes")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    widths[2] = min(widths[2], 60)
    widths[4] = min(widths[4], 48)
    widths[5] = min(widths[5], 32)

    def fmt(r: tuple) -> str:
        cells = [c if len(c) <= w else c[: w - 1] + "~" for c, w in zip(r, widths)]
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    lines = [fmt(header), fmt(tuple("-" * w for w in widths))] + [fmt(r) for r in rows]
    if limit is not None and len(program.launches) > limit:
        lines.append(f"... {len(program.launches) - limit} more launches")
    by_kind: dict[str, int] = {}
    for b in program.buffers.values():
        by_kind[b.kind.value] = by_kind.get(b.kind.value, 0) + b.nbytes
    lines.append("")
    lines.append(
        f"{len(program.launches)} launches: {len(program.triton_launches)} Triton "
        f"({len(program.kernels)} distinct kernels), {len(program.extern_launches)} extern; "
        f"{len(program.buffers)} buffers on {program.device}"
    )
    lines.append("bytes by buffer kind: " + ", ".join(f"{k} {human_bytes(v)}" for k, v in sorted(by_kind.items())))
    return "\n".join(lines)


__all__ = ["format_program", "launch_reads", "launch_writes", "launch_bytes", "human_bytes", "ExternLaunch"]
