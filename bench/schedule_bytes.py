"""Bytes a placement's schedule copies per call, by purpose (cut, input, gather), for a registry model's programs.

Usage: ``python bench/schedule_bytes.py [MODEL] [DEVICES] [POLICY,...]`` (defaults: llama, sim:a100,sim:l40s,
af,throughput). Lowers the full-size model without weights (as ``tessera plan`` does), plans each policy from the
cost model, builds the runtime's schedule (:func:`torch_tessera.runtime.schedule.build_schedule`) and sums its copy
steps, twice: with the STATE (KV cache) on the caller's device 0 (``state at home``) and kept on the devices that own
it (``state on owners``: :func:`~torch_tessera.runtime.schedule.state_owners`, what the measured bench does); no
device is needed.
"""

from __future__ import annotations

import collections
import sys

from torch_tessera.backend.workload import model_workload
from torch_tessera.lowering.program import BufferKind
from torch_tessera.target.devices import parse_devices
from torch_tessera.runtime.schedule import CopyStep, build_schedule, state_owners
from torch_tessera.scheduler import plan


def main(argv: list[str]) -> None:
    model = argv[0] if argv else "llama"
    specs = parse_devices(argv[1] if len(argv) > 1 else "sim:a100,sim:l40s")
    policies = (argv[2] if len(argv) > 2 else "af,throughput").split(",")
    mw = model_workload(model, specs, size="full")
    for policy in policies:
        p = plan(mw.workload, None, mw.topology, policy=policy, cache_dir=False)
        for prog, wp in zip(mw.programs, mw.workload.programs):
            placement = p.placements[wp.name]
            owners = {n: d for n, d in state_owners(prog, wp.dag, placement, 0).items() if d != 0}
            state = sum(b.nbytes for b in prog.buffers.values() if b.kind == BufferKind.STATE)
            for where, homes in (("state at home", {}), ("state on owners", owners)):
                sched = build_schedule(prog, wp.dag, placement, 0, state_homes=homes)
                nbytes, count = collections.Counter(), collections.Counter()
                for st in sched.steps:
                    if isinstance(st, CopyStep):
                        kind = "state " if prog.buffers[st.buffer].kind == BufferKind.STATE else ""
                        nbytes[kind + st.purpose] += st.nbytes
                        count[kind + st.purpose] += 1
                print(f"{policy} {wp.name}, {where}: " + ", ".join(
                    f"{k} {v / 1e9:.3f} GB in {count[k]} copies" for k, v in sorted(nbytes.items()))
                    + f"; STATE {state / 1e9:.2f} GB")

if __name__ == "__main__":
    main(sys.argv[1:])
