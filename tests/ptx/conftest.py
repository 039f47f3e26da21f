"""PTX tests run on CPU: Triton kernels are compiled to PTX (no GPU needed) in a subprocess when interpreting."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
