"""Registry LLMs with a static KV cache held as module buffers, so that the cache is part of the lowered program.

Planning a decode step needs the attention over the cached context: that kernel reads the whole KV cache, its time
grows with the context length, and it is memory-bound, which is where a heterogeneous pair differs most. A forward
without a cache (``use_cache=False``, what :mod:`torch_tessera.models` wraps) has none of it.

:class:`StaticCacheLM` wraps a ``transformers`` causal LM with a ``transformers.StaticCache`` whose tensors are
registered as non-persistent buffers of the wrapper. ``torch.export`` then sees them as mutable buffers, Inductor
writes the new tokens' K/V into them in place, and tessera's capture marks them
:attr:`~torch_tessera.lowering.program.BufferKind.STATE` (graph inputs that a launch writes). The buffer names
(``kv_key_<layer>``, ``kv_value_<layer>``, ``kv_length_<layer>``) are the same in every program built with this
wrapper, so a prefill program and a decode program share them and the scheduler prices the prefill -> decode
hand-over of the KV cache between their owners.

Which registry models get a cache here: ``llama`` and ``moe`` (decoder-only transformers with a per-layer K/V cache).
Not ``mamba``: its recurrent state (conv state ``[B, intermediate, conv_kernel]`` and SSM state
``[B, intermediate, state_size]`` per layer) does not grow with the context, so a decode step without that state
misses only a constant, context-independent read and write (the measured bench carries it:
:mod:`torch_tessera.ssm_state`); not ``qwen2-vl``: its decode step needs the multimodal
rotary positions of the prompt (3-D ``position_ids``), which this wrapper does not build. Both are planned with the
cacheless forward (see :mod:`torch_tessera.backend.workload`).

Versions: written against ``transformers`` 5.24 (``forward(..., cache=...)``, ``StaticLayer.cumulative_length``
counts the tokens written); for earlier 5.x versions (``past_key_values=`` and ``cache_position=``) the same
wrapper passes those instead (:func:`cache_arguments`). ``tests/models/test_static_cache.py`` passes under 5.24 and
5.17.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from torch_tessera.errors import UnsupportedModelError

#: Registry families whose decode step is planned with a static KV cache.
KV_CACHE_FAMILIES = ("llm", "moe")
#: Buffer name prefixes of the cache (one buffer per layer each).
KEY_PREFIX, VALUE_PREFIX, LENGTH_PREFIX = "kv_key_", "kv_value_", "kv_length_"


def cache_arguments(lm: torch.nn.Module) -> tuple[str, bool]:
    """How ``lm.forward`` takes a cache object: the keyword's name, and whether it also takes ``cache_position``.

    ``transformers`` 5.24 names the keyword ``cache``; earlier 5.x versions (5.17 checked) ``past_key_values``.
    Either version takes an unknown keyword into ``**kwargs`` without complaint, so passing the wrong one silently
    runs the model without the cache.

    Args:
        lm: a ``transformers`` causal LM.

    Returns:
        ``(keyword, takes_cache_position)``: ``("cache", False)`` for Llama on 5.24, ``("past_key_values", False)``
        on 5.17.
    """
    params = inspect.signature(lm.forward).parameters
    return ("cache" if "cache" in params else "past_key_values"), "cache_position" in params


def has_kv_cache(name: str) -> bool:
    """Whether registry model ``name`` is planned with a static KV cache (its family is in ``KV_CACHE_FAMILIES``)."""
    from torch_tessera.models import get_model

    return get_model(name).family in KV_CACHE_FAMILIES


class StaticCacheLM(torch.nn.Module):
    """A causal LM reading and writing a static KV cache that lives in this module's buffers.

    Buffers (per decoder layer ``i``): ``kv_key_<i>`` and ``kv_value_<i>`` of shape
    ``[batch, kv_heads, context, head_dim]`` in the model's dtype, and, where the installed ``transformers`` keeps
    one, ``kv_length_<i>`` (0-dim int64: tokens written so far).

    ``forward(input_ids, position_ids)``: ``input_ids`` ``[batch, tokens]`` int64, ``position_ids``
    ``[batch, tokens]`` int64 (positions of these tokens in the sequence, ``< context``) -> logits
    ``[batch, tokens, vocab]``. The new tokens' K/V are written into the cache in place; attention reads the whole
    ``context``-long cache (masked beyond the written positions), as ``transformers``' static cache does in
    ``generate``.
    """

    def __init__(self, lm: torch.nn.Module, batch: int, context: int) -> None:
        """Wrap ``lm``.

        Args:
            lm: a ``transformers`` causal LM (``LlamaForCausalLM``, ``MixtralForCausalLM``...), on any device
                (``meta`` for planning).
            batch: sequences the cache holds.
            context: positions per sequence (``max_cache_len``).

        Raises:
            ValueError: ``batch`` or ``context`` < 1.
        """
        super().__init__()
        from transformers import StaticCache

        if batch < 1 or context < 1:
            raise ValueError(f"batch and context must be >= 1, got {batch}, {context}")
        self.lm = lm
        config = lm.config
        param = next(lm.parameters())
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.cache = StaticCache(config=config, max_cache_len=context)
        self.cache.early_initialization(batch, config.num_key_value_heads, head_dim, param.dtype, param.device)
        self.batch, self.context = batch, context
        for i, layer in enumerate(self.cache.layers):
            self.register_buffer(f"{KEY_PREFIX}{i}", layer.keys, persistent=False)
            self.register_buffer(f"{VALUE_PREFIX}{i}", layer.values, persistent=False)
            if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor):
                self.register_buffer(f"{LENGTH_PREFIX}{i}", layer.cumulative_length, persistent=False)
        self._cache_kwarg, self._takes_cache_position = cache_arguments(lm)

    def _bind(self) -> None:
        """Point the cache's layers at this module's buffers (``torch.export`` and ``.to()`` replace them)."""
        for i, layer in enumerate(self.cache.layers):
            layer.keys = getattr(self, f"{KEY_PREFIX}{i}")
            layer.values = getattr(self, f"{VALUE_PREFIX}{i}")
            layer.device = layer.keys.device
            if hasattr(self, f"{LENGTH_PREFIX}{i}"):
                layer.cumulative_length = getattr(self, f"{LENGTH_PREFIX}{i}")

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        self._bind()
        kwargs: dict[str, Any] = {self._cache_kwarg: self.cache}
        if self._takes_cache_position:
            kwargs["cache_position"] = position_ids[0]
        return self.lm(input_ids=input_ids, position_ids=position_ids, use_cache=True, **kwargs).logits


def build_static_cache_lm(
    name: str, size: str, batch: int, tokens: int, context: int, *, device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
) -> tuple[StaticCacheLM, tuple[torch.Tensor, torch.Tensor]]:
    """Registry LLM ``name`` with a static cache, and inputs for a step of ``tokens`` new tokens per sequence.

    The step's tokens take the last positions of the context (``context - tokens .. context - 1``): a prefill of
    ``tokens = prompt`` into a cache sized for the whole request, or a decode step (``tokens = 1``) at a context of
    ``context`` tokens. Only shapes matter for planning; the positions make the attention mask cover the context.

    Args:
        name: registry model of a family in :data:`KV_CACHE_FAMILIES`.
        size: ``"tiny"`` or ``"full"``.
        batch: sequences per step.
        tokens: new tokens per sequence (>= 1, <= ``context``).
        context: static cache length in tokens.
        device: where parameters, cache and inputs are created (``"meta"`` for planning).
        dtype: parameter and cache dtype (default: fp32 tiny, bf16 full).

    Returns:
        ``(module, (input_ids [batch, tokens] int64, position_ids [batch, tokens] int64))``.

    Raises:
        UnsupportedModelError: the model's family has no KV cache wrapper.
        ValueError: ``tokens`` is not in ``1..context``.
    """
    from torch_tessera.models import build_module, get_model

    spec = get_model(name)
    if spec.family not in KV_CACHE_FAMILIES:
        raise UnsupportedModelError(f"{name!r} ({spec.family}) has no static KV cache wrapper; families with one: "
                                    f"{KV_CACHE_FAMILIES}")
    if not 1 <= tokens <= context:
        raise ValueError(f"tokens={tokens} must be in 1..context={context}")
    wrapper = build_module(name, size, device=device, dtype=dtype)
    module = StaticCacheLM(wrapper.model, batch, context).eval()
    (ids,) = spec.example_inputs(size, batch, tokens, device=device)
    positions = (torch.arange(context - tokens, context, device=device)).expand(batch, tokens).contiguous()
    return module, (ids, positions)
