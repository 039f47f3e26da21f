"""What ``tessera dist-run`` prints for a person: rank 0's verdict and one row per rank (``--json`` gives the raw
record instead)."""

from __future__ import annotations

from typing import Any

from torch_tessera.scheduler.report import fmt_bytes, fmt_seconds


def rank_row(mine: dict, device: str) -> dict:
    """The part of one rank's record the table shows: its device (as ``--devices`` names it), host, launches per
    call, cut edges, and bytes sent over all calls: for cut edges, and the rest (inputs, outputs gathered on rank 0,
    weights)."""
    return {"rank": mine["rank"], "device": device, "host": mine["host"], "launches": mine["launches"],
            "cut_edges_sent": len(mine["cut_edges_sent"]), "cut_edges_received": len(mine["cut_edges_received"]),
            "cut_bytes_sent": float(mine["bytes_sent"].get("cut", 0)),
            "other_bytes_sent": float(sum(v for k, v in mine["bytes_sent"].items() if k != "cut"))}


def format_result(result: dict, model: str, size: str) -> str:
    """Rank 0's record (``_run_rank``'s result, with ``per_rank``) as a few lines and a table.

    Args:
        result: rank 0's record: ``ok``, ``failures``, ``cut_edges``, ``max_abs_diff_eager``, ``per_rank``, timings.
        model: the registry model name.
        size: ``"tiny"`` or ``"full"``.
    """
    verdict = "OK" if result.get("ok", True) else f"FAILED ({len(result['failures'])} check(s))"
    calls = result.get("seconds_per_call") or []
    lines = [f"tessera dist-run: {model} ({size}) on {result['world_size']} ranks, policy {result['policy']}: "
             f"{verdict}",
             f"{result['total_launches']} launches, {result['cut_edges']} cut edges "
             f"({result['cut_edges_transferred']} transferred per call); compile {result['compile_s']:.1f} s; "
             f"{len(calls)} call(s), the last {fmt_seconds(calls[-1]) if calls else '-'}; bytes: all calls"]
    rows = [[str(r["rank"]), r["device"], r["host"], str(r["launches"]), str(r["cut_edges_sent"]),
             str(r["cut_edges_received"]), fmt_bytes(r["cut_bytes_sent"]), fmt_bytes(r["other_bytes_sent"])]
            for r in result.get("per_rank", [])]
    lines += _table(["rank", "device", "host", "launches/call", "cut edges sent", "received", "cut bytes sent",
                     "inputs/outputs sent"], rows)
    lines.append(f"vs eager: max abs diff {result['max_abs_diff_eager']:.3g}"
                 + _same(result, "equal_inprocess", "the in-process runtime"))
    piped = result.get("pipelined")
    if piped:
        lines.append(f"pipelined: {piped['micro_batches']} micro-batches, {piped['slots']} in flight, "
                     f"{fmt_seconds(piped['seconds'])}; vs eager: max abs diff {piped['max_abs_diff_eager']:.3g}"
                     + _same(piped, "equal_inproc_pipelined", "the in-process replay"))
    return "\n".join(lines)


def _same(record: dict, key: str, what: str) -> str:
    if key not in record:
        return ""
    return f"; bitwise equal to {what}: {'yes' if record[key] else 'NO'}"


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    return ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header] + rows]
