"""The SSM-state wrapper computes what ``transformers``' own cache computes, and keeps the state in buffers.

These tests run against whichever ``transformers`` is installed, through its cache interface (``cache=`` from 5.2x,
``cache_params=`` in 5.17). Run on 2026-11-30 with transformers 5.24.0 (the default install) and 5.17.0 (the GPU
machine's, installed apart with ``pip install --no-deps --target`` and put first on ``PYTHONPATH``): all pass on both.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import RecordingBackend
from torch_tessera.errors import UnsupportedModelError
from torch_tessera.models import build_module, mamba_config
from torch_tessera.ssm_state import SSMStateLM, build_ssm_state_lm, has_ssm_state


def test_prefill_then_decode_through_the_buffers_equals_transformers_cache():
    torch.manual_seed(0)
    lm = build_module("mamba", "tiny").model
    batch, prompt, steps = 2, 6, 3
    wrapped = SSMStateLM(lm, batch).eval()
    ids = torch.randint(0, 256, (batch, prompt + steps))
    with torch.no_grad():
        out = lm(input_ids=ids[:, :prompt], use_cache=True)
        cache = out.cache if hasattr(out, "cache") else out.cache_params
        want = [out.logits]
        got = [wrapped(ids[:, :prompt])]
        for t in range(prompt, prompt + steps):
            want.append(lm(input_ids=ids[:, t:t + 1], use_cache=True, **{wrapped._cache_kwarg: cache}).logits)
            got.append(wrapped(ids[:, t:t + 1]))
    torch.testing.assert_close(torch.cat(got, dim=1), torch.cat(want, dim=1), rtol=1e-5, atol=1e-5)
    # the state lives in the module's buffers, per layer: conv window (model dtype) and SSM state (fp32)
    conv, ssm = wrapped.conv_state_1, wrapped.ssm_state_1
    config = lm.config
    assert conv.shape == (batch, config.intermediate_size, config.conv_kernel) and conv.abs().sum() > 0
    assert ssm.shape == (batch, config.intermediate_size, config.state_size) and ssm.dtype == torch.float32


def test_compiled_prefill_then_decode_equals_transformers_cache():
    """The wrapper compiled with tessera (3 layers, two devices, prefill then decode steps continuing from the state
    the compiled prefill left in the buffers) computes what eager ``transformers`` computes with its own cache."""
    from transformers import MambaForCausalLM

    torch.manual_seed(0)
    config = mamba_config("tiny")
    config.num_hidden_layers = 3
    lm = MambaForCausalLM(config).eval()
    batch, prompt, steps = 2, 4, 3
    wrapped = SSMStateLM(lm, batch).eval()
    torch._dynamo.reset()
    backend = RecordingBackend(devices="cpu:0,cpu:1", policy="layer")
    compiled = torch.compile(wrapped, backend=backend, dynamic=False)
    ids = torch.randint(0, config.vocab_size, (batch, prompt + steps))
    with torch.no_grad():
        out = lm(input_ids=ids[:, :prompt], use_cache=True)
        cache = out.cache if hasattr(out, "cache") else out.cache_params
        want, got = [out.logits], [compiled(ids[:, :prompt])]
        for t in range(prompt, prompt + steps):
            want.append(lm(input_ids=ids[:, t:t + 1], use_cache=True, **{wrapped._cache_kwarg: cache}).logits)
            got.append(compiled(ids[:, t:t + 1]))  # a view shifted into ids: bound at another offset
    torch.testing.assert_close(torch.cat(got, dim=1), torch.cat(want, dim=1), rtol=1e-5, atol=1e-5)
    assert len(backend.executors) == 2  # one program per length: the prefill and the decode step


def test_a_new_prefill_starts_from_zero_state():
    wrapped = build_ssm_state_lm("mamba", "tiny", 1)
    ids = torch.randint(0, 256, (1, 5))
    with torch.no_grad():
        first = wrapped(ids)
        wrapped(ids[:, :1])  # a decode step changes the state...
        again = wrapped(ids)  # ...which the next prefill does not read
    torch.testing.assert_close(first, again)


def test_the_older_transformers_interface_reads_the_same_buffers():
    """transformers 5.17's mixer asks ``has_previous_state`` and reads ``layers[i].conv_states[0]`` (run end to end
    by the tests above when 5.17 is installed)."""
    wrapped = build_ssm_state_lm("mamba", "tiny", 2)
    cache = wrapped.cache
    cache.decoding = True
    assert cache.has_previous_state(0) and not cache.layers[1].record_past
    assert cache.layers[1].conv_states[0] is wrapped.conv_state_1
    assert cache.layers[0].recurrent_states[0] is wrapped.ssm_state_0
    cache.decoding = False
    assert not cache.has_previous_state(0) and cache.get_conv_state(0) is None


def test_only_ssm_families_are_wrapped():
    assert has_ssm_state("mamba") and not has_ssm_state("llama")
    with pytest.raises(UnsupportedModelError, match="llama"):
        build_ssm_state_lm("llama", "tiny", 1, device="meta")
