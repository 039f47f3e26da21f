"""Readable text for plans: one plan's summary table and a comparison of several plans (policies, baselines)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:  # types.Plan.summary() calls into this module
    from torch_tessera.scheduler.types import Plan


def fmt_seconds(s: float) -> str:
    """Seconds with a unit that keeps 3-4 significant digits (``"12.3 us"``, ``"4.56 ms"``)."""
    if s != s or s in (float("inf"), float("-inf")):
        return str(s)
    a = abs(s)
    if a >= 1:
        return f"{s:.3f} s"
    if a >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} us"


def fmt_bytes(n: float) -> str:
    """Bytes in B / KB / MB / GB (powers of 1000, as the budgets and error messages use)."""
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.2f} {unit}"
    return f"{int(n)} B"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).rjust(w) if i else str(c).ljust(w)  # noqa: E731
                               for i, (c, w) in enumerate(zip(r, widths)))
    return [line(header), "  ".join("-" * w for w in widths)] + [line(r) for r in rows]


def programs_line(frequencies: Mapping[str, float]) -> str:
    """Each program's runs per workload step, in words: ``"runs per step: prefill 1, decode 129"``.

    A workload served as request streams (programs ``"<name>"`` and ``"<name>@<r>"``, each running its stream's share
    of the requests) is shown as whole runs per program plus each stream's share of the requests, not as fractions.
    """
    streams: dict[str, dict[int, float]] = {}
    for name, f in frequencies.items():
        root, at, r = name.rpartition("@")
        root, r = (root, int(r)) if at and r.isdigit() else (name, 0)
        streams.setdefault(root, {})[r] = f
    totals = {root: sum(by.values()) for root, by in streams.items()}
    line = "runs per step: " + ", ".join(f"{root} {_count(t)}" for root, t in totals.items())
    root, by = next(iter(streams.items()), ("", {}))
    if len(by) < 2 or totals[root] <= 0:
        return line
    shares = ", ".join(f"stream {r} {100 * by[r] / totals[root]:.1f} %" for r in sorted(by))
    return f"{line}; requests split over {len(by)} streams ({shares})"


def _count(x: float) -> str:
    """A run count: an integer when it is one, else 3 significant digits."""
    return str(round(x)) if abs(x - round(x)) < 1e-6 else f"{x:.3g}"


def plan_summary(plan: Plan) -> str:
    """The plan as a table: per device kernels, compute, memory (budget); per link transfers; totals and gap."""
    what = "cycle time / step" if plan.objective == "cycle" else "latency / request"
    out = [f"Plan {plan.policy!r} on {len(plan.devices)} device(s), {plan.micro_batches} micro-batch(es), "
           + programs_line(plan.frequencies),
           f"predicted {what}: {fmt_seconds(plan.predicted_seconds)}   lower bound "
           f"{fmt_seconds(plan.lower_bound_seconds)}   gap {100 * plan.gap:.2f} %",
           f"cycle {fmt_seconds(plan.cycle_seconds)} ({plan.throughput_per_s:.1f} steps/s)   "
           f"latency {fmt_seconds(plan.latency_seconds)}"]
    if plan.simulated_seconds is not None:
        out.append(f"simulated step (pipelined schedule, {plan.micro_batches} micro-batches): "
                   f"{fmt_seconds(plan.simulated_seconds)} per workload step "
                   f"({1.0 / plan.simulated_seconds if plan.simulated_seconds > 0 else float('inf'):.1f} steps/s)")
    if plan.schedules:
        out.append("its schedule per pipeline step: " + "; ".join(
            f"{name} {sum(len(st) for st in s.streams)} steps, {s.num_waits} waits, "
            f"{s.transfer_bytes / 1e6:.3g} MB moved" for name, s in plan.schedules))
    if plan.replicas:
        out.append(f"full replica on devices {', '.join(plan.devices[d] for d in plan.replicas)}")
    rows = []
    for g, name in enumerate(plan.devices):
        budget = plan.memory_budgets[g]
        rows.append([name, str(plan.kernels_on(g) if not plan.replicas else plan.kernels_on(plan.replicas[0])),
                     fmt_seconds(plan.device_seconds[g]), fmt_bytes(plan.weight_bytes[g]),
                     fmt_bytes(plan.state_bytes[g]), fmt_bytes(plan.activation_bytes[g]),
                     fmt_bytes(plan.memory_bytes[g]), "-" if budget is None else fmt_bytes(budget)])
    out += _table(["device", "kernels", "busy/step", "weights", "state", "activ.", "memory", "budget"], rows)
    for name, members, held, capacity in plan.memory_pools:
        out.append(f"GPU {name}: {', '.join(plan.devices[g] for g in members)} hold {fmt_bytes(held)} together "
                   f"(buffers they share once), budget {fmt_bytes(capacity)} (one GPU's memory, shared)")
    if any(plan.hop_seconds):
        out.append("busy/step includes the per-hop charge of cut edges: "
                   + ", ".join(f"{plan.devices[g]} {fmt_seconds(s)}" for g, s in enumerate(plan.hop_seconds)))
    if plan.link_seconds:
        per_link: dict[tuple[int, int], list[float]] = {}
        for e in plan.cut_edges:
            f = 1.0 if e.kind == "STATE" else plan.frequencies.get(e.program, 1.0)
            acc = per_link.setdefault((e.src_device, e.dst_device), [0, 0.0])
            acc[0] += 1
            acc[1] += e.nbytes * f
        rows = [[f"{plan.devices[a]} -> {plan.devices[b]}", str(per_link.get((a, b), [0])[0]),
                 fmt_bytes(per_link.get((a, b), [0, 0.0])[1]), fmt_seconds(s)] for (a, b), s in plan.link_seconds]
        out += [""] + _table(["link", "cut edges", "bytes/step", "transfer/step"], rows)
    out.append(f"cut edges: {len(plan.cut_edges)}, bytes per step {fmt_bytes(plan.bytes_per_step)}")
    s = plan.solver
    out.append(f"solver: {s.method}, {s.status}, {s.wall_seconds * 1e3:.1f} ms, {s.nodes} B&B nodes, "
               f"{s.kernels} kernels -> {s.blocks} blocks" + (f"; {'; '.join(s.notes)}" if s.notes else ""))
    return "\n".join(out)


def compare(plans: Mapping[str, Plan | Exception], reference: str | None = None) -> str:
    """One line per plan (or the reason it does not apply): cycle, throughput, latency, memory, traffic, gap.

    Args:
        plans: name -> plan, or the exception that made it n/a (``NotApplicableError``, ``InfeasiblePlanError``).
        reference: name whose throughput the ``speed-up`` column divides by (default: the first plan).
    """
    ok = {k: v for k, v in plans.items() if not isinstance(v, BaseException)}
    ref = ok.get(reference) if reference else next(iter(ok.values()), None)
    rows, why = [], []
    for name, p in plans.items():
        if isinstance(p, BaseException):
            rows.append([name, "n/a", "", "", "", "", "", "", "", "", "see below"])
            why.append(f"{name}: {str(p).split('. Fix')[0]}")  # whole, under the table (a cell would cut it)
            continue
        up = f"{ref.cycle_seconds / p.cycle_seconds:.2f}x" if ref and p.cycle_seconds > 0 else "-"
        sim = p.simulated_seconds
        sim_ref = ref.simulated_seconds if ref is not None and ref.simulated_seconds is not None else None
        rows.append([name, fmt_seconds(p.cycle_seconds), up,
                     "-" if sim is None else fmt_seconds(sim),
                     f"{sim_ref / sim:.2f}x" if sim and sim_ref else "-", fmt_seconds(p.latency_seconds),
                     " / ".join(fmt_bytes(m) for m in p.memory_bytes), str(len(p.cut_edges)),
                     fmt_bytes(p.bytes_per_step), f"{100 * p.gap:.1f} %", f"{p.solver.wall_seconds * 1e3:.0f} ms"])
    legend = [f"speed-up: steps per second relative to {next(k for k, v in ok.items() if v is ref)} (its cycle/step "
              "divided by the plan's; sim. speed-up: the same from the simulated step of the pipelined schedule; '-': a plan "
              "with no pipelined schedule, such as request-dist's independent replicas, whose step is its cycle); gap: "
              "from the lower bound of the plan's own objective (latency for a latency plan, cycle otherwise); "
              "memory: per device, weights included (a weight is held on every device whose kernels read it)"] \
        if ref is not None else []
    return "\n".join(_table(["plan", "cycle/step", "speed-up", "simulated", "sim. speed-up", "latency",
                             "memory per device", "cuts",
                             "bytes/step", "gap", "solve"], rows) + why + legend + _shared_lines(ok))


def _shared_lines(plans: Mapping[str, Plan]) -> list[str]:
    """Per GPU whose partitions share its memory: what each plan holds there (shared buffers once) and its budget."""
    first = next(iter(plans.values()), None)
    lines = []
    for k, (name, members, _, budget) in enumerate(first.memory_pools if first is not None else ()):
        held = ", ".join(f"{n} {fmt_bytes(p.memory_pools[k][2])}" for n, p in plans.items() if len(p.memory_pools) > k)
        lines.append(f"GPU {name} is shared by {', '.join(first.devices[g] for g in members)}: together they hold "
                     f"{held} (buffers they share once; budget {fmt_bytes(budget)})")
    return lines
