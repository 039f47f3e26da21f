"""The static-KV-cache wrapper computes what the cacheless model computes, and keeps its cache in buffers."""

from __future__ import annotations

import pytest
import torch

from torch_tessera.errors import UnsupportedModelError
from torch_tessera.models import build_module
from torch_tessera.static_cache import StaticCacheLM, build_static_cache_lm, has_kv_cache


@pytest.mark.parametrize("name", ["llama", "moe"])
def test_prefill_then_decode_through_the_cache_equals_the_full_forward(name):
    torch.manual_seed(0)
    full = build_module(name, "tiny")
    batch, prompt, steps, context = 2, 6, 4, 16
    cached = StaticCacheLM(build_module(name, "tiny").model, batch, context).eval()
    ids = torch.randint(0, 256, (batch, prompt + steps))
    with torch.no_grad():
        want = full(ids)
        pos = torch.arange(prompt).expand(batch, prompt)
        got = [cached(ids[:, :prompt], pos)]
        for t in range(prompt, prompt + steps):
            got.append(cached(ids[:, t:t + 1], torch.full((batch, 1), t)))
    torch.testing.assert_close(torch.cat(got, dim=1), want, rtol=1e-4, atol=1e-4)
    # the cache is in the module's buffers: the written positions hold K/V, the rest is still zero
    keys = cached.kv_key_0
    assert keys.shape[0] == batch and keys.shape[2] == context
    assert keys[:, :, :prompt + steps].abs().sum() > 0 and keys[:, :, prompt + steps:].abs().sum() == 0


def test_inputs_take_the_last_positions_and_bad_arguments_are_refused():
    module, (ids, pos) = build_static_cache_lm("llama", "tiny", 3, 1, 20)
    assert ids.shape == (3, 1) and pos.tolist() == [[19]] * 3
    assert module.kv_value_1.shape[:3] == (3, module.lm.config.num_key_value_heads, 20)
    assert has_kv_cache("moe") and not has_kv_cache("mamba") and not has_kv_cache("dit")
    with pytest.raises(UnsupportedModelError, match="mamba"):
        build_static_cache_lm("mamba", "tiny", 1, 1, 8, device="meta")
    with pytest.raises(ValueError, match="tokens=9"):
        build_static_cache_lm("llama", "tiny", 1, 9, 8, device="meta")
