"""torch_tessera.hf.compile_for_generate: prompts of several lengths in one bucket compile one prefill program."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.conftest import TEST_DEVICE, RecordingBackend
from torch_tessera.errors import ConfigError
from torch_tessera.hf import compile_for_generate
from torch_tessera.models import llama_config

NEW_TOKENS = 6


def _tiny_llama():
    from transformers import LlamaForCausalLM

    config = llama_config("tiny")
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval().to(TEST_DEVICE)


def test_three_prompt_lengths_in_one_bucket_compile_one_prefill_and_equal_eager():
    model = _tiny_llama()
    eager = copy.deepcopy(model)
    vocab = model.config.vocab_size
    torch._dynamo.reset()
    backend = RecordingBackend()  # tessera, fallback="raise"
    gen = compile_for_generate(model, buckets=(4, 8), backend=backend)
    kwargs = dict(max_new_tokens=NEW_TOKENS, do_sample=False)
    torch.manual_seed(1)
    with torch.no_grad():
        for length in (5, 6, 7):
            ids = torch.randint(1, vocab, (1, length), device=TEST_DEVICE)
            got = gen.generate(ids, **kwargs)
            want = eager.generate(ids, **kwargs, cache_implementation="static", disable_compile=True)
            assert got.shape == want.shape == (1, length + NEW_TOKENS)
            assert torch.equal(got, want), (length, got, want)
    assert gen.shapes == [(1, 8, NEW_TOKENS)] * 3
    assert len(backend.compiled) == 2, "one prefill and one decode program for the whole bucket"
    import torch_tessera

    assert len(torch_tessera.explain(gen)) == len(torch_tessera.explain(model)) == 2  # the generator explains its model
    prefill, decode = backend.executors
    token_inputs = [[tuple(a.size) for a in ex.program.inputs if getattr(a, "dtype", None) == torch.int64]
                    for ex in (prefill, decode)]
    assert (1, 8) in token_inputs[0] and (1, 1) in token_inputs[1], token_inputs  # the padded prompt; one token
    assert (prefill.calls, decode.calls) == (3, 3 * (NEW_TOKENS - 1))


def test_bad_buckets_and_too_long_prompt():
    model = _tiny_llama()
    with pytest.raises(ConfigError, match=r"buckets=\(0, 8\) must be positive token counts"):
        compile_for_generate(model, buckets=(0, 8))
    with pytest.raises(ConfigError, match="unknown tessera option 'devcies'"):
        compile_for_generate(model, options={"devcies": "cpu:0"})
    gen = compile_for_generate(model, buckets=(4,), backend=RecordingBackend())
    with pytest.raises(ConfigError, match="a prompt of 5 tokens is longer than the largest bucket 4"):
        gen.generate(torch.ones(1, 5, dtype=torch.long))


def test_hf_is_reachable_after_import_torch_tessera_alone():
    """The README's ``torch_tessera.hf.compile_for_generate`` works after ``import torch_tessera`` alone (a fresh
    interpreter), and that import does not pull in transformers."""
    import subprocess
    import sys

    code = ("import sys, torch_tessera; assert 'transformers' not in sys.modules; "
            "print(torch_tessera.hf.compile_for_generate.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "compile_for_generate", out.stderr[-2000:]
