"""Subprocess entry of :mod:`torch_tessera.ptx.compile`: JSON list of compile requests on stdin, one JSON line of
results (``{"ptx": ...}`` or ``{"error": ...}`` per request) on stdout. Run without ``TRITON_INTERPRET``."""

from __future__ import annotations

import json
import sys
import warnings


def main() -> int:
    requests = json.load(sys.stdin)
    warnings.simplefilter("ignore")  # the kernel modules warn about the missing CPU driver; irrelevant to PTX
    from torch_tessera.ptx.compile import compile_here

    results = compile_here(requests)
    sys.stdout.write("\n" + json.dumps(results) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
