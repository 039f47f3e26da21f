"""The VLM with a fixed image layout: same logits as the registry model, and it lowers without weights."""

from __future__ import annotations

import pytest
import torch

from torch_tessera.compat.torch_fake import constant_values, drop_scalar_reads
from torch_tessera.errors import ConfigError, LoweringError
from torch_tessera.fixed_layout import FixedImageLayout, TextTokensOnly, min_prompt_tokens, planning_model
from torch_tessera.lowering.fake import lower_without_weights
from torch_tessera.lowering.program import ExternLaunch
from torch_tessera.models import build_model, get_model


def test_fixed_layout_computes_what_the_registry_model_computes():
    module, layout = build_model("qwen2-vl", "tiny")
    ids, pixels, grid, types = get_model("qwen2-vl").example_inputs("tiny", seed=3)  # other ids and pixels
    assert not torch.equal(ids, layout[0]) and torch.equal(types, layout[3]) and torch.equal(grid, layout[2])
    fixed = FixedImageLayout(module, layout[2], layout[3], layout[0])
    with torch.no_grad():
        torch.testing.assert_close(fixed(ids, pixels), module(ids, pixels, grid, types), rtol=0, atol=0)
        with pytest.raises(ValueError, match="do not match the fixed layout"):
            fixed(ids[:, :-1], pixels)


def test_planning_model_wraps_only_the_vlm():
    vlm, inputs = planning_model("qwen2-vl", "tiny", 2, None, device="cpu")
    assert isinstance(vlm, FixedImageLayout) and [tuple(x.shape) for x in inputs] == [(2, 12), (32, 96)]
    decode, (text,) = planning_model("qwen2-vl", "tiny", 4, 1, device="cpu")
    assert isinstance(decode, TextTokensOnly) and text.shape == (4, 1) and int(text.max()) < 250
    with torch.no_grad():
        assert decode(text).shape == (4, 1, 256)
    with pytest.raises(ConfigError, match="at least 7 tokens .* Fix: --prefill-tokens 7"):
        planning_model("qwen2-vl", "tiny", 1, 6)  # too short for the image: refused, not planned without it
    assert min_prompt_tokens("qwen2-vl", "full") == 327 and min_prompt_tokens("llama", "full") == 1
    llama, (ids,) = planning_model("llama", "tiny", 1, 16)
    assert type(llama).__name__ == "CausalLMLogits" and ids.device.type == "meta" and ids.shape == (1, 16)


def test_the_vlm_lowers_without_weights_only_with_its_layout_fixed():
    def registry():
        spec = get_model("qwen2-vl")
        from torch_tessera.models import build_module

        return build_module("qwen2-vl", "tiny", device="meta"), spec.example_inputs("tiny", device="meta")

    with pytest.raises(LoweringError, match="torch.export failed on the fake model"):
        lower_without_weights(registry)
    prefill = lower_without_weights(lambda: planning_model("qwen2-vl", "tiny", 1, None)).program
    decode = lower_without_weights(lambda: planning_model("qwen2-vl", "tiny", 4, 1)).program
    assert len(prefill.launches) > len(decode.launches) > 0
    extern = " ".join(launch.op for launch in prefill.launches if isinstance(launch, ExternLaunch))
    assert "convolution" in extern and "scaled_dot_product" in extern  # the patch embedding; vision attention
    assert not any("convolution" in launch.op for launch in decode.launches if isinstance(launch, ExternLaunch))


def test_constant_values_is_scoped():
    from torch._subclasses import fake_tensor

    before = fake_tensor.CONSTANT_NUMEL_LIMIT
    with pytest.raises(RuntimeError, match="inside"):
        with constant_values(64):
            assert fake_tensor.CONSTANT_NUMEL_LIMIT == max(before, 64)
            raise RuntimeError("inside")
    assert fake_tensor.CONSTANT_NUMEL_LIMIT == before
    with pytest.raises(ValueError, match="max_numel"):
        with constant_values(0):
            pass


def test_drop_scalar_reads_leaves_a_graph_without_reads_alone():
    gm = torch.fx.symbolic_trace(torch.nn.Linear(4, 4))
    code = gm.code
    assert drop_scalar_reads(gm) == 0 and gm.code == code
