"""Quick GPU check of the explicit schedule captured as ONE CUDA graph (:mod:`torch_tessera.runtime.captured`), one
stage at a time.

A tiny Llama (``--size tiny``) is compiled on ``--devices`` with everything on the home device (checked against eager
PyTorch), its largest program gets a random placement (``--seed``) and the modulo scheduler's schedule over
``--micro-batches`` micro-batches; :meth:`~torch_tessera.runtime.placed.PlacedExecutor.replay` with ``captured=True``
then runs it: the capturing call, and ``--replays`` graph replays with fresh inputs. ``torch.cuda.synchronize()``
follows every stage (build, references, bind, warm-up, capture, each replay) and a line names the stage reached, so
the last line before a CUDA error says which stage it came from. Each call's outputs are compared
(``torch.testing.assert_close``) with the home placement's single-call run of the same inputs and with the eager
(host-issued) replay of the same schedule.

Usage (one H200 split in two green-context partitions; well under a minute)::

    python bench/gpu_captured_check.py --out DIR
    python bench/gpu_captured_check.py --out DIR --devices cpu:0,cpu:1   # CPU dry run: the eager replay only

Writes ``DIR/captured_check.log`` (every stage line and any traceback, flushed as it goes). Exit status 0 when every
comparison passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import faulthandler
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_cut_diagnose import build, micro_batches  # noqa: E402 - the diagnosis bench's model builder

_LOG = None
_T0 = time.perf_counter()


def say(msg: str) -> None:
    """A stage line on stdout and in the log, flushed at once."""
    line = f"[{time.perf_counter() - _T0:7.2f} s] {msg}"
    print(line, flush=True)
    if _LOG is not None:
        _LOG.write(line + "\n")
        _LOG.flush()


def reached(stage: str, on_cuda: bool) -> None:
    """Synchronize (a CUDA error of the work queued so far surfaces here) and say the stage completed."""
    if on_cuda:
        torch.cuda.synchronize()
    say(f"stage ok: {stage}")


def compare(got: list[list], want: list[list], what: str) -> int:
    """``assert_close`` of every tensor output; the failures, each said. Returns their number."""
    bad = 0
    for k, (g, w) in enumerate(zip(got, want)):
        for j, (gg, ww) in enumerate(zip(g, w)):
            if not isinstance(ww, torch.Tensor):
                continue
            try:
                torch.testing.assert_close(gg, ww)
            except AssertionError as e:
                bad += 1
                say(f"MISMATCH {what}, micro-batch {k}, output {j}: {str(e).splitlines()[0]}")
    return bad


def check(args) -> int:
    from torch_tessera.runtime.runner import random_placement
    from torch_tessera.scheduler.modulo import build_pipelined_schedule

    on_cuda = args.devices.startswith("cuda")
    device = "cuda" if on_cuda else "cpu"
    say(f"build: llama ({args.size}) on {args.devices}, torch {torch.__version__}")
    spec, runner, inputs, template, home_error = build("llama", args)
    reached(f"build (home placement against eager: relative error {home_error:.2e})", on_cuda)
    M = args.micro_batches
    calls = [micro_batches(spec, args, template, inputs, M, device, seed=1000 + 10 * c) for c in range(args.replays + 1)]
    runner.set_placement({i: 0 for i in sorted(runner.dag.graph.nodes)})
    with torch.no_grad():
        want = [[[o.clone() if isinstance(o, torch.Tensor) else o for o in runner.executor.run(list(b))] for b in bs]
                for bs in calls]
    reached(f"references: home placement, {len(calls)} calls x {M} micro-batches", on_cuda)
    placement = random_placement(runner.dag, len(runner.devices), args.seed)
    runner.set_placement(placement)
    ex = runner.executor
    sched = build_pipelined_schedule(runner.dag, placement, M, domains=ex.domains, devices=len(ex.devices))
    say(f"schedule: {len(runner.program.launches)} launches, placement seed {args.seed} "
        f"({sum(1 for v in placement.values() if v)} off home), {len(sched.cut_edges)} cut edges, "
        f"{sched.num_waits} waits")
    bad = 0
    with torch.no_grad():
        eager = ex.replay(sched, captured=False)
        for c, bs in enumerate(calls):
            bad += compare(eager.run(bs), want[c], f"eager replay, call {c}")
        reached("eager replay of the schedule, every call", on_cuda)
        if not on_cuda:
            say("CPU devices: nothing can be captured; the eager replay alone was checked (plumbing only)")
            return bad
        cap = ex.replay(sched, captured=True)
        cap.on_step = lambda stage: reached(f"captured: {stage}", True)
        say("captured: first call (bind, warm-up, capture)")
        got = cap.run(calls[0])
        bad += compare(got, want[0], "captured, capturing call")
        for c in range(1, len(calls)):
            say(f"captured: replay {c} with fresh inputs")
            bad += compare(cap.run(calls[c]), want[c], f"captured, replay {c}")
        eager_again = eager.run(calls[-1])
        bad += compare(cap.run(calls[-1]), eager_again, "captured against eager replay, last inputs")
        reached(f"captured: {cap.captures} capture(s), {cap.replays} replays, fallback {cap.fallback}", True)
        if cap.fallback or cap.captures != 1:
            say(f"FAILED: expected exactly one capture and no fallback, got {cap.captures} / {cap.fallback}")
            bad += 1
    return bad


def main(argv=None) -> int:
    global _LOG
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="directory for captured_check.log")
    ap.add_argument("--devices", default="cuda:0@104sm,cuda:0@24sm")
    ap.add_argument("--size", default="tiny", choices=("tiny", "full"))
    ap.add_argument("--layers", type=int, default=0, help="decoder layers kept (0: all of the size's)")
    ap.add_argument("--micro-batches", type=int, default=2)
    ap.add_argument("--replays", type=int, default=3, help="graph replays after the capturing call")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random placement")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    _LOG = open(args.out / "captured_check.log", "w")
    faulthandler.enable(file=_LOG, all_threads=True)
    try:
        bad = check(args)
    except Exception:  # noqa: BLE001 - a diagnosis: the traceback is the result
        say("FAILED with an exception after the last 'stage ok' line above:\n" + traceback.format_exc())
        return 1
    say("CHECK OK: every output equal" if not bad else f"CHECK FAILED: {bad} mismatches")
    return 0 if not bad else 1


if __name__ == "__main__":
    raise SystemExit(main())
