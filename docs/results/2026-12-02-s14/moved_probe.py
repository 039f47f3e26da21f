"""Issue 24 probe (one H200): which inputs a tessera-compiled HF generate finds moved at its next generate (the log
line of a re-capture), for a 2-layer Llama-3.1-8B-shaped model, three generate calls."""
import logging
import sys

import torch

sys.path.insert(0, "bench")
from gpu_backend_default import build_llama  # noqa: E402

import torch_tessera  # noqa: E402,F401

logging.basicConfig(level=logging.WARNING)
logging.getLogger("torch_tessera.runtime.graphs").setLevel(logging.INFO)
model, ids = build_llama("full", 2, 4, 16, "cuda")
model.forward = torch.compile(model.forward, backend="tessera", dynamic=False)
kw = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False, cache_implementation="static", disable_compile=True)
with torch.no_grad():
    for g in range(3):
        model.generate(ids, **kw)
        print("generate", g, "done", flush=True)
