"""HuggingFace ``generate`` runs on the tessera backend: greedy decoding with a static KV cache, token for token.

Setup that works (transformers 5.2x, torch 2.13; no graph breaks, one expected recompile):

- ``model.forward = torch.compile(model.forward, backend=<tessera>, dynamic=False)``;
- ``generate(..., do_sample=False, cache_implementation="static", disable_compile=True)``. The static cache gives the
  decode step one shape for every step (the cache is a fixed ``max_length``-long buffer written in place at
  ``cache_position``; only tensor values change). ``disable_compile=True`` stops transformers from wrapping the
  forward in its own ``torch.compile`` (it does so by itself on CUDA when the cache is static).
- Exactly two graphs are compiled: the prefill (``[1, prompt]`` tokens) and the decode step (``[1, 1]``); Dynamo
  recompiles once between them (a shape change, as expected) and never again over the 31 decode steps.
"""

from __future__ import annotations

import copy

import pytest
import torch

from tests.conftest import TEST_DEVICE, RecordingBackend
from torch_tessera.lowering.program import BufferKind
from torch_tessera.models import llama_config

PROMPT, NEW_TOKENS = 8, 32


@pytest.mark.parametrize("options", [{}, {"devices": "cpu:0,cpu:1", "policy": "random", "seed": 3}],
                         ids=["single-device", "random-placement-two-virtual-devices"])
def test_generate_static_cache_equals_eager(options):
    from transformers import LlamaForCausalLM

    config = llama_config("tiny")
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval().to(TEST_DEVICE)
    eager = copy.deepcopy(model)
    ids = torch.randint(0, config.vocab_size, (1, PROMPT), device=TEST_DEVICE)
    kwargs = dict(max_new_tokens=NEW_TOKENS, do_sample=False, cache_implementation="static", disable_compile=True)

    torch._dynamo.reset()
    if options and TEST_DEVICE != "cpu":
        pytest.skip("CPU virtual devices only")
    backend = RecordingBackend(**options)  # the tessera backend, fallback="raise"
    model.forward = torch.compile(model.forward, backend=backend, dynamic=False)
    with torch.no_grad():
        want = eager.generate(ids, **kwargs)
        got = model.generate(ids, **kwargs)

    assert want.shape == (1, PROMPT + NEW_TOKENS)
    assert torch.equal(got, want), f"first difference at token {int((got != want).nonzero()[0, 1])}"

    # The tokens came from tessera's executors: one prefill graph run once, one decode graph run for every other token.
    assert len(backend.compiled) == 2, "expected exactly a prefill and a decode graph (no recompile storm)"
    prefill, decode = backend.executors
    assert (prefill.calls, decode.calls) == (1, NEW_TOKENS - 1)
    for ex in (prefill, decode):
        assert ex.launches_executed == ex.calls * len(ex.program.launches) > 0
    # The decode program writes the static KV cache in place: K and V of each layer, each holding every position
    # (transformers 5.24 sizes it max_length - 1: the last token is never attended to) of every KV head.
    caches = [b for b in decode.program.buffers_of(BufferKind.STATE) if b.dtype == torch.float32]
    head_dim = config.hidden_size // config.num_attention_heads
    per_position = config.num_key_value_heads * head_dim * 4  # bytes
    assert len(caches) == 2 * config.num_hidden_layers
    for b in caches:
        assert b.nbytes % per_position == 0
        assert PROMPT + NEW_TOKENS - 1 <= b.nbytes // per_position <= PROMPT + NEW_TOKENS


@pytest.mark.skipif(TEST_DEVICE != "cuda", reason="real CUDA graphs (tests/runtime/test_graphs_stand_in.py checks "
                                                  "the same on CPU with the stand-in graph)")
def test_generates_in_a_row_capture_once_on_the_gpu():
    """The default backend on one GPU: three ``generate`` calls, each with the new static cache transformers makes,
    give eager's tokens, and the prefill and decode programs are each captured as a CUDA graph once (a capture per
    ``generate`` cost 7 ms of host time per decode token at 32 layers; see docs/BENCHMARKS.md, session 14)."""
    from transformers import LlamaForCausalLM

    config = llama_config("tiny")
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval().to(TEST_DEVICE)
    eager = copy.deepcopy(model)
    kwargs = dict(max_new_tokens=5, min_new_tokens=5, do_sample=False, cache_implementation="static",
                  disable_compile=True)
    torch._dynamo.reset()
    backend = RecordingBackend()  # the defaults a user gets
    model.forward = torch.compile(model.forward, backend=backend, dynamic=False)
    with torch.no_grad():
        for g in range(3):
            ids = torch.randint(0, config.vocab_size, (1, PROMPT), device=TEST_DEVICE)
            want = eager.generate(ids, **kwargs)
            got = model.generate(ids, **kwargs)
            assert torch.equal(got, want), f"generate {g}: first difference at {int((got != want).nonzero()[0, 1])}"
    prefill, decode = (r.executor for r in backend.executors)
    assert (prefill.calls, decode.calls) == (3, 12)
    assert (prefill.captures, decode.captures) == (1, 1), "a generate captured its programs again"
