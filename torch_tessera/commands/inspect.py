"""``tessera inspect``: lower a registry model and print its kernel program."""

from __future__ import annotations

import argparse

import torch

from torch_tessera import jsonout

HELP = "lower a model with the tessera backend and print its kernel program"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="llama", help="registry model name (default: llama)")
    parser.add_argument("--size", default="tiny", choices=["tiny"], help="model size (tiny runs on CPU)")
    parser.add_argument("--limit", type=int, default=None, help="print at most this many launches")
    parser.add_argument("--json", dest="json_path", default=None, help="also write the program as JSON here")


def run(args: argparse.Namespace) -> int:
    from torch_tessera.backend import tessera_backend
    from torch_tessera.lowering.serialize import program_to_json
    from torch_tessera.lowering.report import format_program
    from torch_tessera.models import build_model

    model, inputs = build_model(args.model, args.size)
    compiled_fns: list = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        fn = tessera_backend(gm, example_inputs, options={"fallback": "raise"})
        compiled_fns.append(fn)
        return fn

    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(model, backend=backend, dynamic=False)(*inputs)
        ref = model(*inputs)
    torch.testing.assert_close(out, ref)
    programs = [e.program for fn in compiled_fns for e in fn.tessera_executors]
    for i, program in enumerate(programs):
        if len(programs) > 1:
            print(f"== graph {i}")
        print(format_program(program, args.limit))
    print(f"\noutput equals eager PyTorch (torch.testing.assert_close) for model {args.model!r} ({args.size})")
    if args.json_path:
        with open(args.json_path, "w") as f:
            jsonout.dump([program_to_json(p) for p in programs], f, indent=1)  # each loads with load_program
        print(f"program written to {args.json_path}")
    return 0
