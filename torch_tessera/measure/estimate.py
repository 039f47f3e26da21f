"""How much work :func:`~torch_tessera.measure.pipeline.measure_plans` will do, said before it starts
(:func:`announce`), and how long the rest should take once calls have been timed (:func:`remaining_line`).

The counts follow :func:`~torch_tessera.measure.execute.run_plan`: per executed plan and program one checked call,
``warmup`` + ``repeats`` timed calls; ``micro_batches`` x (1 + ``repeats // 2``) pipelined calls for a program placed
off its home device; and, for a plan that uses several devices, the concurrent timing's calls
(:func:`~torch_tessera.measure.execute.concurrent_counts`).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from torch_tessera.measure.execute import MIN_CONCURRENT_CALLS, concurrent_counts, program_frequencies
from torch_tessera.measure.settings import MeasureSettings

#: Plans whose rows are derived from other plans' runs, not executed (pd; tessera when it takes pd's placement).
DERIVED = ("pd",)


def plan_calls(s: MeasureSettings, placements: Mapping[str, Sequence[int]], frequencies: Mapping[str, float],
               on_cpu: bool) -> int:
    """Calls of compiled programs that running and timing one plan makes.

    Args:
        s: the settings (``warmup``, ``repeats``, ``micro_batches``, ``concurrent_steps``).
        placements: program name -> the device indices its launches use (device 0 is home).
        frequencies: program name -> runs per workload step (the concurrent timing's mix).
        on_cpu: CPU virtual devices (the concurrent timing's least frequent program makes at least 1 call there,
            :data:`~torch_tessera.measure.execute.MIN_CONCURRENT_CALLS` on GPUs).
    """
    pipelined = s.micro_batches * (1 + max(1, s.repeats // 2)) if s.micro_batches >= 2 else 0
    calls = 0
    for devices in placements.values():
        calls += 1 + s.warmup + s.repeats + (pipelined if set(devices) != {0} else 0)
    used = {d for devices in placements.values() for d in devices}
    if s.concurrent_steps and len(placements) > 1 and len(used) > 1:
        mix = {n: frequencies.get(n, 0.0) for n in placements}
        calls += sum(concurrent_counts(mix, s.concurrent_steps, 1 if on_cpu else MIN_CONCURRENT_CALLS).values())
    return calls


def expected_calls(s: MeasureSettings, plans: Sequence[str], n_devices: int, on_cpu: bool) -> dict[str, int]:
    """Calls per executed plan before planning, from each plan's kind: ``homo-L`` (``homo-0``) stays on the home
    device, another ``homo-*`` runs wholly off it, ``request-dist`` runs one request stream per device, and every
    other plan is assumed to use every device (an upper bound for a planned placement that keeps a program home)."""
    freq = dict(s.composition.frequencies)
    out = {}
    for name in plans:
        if name in DERIVED:
            continue
        if name.startswith("homo-"):
            index = {"homo-L": 0, "homo-R": 1}.get(name, None)
            index = int(name.split("-")[1]) if index is None else index
            out[name] = plan_calls(s, {p: (index,) for p in freq}, freq, on_cpu)
        elif name == "request-dist":
            streams = {f"{p}@{r}" if r else p: (r,) for r in range(n_devices) for p in freq}
            out[name] = plan_calls(s, streams, {n: freq[n.split("@")[0]] for n in streams}, on_cpu)
        else:
            out[name] = plan_calls(s, {p: tuple(range(n_devices)) for p in freq}, freq, on_cpu)
    return out


def planned_calls(s: MeasureSettings, plans: Mapping[str, Any], derived: Sequence[str], on_cpu: bool) -> dict[str, int]:
    """Calls per plan that will be executed, from the plans themselves (their placements and frequencies)."""
    out = {}
    for name, p in plans.items():
        placements = getattr(p, "placements", None)
        if name in derived or placements is None or getattr(p, "replicas", None):
            continue
        used = {prog: tuple(sorted(set(pl.values()))) for prog, pl in placements.items()}
        out[name] = plan_calls(s, used, program_frequencies(p, s), on_cpu)
    return out


def announce(s: MeasureSettings, plans: Sequence[str], n_devices: int, on_cpu: bool) -> str:
    """What the run will do, in a few lines, before it starts: programs, devices, plans and the calls they make."""
    freq = s.composition.frequencies
    p_tok, batch, _ = s.shape
    shapes = (f"prefill 1x{p_tok} tokens, decode {batch} sequences" if p_tok is not None
              else f"one step of batch {batch}")
    layers = "all layers" if s.kept_layers is None else f"{s.kept_layers} layer(s)"
    calls = expected_calls(s, plans, n_devices, on_cpu)
    executed = ", ".join(calls)
    derived = ", ".join(p for p in plans if p in DERIVED)
    pipelined = (f" + {s.micro_batches} micro-batches x {1 + max(1, s.repeats // 2)} pipelined for programs off "
                 "the home device" if s.micro_batches >= 2 else "")
    conc = sum(concurrent_counts(dict(freq), s.concurrent_steps, 1 if on_cpu else MIN_CONCURRENT_CALLS).values())
    concurrent = (f" + {s.concurrent_steps} workload steps ({conc} calls) with the programs running at once on "
                  "plans that use several devices" if s.concurrent_steps else "")
    lines = [
        f"tessera bench --measure: {s.model} ({s.size}, {layers}) on {s.devices}",
        f"  1. build and compile {len(freq)} program(s) once: {', '.join(freq)} ({shapes})",
        f"  2. profile every launch on each of {n_devices} devices ({s.profile_repeats} timed runs each)",
        f"  3. plan {len(plans)} plans: {', '.join(plans)}" + (f" ({derived} derived, not run)" if derived else ""),
        f"  4. run, check against eager and time {executed}: per program 1 checked + {s.warmup} warm-up + "
        f"{s.repeats} timed calls{pipelined}{concurrent}",
        f"  about {sum(calls.values()):,} calls of the compiled programs in step 4"
        + (" (a streams plan's extra programs are compiled too)" if s.streams else "")
        + "; the time estimate follows once the programs are profiled"
        + (". CPU virtual devices run the Triton interpreter, a fraction of a second per call: expect minutes "
           "(--repeats 1 --warmup 0 --profile-repeats 1 --micro-batches 2 --concurrent-steps 2 --layers 1 is a "
           "short run)" if on_cpu else ""),
    ]
    return "\n".join(lines)


def remaining_line(calls_left: int, seconds_per_call: float, how: str) -> str:
    """``"about 7.5 min left: 1,012 calls at 0.44 s per call (measured while profiling)"``."""
    left = calls_left * seconds_per_call
    when = f"{left / 60:.1f} min" if left >= 90 else f"{left:.0f} s"
    return f"about {when} left: {calls_left:,} calls at {seconds_per_call:.3g} s per call ({how})"
