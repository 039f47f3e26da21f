"""How far bf16 results of a registry model are from an fp32 reference, per way of running it: eager PyTorch,
Inductor, and tessera's home placement (one device, Inductor's kernels). It tells whether a large difference between
tessera and eager (e.g. the cut diagnosis's "home placement against eager" for Mamba) is tessera's or bf16's own.

For each model (``--model``, ``--layers`` kept, inputs of ``--shape`` ``model=BATCHxSEQ`` or the registry's): the
model is built once in fp32 (seeded random weights) and copied to bf16; the fp32 eager output is the reference. Each
bf16 way's first output tensor is compared with it and with eager bf16 as ``|a - b| / |b|`` (L2 norms, in fp32).
Writes ``DIR/numerics.json`` and prints a table.

    python3 bench/gpu_numerics_check.py --out DIR --model mamba,llama --layers 8 --shape mamba=8x16
    python bench/gpu_numerics_check.py --out /tmp/nc --model mamba --size tiny --layers 2 --device cpu  # smoke run
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_cut_diagnose import rel_error as rel, shape_of  # noqa: E402 - the diagnosis bench's comparison and --shape


def check(name: str, args: argparse.Namespace) -> dict:
    """The table row of one model: relative errors of each bf16 way against fp32 eager and against bf16 eager."""
    from torch_tessera.measure.programs import cut_layers
    from torch_tessera.models import build_module, get_model

    spec = get_model(name)
    batch, seq = shape_of(name, args)
    model32 = build_module(name, args.size, device=args.device, dtype=torch.float32)
    if args.layers and hasattr(model32, "model"):
        cut_layers(model32.model, spec.family, args.layers)
    low = torch.bfloat16
    model16 = copy.deepcopy(model32).to(low)
    inputs32 = spec.example_inputs(args.size, batch, seq, device=args.device, dtype=torch.float32, seed=0)
    inputs16 = [x.to(low) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs32]
    row: dict = {"model": name, "layers": args.layers, "shape": [batch, seq]}
    with torch.no_grad():
        ref = model32(*inputs32)
        eager16 = model16(*inputs16)
        row["eager_bf16_vs_fp32"] = rel(eager16, ref)
        ways = {"inductor": lambda: torch.compile(model16, dynamic=False),
                "tessera_home": lambda: torch.compile(model16, backend="tessera", dynamic=False,
                                                      options={"fallback": "raise"})}
        for way, make in ways.items():
            torch._dynamo.reset()
            try:
                out = make()(*inputs16)
                row[f"{way}_vs_fp32"] = rel(out, ref)
                row[f"{way}_vs_eager_bf16"] = rel(out, eager16)
            except Exception as e:  # noqa: BLE001 - a failed way is a result; the others still run
                row[f"{way}_error"] = f"{type(e).__name__}: {str(e)[:500]}"
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--model", default="mamba,llama,dit", help="comma-separated registry models")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--shape", default="mamba=8x16", help="model=BATCHxSEQ, comma-separated")
    ap.add_argument("--size", default="full", choices=("tiny", "full"))
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in [m for m in args.model.split(",") if m]:
        rows.append(check(name, args))
        (args.out / "numerics.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                            "torch": torch.__version__, "rows": rows}, indent=1))
        r = rows[-1]
        f = lambda k: f"{r[k]:.3e}" if k in r else r.get(k.rsplit("_vs", 1)[0] + "_error", "-")[:60]  # noqa: E731
        print(f"{name}: eager bf16 vs fp32 {f('eager_bf16_vs_fp32')}; inductor vs fp32 {f('inductor_vs_fp32')}, "
              f"vs eager bf16 {f('inductor_vs_eager_bf16')}; tessera home vs fp32 {f('tessera_home_vs_fp32')}, "
              f"vs eager bf16 {f('tessera_home_vs_eager_bf16')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
