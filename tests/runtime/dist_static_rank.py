"""One gloo rank of ``test_static_inputs.test_two_gloo_ranks_with_an_inference_tensor_static_input``.

Run as ``python -m tests.runtime.dist_static_rank OUT.json`` with torchrun's environment (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``); every launch of the model is placed on rank 1, so rank 1 reads the static input
(the module's ``table`` buffer, passed as an inference tensor). Two executors, one after the other:

1. ``weights="send", static_inputs="copy"``: two calls, the table changed in place (under ``torch.inference_mode``)
   between them; rank 0 records each call's largest difference from eager and the byte ranges it sent.
2. ``weights="send"`` (``static_inputs="place"``): the first call; each rank records the error it raised.
"""

from __future__ import annotations

import json
import sys

import torch

from torch_tessera.errors import TesseraError
from torch_tessera.runtime.distributed import DistributedExecutor, init_distributed


def main(out: str) -> None:
    from tests.runtime.test_pipelining import _compile
    from tests.runtime.test_static_inputs import WithTable, _on_device_1

    ctx = init_distributed("cpu", timeout_s=3.0)
    torch.manual_seed(0)
    model = WithTable().eval()
    x = torch.randn(4, 16)
    runner, args = _compile(model, (x,))
    x_at, table_at = [a is x for a in args].index(True), [a is model.table for a in args].index(True)
    with torch.inference_mode():
        table = torch.linspace(0, 1, 16)

    def inputs(xs: torch.Tensor) -> list | None:
        if ctx.rank != 0:
            return None  # weights="send": the home rank sends everything
        got = list(args)
        got[x_at], got[table_at] = xs, table
        return got

    program, dag, placement = runner.program, runner.dag, _on_device_1(runner)
    result: dict = {"rank": ctx.rank, "copy_diffs": []}
    copy = DistributedExecutor(program, dag, placement, ctx, weights="send", static_inputs="copy")
    for call in range(2):
        if call:
            with torch.inference_mode():
                table.add_(1)
        xs = torch.randn(4, 16)
        with torch.no_grad():
            got = copy.run(inputs(xs))
            if got is not None:
                y = [o for o in got if isinstance(o, torch.Tensor)][0]
                result["copy_diffs"].append(float((y - (model.lin(xs) * table + 1)).abs().max()))
    result["copy_ranges"] = dict(copy.stats.ranges)
    place = DistributedExecutor(program, dag, placement, ctx, weights="send")
    try:
        with torch.no_grad():
            place.run(inputs(x))
        result["place_error"] = None
    except TesseraError as e:
        result["place_error"] = f"{type(e).__name__}: {e}"
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])
