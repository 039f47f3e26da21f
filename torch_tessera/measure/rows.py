"""One row per plan from the executed runs: measured, derived, or why a plan has no number."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from torch_tessera.benchmark import SINGLE
from torch_tessera.measure.execute import handover_seconds, program_frequencies
from torch_tessera.measure.programs import Compiled
from torch_tessera.measure.settings import MeasureSettings


@dataclass(frozen=True)
class MeasuredRow:
    """One plan's measured (or derived) performance; times in seconds, throughput in output units per second
    (tokens or images: the run's ``unit``).

    ``how`` says how the throughput was obtained: ``"run"`` (executed serially), ``"run, pipelined"`` (executed with
    micro-batches), ``"run, programs concurrent"`` (prefill and decode calls issued at once from two threads: see
    :func:`~torch_tessera.measure.execute.concurrent_step_seconds`), ``"derived: ..."`` (composed from measured ``homo-*`` steps), or why the plan has no number
    (``"n/a: ..."``, ``"does not fit: ..."``).

    Attributes:
        seconds: program name -> median seconds per call (executed plans).
        pipelined_seconds: program name -> wall seconds per micro-batch through ``run_pipelined`` (programs the plan
            spreads over several devices).
        ttft_s / tpot_s: unloaded prefill / decode step times (LLMs and SSMs; NaN otherwise).
        predicted_output_per_s: the plan's model over the measured costs.
        vs_bound: throughput / the zero-communication bound's.
        derived_output_per_s: request-dist only: the sum of the ``homo-*`` runs' throughputs, each timed alone.
    """

    plan: str
    applies: bool
    how: str
    equal: bool | None = None
    max_abs_error: float = math.nan
    seconds: dict = field(default_factory=dict)
    pipelined_seconds: dict = field(default_factory=dict)
    output_per_s_serial: float = math.nan
    concurrent_output_per_s: float = math.nan
    output_per_s: float = math.nan
    predicted_output_per_s: float = math.nan
    ttft_s: float = math.nan
    tpot_s: float = math.nan
    price_per_hour: float = math.nan
    output_per_s_per_price: float = math.nan
    vs_bound: float = math.nan
    speedup_vs_best_baseline: float = math.nan
    cut_edges: int = 0
    derived_output_per_s: float = math.nan


def _executed(base: dict, r: dict, s: MeasureSettings, frequencies: dict[str, float]) -> dict:
    comp = replace(s.composition, frequencies=frequencies)  # a streams plan runs <name>@<r> programs too
    serial = comp.per_s(r["seconds"])
    piped = comp.per_s({n: r["pipelined_seconds"].get(n, t) for n, t in r["seconds"].items()}) \
        if r["pipelined_seconds"] else math.nan
    best = max(serial, piped) if piped == piped else serial
    how = "run, pipelined" if piped == piped and piped > serial else "run"
    conc = comp.output_per_step / r["concurrent_step_seconds"] if r.get("concurrent_step_seconds") else math.nan
    if conc == conc and conc > best:
        best, how = conc, "run, programs concurrent"
    def worst(role: str) -> float:  # a streams plan: the slowest stream's call (a request may land there)
        return max((t for n, t in r["seconds"].items() if n.split("@")[0] == role), default=math.nan)

    return dict(base, how=how, equal=r["equal"], concurrent_output_per_s=conc,
                max_abs_error=r["max_abs_error"], seconds=r["seconds"], pipelined_seconds=r["pipelined_seconds"],
                output_per_s_serial=serial, output_per_s=best, ttft_s=worst("prefill"), tpot_s=worst("decode"),
                cut_edges=r["cut_edges"])


def _homo_rows(rows: dict, homo: dict, devices: Sequence[int]) -> list[dict] | None:
    """The composed ``homo-*`` rows of ``devices`` (their headline throughput: serial, or with calls in flight for a
    program away from its home device), or ``None`` when one did not run (no row, or one that does not apply: an
    error at run time composes to ``applies=False``)."""
    out = [rows.get(homo[g]) for g in devices]
    return None if any(r is None or not r.get("applies") for r in out) else out


def _derived_sum(base: dict, homo_rows: list[dict], how: str) -> dict:
    """request-dist derived from the ``homo-*`` rows: their throughputs summed (requests split in proportion to
    speed); TTFT / TPOT the slowest replica's."""
    total = sum(r["output_per_s"] for r in homo_rows)
    return dict(base, how=how, output_per_s=total, output_per_s_serial=total, derived_output_per_s=total,
                ttft_s=max(r["ttft_s"] for r in homo_rows), tpot_s=max(r["tpot_s"] for r in homo_rows))


def _request_dist(base: dict, p: Any, rows: dict, homo: dict) -> dict:
    homo_rows = _homo_rows(rows, homo, p.replicas)
    if homo_rows is None:
        return dict(plan=base["plan"], applies=False, how="n/a: a replica's homo-* run is missing")
    return _derived_sum(base, homo_rows, "derived: sum of homo-* replicas")


def _with_homo_sum(row: dict, base: dict, rows: dict, homo: dict, s: MeasureSettings) -> dict:
    """An executed request-dist row (one request stream per device, run at once) with the sum of the ``homo-*``
    rows' throughputs beside it in ``how`` and ``derived_output_per_s`` (each replica timed alone: the number this
    row was before request-dist was executed; the executed streams can beat it where a stream's prefill and decode
    overlap on its device). When the streams could not run (out of memory at run time), the row is that sum, marked
    derived, with the reason."""
    homo_rows = _homo_rows(rows, homo, sorted(homo))
    if homo_rows is None:
        return row
    if row.get("applies") is False:  # the streams did not run: fall back to the derived sum, saying why
        return _derived_sum(base, homo_rows, f"derived: sum of homo-* replicas (the streams did not run: "
                                             f"{row['how'][:80]})")
    total = sum(r["output_per_s"] for r in homo_rows)
    label, factor = s.composition.display
    return dict(row, derived_output_per_s=total,
                how=f"{row['how']} (sum of the homo-* runs alone: {total * factor:,.4g} {label})")


def _pd(base: dict, p: Any, progs: Sequence[Compiled], runs: dict, homo: dict, s: MeasureSettings,
        specs: Sequence[Any]) -> dict:
    comp = s.composition
    a = next(iter(p.placements["prefill"].values()))
    b = next(iter(p.placements["decode"].values()))
    ha, hb = runs.get(homo[a]), runs.get(homo[b])
    if ha is None or hb is None or "error" in ha or "error" in hb:
        return dict(plan=base["plan"], applies=False, how="n/a: a homo-* run is missing")
    pre = next(pg for pg in progs if pg.name == "prefill")
    t_kv = handover_seconds(pre, a, b, s.repeats)
    cycle = max(comp.frequencies["prefill"] * ha["seconds"]["prefill"],
                comp.frequencies["decode"] * hb["seconds"]["decode"], t_kv)
    what = "KV" if s.family in ("llm", "moe") else "state"
    return dict(base, how=f"derived: prefill {specs[a].name}, decode {specs[b].name}, {what} copy "
                f"{t_kv * 1e3:.3g} ms", output_per_s=comp.output_per_step / cycle,
                output_per_s_serial=comp.output_per_step / cycle, ttft_s=ha["seconds"]["prefill"] + t_kv,
                tpot_s=hb["seconds"]["decode"])


def compose_rows(progs: Sequence[Compiled], plans: dict[str, Any], runs: dict[str, dict], bound_cycle: float,
                 s: MeasureSettings, tessera_from: str = "tessera") -> tuple[list[MeasuredRow], float]:
    """Rows for every plan from the executed runs, and the zero-communication bound in output units/s.

    * executed plans: ``output_per_step / sum_p(frequency_p x T_p)`` (:meth:`Composition.per_s`) over the median
      call times; with micro-batches the same over the wall time per micro-batch (the headline takes the faster).
    * ``request-dist``: executed as one request stream per device, the streams running at the same time
      (:func:`~torch_tessera.scheduler.plan_streams` with ``policy="request-dist"``), with the sum of the ``homo-*``
      throughputs beside it (``derived_output_per_s``); derived from that sum alone when it could not run as streams
      (a plan with ``replicas``).
    * ``pd`` (derived; LLMs and SSMs only, the scheduler marks it n/a elsewhere): prefill on ``a``, decode on ``b``
      (the plan's choice), overlapped: ``output_per_step / max(T_prefill(a), f x T_decode(b), T_handover)`` with
      ``T_handover`` the measured copy of one request's KV cache / SSM state from ``a`` to ``b``.
    * ``tessera`` not executed because it took a derived baseline's placement (``tessera_from``: the baseline's name,
      :attr:`~torch_tessera.benchmark.SpaceChoice.chosen`): derived as that baseline's row.
    """
    from torch_tessera.scheduler import Plan

    comp = s.composition
    specs = [d.spec for d in progs[0].runner.devices]
    homo = {i: n for i, n in enumerate(n for n in plans if n.startswith("homo-"))}
    rows: dict[str, dict] = {}
    for name, p in plans.items():
        if not isinstance(p, Plan):
            why = str(p).split("\n")[0][:160]
            rows[name] = dict(plan=name, applies=False, how=("does not fit: " if "fit" in why else "n/a: ") + why)
            continue
        used = sorted({d for pl in p.placements.values() for d in pl.values()} | set(p.replicas))
        base = dict(plan=name, applies=True, price_per_hour=sum(float(specs[g].price_per_hour) for g in used),
                    predicted_output_per_s=comp.output_per_step / p.cycle_seconds if p.cycle_seconds else math.nan)
        if name in runs:
            r = runs[name]
            rows[name] = dict(plan=name, applies=False, how=r["error"]) if "error" in r else \
                _executed(base, r, s, program_frequencies(p, s))
            if name == "request-dist":
                rows[name] = _with_homo_sum(rows[name], base, rows, homo, s)
        elif name == "request-dist" or (name == "tessera" and p.replicas):
            rows[name] = _request_dist(base, p, rows, homo)
        elif name == "pd" or (name == "tessera" and tessera_from == "pd"):
            rows[name] = _pd(base, p, progs, runs, homo, s, specs)
        else:
            rows[name] = dict(plan=name, applies=False, how="n/a: not run")
    bound = comp.output_per_step / bound_cycle if bound_cycle > 0 else math.nan
    best_base = max((r.get("output_per_s", math.nan) for n, r in rows.items()
                     if n not in ("tessera", SINGLE) and r["applies"]), default=math.nan)
    out = []
    for name in plans:
        r = rows[name]
        if r["applies"]:
            t = r["output_per_s"]
            r.update(output_per_s_per_price=t / r["price_per_hour"] if r["price_per_hour"] else math.nan,
                     vs_bound=t / bound, speedup_vs_best_baseline=t / best_base)
        out.append(MeasuredRow(**r))
    return out, bound
