"""The registry's vision-language model with its image layout fixed, so that it lowers without weights.

Qwen2-VL's forward decides shapes from the values of its inputs: the vision tower splits its attention by
``image_grid_thw`` (``.tolist()`` of the images' patch counts) and the language model's 3-D rotary positions come from
walking ``mm_token_type_ids`` in Python. ``torch.export`` on FakeTensors has no values, so that forward cannot be
exported as it is (``GuardOnDataDependentSymNode``). For planning, the layout is fixed (which tokens are image tokens,
each image's grid) while the token ids and pixels stay inputs:

- :class:`FixedImageLayout`: ``forward(input_ids, pixel_values)``; the grid is a constant made inside the forward,
  whose values FakeTensors keep (:func:`torch_tessera.compat.torch_fake.constant_values`), and the 3-D positions are
  computed once, on the real layout, by the model's own ``get_rope_index``.
- :class:`TextTokensOnly`: a decode step's forward, text tokens only (``forward(input_ids)``), no image.

:func:`planning_model` gives ``(module, inputs)`` for any registry model: these wrappers for ``qwen2-vl``, the
registry's own module and inputs for every other model. The wrapped forward computes what the registry model
computes on the same layout (``tests/models/test_fixed_layout.py``).
"""

from __future__ import annotations

import inspect
from typing import Any, Sequence

import torch

from torch_tessera.compat.torch_fake import constant_values
from torch_tessera.errors import ConfigError
from torch_tessera.models import QWEN2_VL_IMAGE, QWEN2_VL_TOKENS, build_module, get_model

#: Registry models whose forward reads the values of layout inputs (planned through this module's wrappers).
FIXED_LAYOUT_MODELS = ("qwen2-vl",)


class FixedImageLayout(torch.nn.Module):
    """A :class:`~torch_tessera.models.VisionLanguageLogits` whose image grids and token layout are constants.

    ``forward(input_ids, pixel_values)`` -> logits ``[batch, seq, vocab]``, as the wrapped model's
    ``forward(input_ids, pixel_values, image_grid_thw, mm_token_type_ids)`` with this layout.

    Args:
        model: the registry's ``VisionLanguageLogits`` (its ``.model`` is the ``transformers`` model).
        image_grid_thw: ``[images, 3]`` int64, each image's (frames, rows, columns) of patches (real values).
        mm_token_type_ids: ``[batch, seq]`` int (real values): 1 marks an image token.
        input_ids: ``[batch, seq]`` int64 (real values) of the layout; only the positions of its image, vision start
            and vision end tokens matter to the rotary positions.
    """

    def __init__(self, model: torch.nn.Module, image_grid_thw: torch.Tensor, mm_token_type_ids: torch.Tensor,
                 input_ids: torch.Tensor) -> None:
        super().__init__()
        self.model = model
        self.grid = [list(map(int, row)) for row in image_grid_thw.tolist()]
        self.layout = tuple(input_ids.shape)
        inner = model.model.model
        kwargs: dict[str, Any] = {"image_grid_thw": image_grid_thw.cpu()}
        if "mm_token_type_ids" in inspect.signature(inner.get_rope_index).parameters:
            kwargs["mm_token_type_ids"] = mm_token_type_ids.cpu()
        positions, _ = inner.get_rope_index(input_ids.cpu(), **kwargs)
        self.register_buffer("position_ids", positions.to(input_ids.device), persistent=False)

    def forward(self, input_ids: torch.Tensor, pixel_values: torch.Tensor) -> torch.Tensor:
        if tuple(input_ids.shape) != self.layout:
            raise ValueError(f"input_ids {tuple(input_ids.shape)} do not match the fixed layout {self.layout}")
        # The grid's .tolist() values decide the vision tower's split sizes: keep them through the trace.
        with constant_values(max(3 * len(self.grid) + 1, 2)):
            grid = torch.tensor(self.grid, dtype=torch.int64, device=input_ids.device)
            return self.model.model(input_ids=input_ids, pixel_values=pixel_values, image_grid_thw=grid,
                                    position_ids=self.position_ids, use_cache=False).logits


class TextTokensOnly(torch.nn.Module):
    """A vision-language model's decode-step forward: ``forward(input_ids [batch, seq])`` -> logits, no image
    (the language model with its default positions; no KV cache)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.model(input_ids=input_ids, use_cache=False).logits


def min_prompt_tokens(name: str, size: str) -> int:
    """The shortest prompt (tokens) registry model ``name`` plans at ``size``: one image's tokens plus 3 text tokens
    for ``qwen2-vl`` (327 full, 7 tiny), 1 for every other model."""
    if name not in FIXED_LAYOUT_MODELS:
        return 1
    side, patch = QWEN2_VL_IMAGE[size]
    return (side // patch // 2) ** 2 + 3


def planning_model(name: str, size: str, batch: int, seq: int | None, *, device: str | torch.device = "meta",
                   dtype: torch.dtype | None = None) -> tuple[torch.nn.Module, Sequence[torch.Tensor]]:
    """``(module, inputs)`` of registry model ``name`` for lowering without weights.

    Args:
        name: registry name.
        size: ``"tiny"`` or ``"full"``.
        batch: sequences (images, rows) per forward.
        seq: tokens per sequence (``None``: the registry's default). For ``qwen2-vl`` 1 (a decode step's token)
            gives :class:`TextTokensOnly`; otherwise :class:`FixedImageLayout` over the registry's layout (one image
            per sequence), which needs at least :func:`min_prompt_tokens`.
        device: where the module and inputs go (``"meta"`` for planning; ``"cpu"`` to run it).
        dtype: parameter and floating-input dtype (default: fp32 for tiny, bf16 for full).

    Raises:
        UnsupportedModelError: ``name`` is not in the registry.
        ConfigError: a ``qwen2-vl`` prompt (``seq`` > 1) shorter than :func:`min_prompt_tokens`.
    """
    spec = get_model(name)
    dtype = dtype or (torch.float32 if size == "tiny" else torch.bfloat16)
    shortest = min_prompt_tokens(name, size)
    if seq is not None and 1 < seq < shortest:
        raise ConfigError(f"{name} ({size}) needs prompts of at least {shortest} tokens (its image takes "
                          f"{shortest - 3}, plus 3 text tokens), got {seq}; a 1-token forward is its text-only decode "
                          f"step. Fix: --prefill-tokens {shortest} or more, or leave {name} out (--models / --model)")
    module = build_module(name, size, device=device, dtype=dtype)
    if name not in FIXED_LAYOUT_MODELS:
        return module, spec.example_inputs(size, batch, seq, device=device, dtype=dtype)
    if seq == 1:
        # A decode step's token: ids below the special (image, video, vision start/end) tokens, as the registry draws.
        text = torch.randint(0, min(QWEN2_VL_TOKENS[size]), (batch, seq), generator=torch.Generator().manual_seed(0),
                             device="cpu")
        return TextTokensOnly(module), (text.to(device),)
    with torch.device("cpu"):  # the layout needs values, also when the caller builds under torch.device("meta")
        ids, pixels, grid, types = spec.example_inputs(size, batch, seq, device="cpu", dtype=dtype)
    wrapped = FixedImageLayout(module, grid, types, ids)
    return wrapped, (ids.to(device), pixels.to(device))
