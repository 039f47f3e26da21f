"""A KV cache whose rows are independent sequences at their own positions: what continuous batching needs.

:class:`~torch_tessera.static_cache.StaticCacheLM` (``transformers``' ``StaticCache``) writes every row of a step at
the same cache index (one ``kv_length`` counter per layer, shared by the batch) and masks by that counter, so the
rows of one decode step must all be at the same position. Requests in a serving batch are not: one is at token 3,
another at token 40. :class:`RowCacheLM` writes each row's new K/V at that row's own ``position_ids`` and masks each
row by its own positions (key slot ``j`` is visible to a query at position ``p`` iff ``j <= p``), so:

* a row holds one request's tokens at their positions ``0 .. n-1``; rows never interact;
* a prompt shorter than the compiled prefill length is right-padded: the padding tokens write slots ``>= n`` of
  that row, which no query at a position ``< n`` sees, and which decode steps overwrite one by one before any
  query at that position reads them (each step writes its slot before attending);
* a padding row of a decode bucket (token 0 at position 0) writes only its own slot 0.

Buffers: ``kv_key_<i>``, ``kv_value_<i>`` ``[rows, kv_heads, context, head_dim]`` (the names of
:mod:`torch_tessera.static_cache`, so the scheduler sees the same KV STATE), no length counters.

Versions: checked with ``transformers`` 5.24 (``forward(..., cache=...)``; ``LlamaAttention`` calls
``cache.update(k, v, layer_idx, kwargs=...)``) and 5.17 (``forward(..., past_key_values=...)``; ``update(k, v,
layer_idx)``); in both a 4-D ``attention_mask`` is used as given. The keyword is chosen from ``lm.forward``'s
signature (:func:`~torch_tessera.static_cache.cache_arguments`): both versions swallow an unknown keyword into
``**kwargs``, and a model that ignores the cache attends over the new tokens only, so :meth:`RowCacheLM.forward`
checks that every layer wrote the cache and raises otherwise.
"""

from __future__ import annotations

from typing import Any

import torch

from torch_tessera.errors import UnsupportedModelError
from torch_tessera.static_cache import KEY_PREFIX, VALUE_PREFIX, cache_arguments


class _RowCache:
    """The cache object handed to the model for one call: writes K/V per row at ``positions``."""

    is_compileable = True

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], positions: torch.Tensor) -> None:
        self.keys, self.values, self.positions = keys, values, positions
        self.updated: set[int] = set()  # layers whose K/V were written in this call

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Write ``key_states``/``value_states`` ``[B, H, T, D]`` at each row's positions; return the whole cache."""
        b, h, t, d = key_states.shape
        index = self.positions[:, None, :, None].expand(b, h, t, d)
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        keys.scatter_(2, index, key_states)
        values.scatter_(2, index, value_states)
        self.updated.add(layer_idx)
        return keys, values


class RowCacheLM(torch.nn.Module):
    """A causal LM over a KV cache of ``rows`` independent sequences of ``context`` positions each.

    ``forward(input_ids, position_ids)``: ``input_ids`` ``[rows, tokens]`` int64, ``position_ids`` ``[rows, tokens]``
    int64 (each ``< context``) -> logits ``[rows, tokens, vocab]``; each row's K/V are written at its positions.
    """

    def __init__(self, lm: torch.nn.Module, rows: int, context: int) -> None:
        """Wrap ``lm`` (a ``transformers`` causal LM with a per-layer K/V cache, e.g. ``LlamaForCausalLM``).

        Args:
            lm: the model; its parameters' dtype and device are the cache's.
            rows: sequences the cache holds.
            context: positions per sequence.

        Raises:
            ValueError: ``rows`` or ``context`` < 1.
        """
        super().__init__()
        if rows < 1 or context < 1:
            raise ValueError(f"rows and context must be >= 1, got {rows}, {context}")
        self.lm = lm
        config = lm.config
        param = next(lm.parameters())
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        shape = (rows, config.num_key_value_heads, context, head_dim)
        self.rows, self.context, self.layers = rows, context, config.num_hidden_layers
        self._cache_kwarg, self._takes_cache_position = cache_arguments(lm)
        for i in range(self.layers):
            self.register_buffer(f"{KEY_PREFIX}{i}", torch.zeros(shape, dtype=param.dtype, device=param.device),
                                 persistent=False)
            self.register_buffer(f"{VALUE_PREFIX}{i}", torch.zeros(shape, dtype=param.dtype, device=param.device),
                                 persistent=False)

    def kv(self) -> list[torch.Tensor]:
        """Every cache buffer (keys then values of each layer), ``[rows, kv_heads, context, head_dim]`` each."""
        return [getattr(self, f"{p}{i}") for i in range(self.layers) for p in (KEY_PREFIX, VALUE_PREFIX)]

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """Logits of ``input_ids`` ``[rows, tokens]`` at ``position_ids`` ``[rows, tokens]``; writes their K/V.

        Raises:
            UnsupportedModelError: a layer of the model did not write its K/V through the cache (the installed
                ``transformers`` does not take the cache by the keyword :func:`cache_arguments` chose).
        """
        keys = [getattr(self, f"{KEY_PREFIX}{i}") for i in range(self.layers)]
        values = [getattr(self, f"{VALUE_PREFIX}{i}") for i in range(self.layers)]
        slots = torch.arange(self.context, device=position_ids.device)
        mask = (slots[None, None, None, :] <= position_ids[:, None, :, None])  # [rows, 1, tokens, context]
        cache = _RowCache(keys, values, position_ids)
        kwargs: dict[str, Any] = {self._cache_kwarg: cache}
        if self._takes_cache_position:  # used only to build a mask (ours is 4-D) and by caches (ours ignores it)
            kwargs["cache_position"] = position_ids[0]
        logits = self.lm(input_ids=input_ids, position_ids=position_ids, attention_mask=mask, use_cache=True,
                         **kwargs).logits
        if len(cache.updated) != self.layers:
            raise UnsupportedModelError(
                f"{type(self.lm).__name__} wrote K/V through the row cache in {len(cache.updated)} of {self.layers} "
                f"layers (passed as {self._cache_kwarg}=): this transformers version takes its cache differently; "
                f"see torch_tessera.static_cache.cache_arguments")
        return logits
