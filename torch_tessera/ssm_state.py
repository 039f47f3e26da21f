"""Registry SSMs (Mamba) with their recurrent state held as module buffers, so that the state is part of the program.

A Mamba decode step reads and writes two states per layer: the convolution window ``conv_state_<i>``
``[batch, intermediate, conv_kernel]`` (model dtype) and the selective-scan state ``ssm_state_<i>``
``[batch, intermediate, state_size]`` (fp32, as ``transformers`` keeps it). :class:`SSMStateLM` registers both as
non-persistent buffers of the wrapper and passes ``transformers`` a small cache object over them, so Inductor updates
them in place and tessera's capture marks them :attr:`~torch_tessera.lowering.program.BufferKind.STATE` (graph
inputs that a launch writes), as :mod:`torch_tessera.static_cache` does for a transformer's KV cache. The buffer names
are the same in the prefill and the decode program, so the scheduler prices the prefill -> decode hand-over of the
state between their owners (a constant ~``layers x batch x intermediate x (state_size x 4 + conv_kernel x 2)`` bytes,
independent of the context length).

The cache object (:class:`BufferStateCache`) speaks the two ``transformers`` APIs the Mamba mixer has used: 5.24
(``get_conv_state`` / ``get_recurrent_state`` / ``is_recording_past``, passed as ``cache=``) and 5.17
(``has_previous_state`` and ``layers[i].conv_states[0]`` / ``recurrent_states[0]`` / ``record_past``, passed as
``cache_params=``); both call ``update_conv_state`` and ``update_recurrent_state`` in the prefill. Semantics follow
``transformers``' ``LinearAttentionLayer``: a prefill (more than one token) starts from a zero state and writes the
final state; a decode step (one token) reads and updates the state in place
(``causal_conv1d_update``, ``mamba_selective_state_update``). Checked against ``transformers``' own cache in
``tests/models/test_ssm_state.py``, eagerly and compiled with tessera; checked on transformers 5.24.0 and 5.17.0.

The prefill runs ``transformers``' torch scan path, a Python loop over the prompt's tokens, so its program grows with
the prompt (64 layers x tokens x a few ops): measured mode keeps prompts short (see :mod:`torch_tessera.measure`).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from torch_tessera.errors import UnsupportedModelError

#: Registry families whose programs carry their recurrent state through :class:`SSMStateLM`.
SSM_STATE_FAMILIES = ("ssm",)
#: Buffer name prefixes of the state (one buffer per layer each).
CONV_PREFIX, SSM_PREFIX = "conv_state_", "ssm_state_"


def has_ssm_state(name: str) -> bool:
    """Whether registry model ``name`` is built with :class:`SSMStateLM` (its family is in ``SSM_STATE_FAMILIES``)."""
    from torch_tessera.models import get_model

    return get_model(name).family in SSM_STATE_FAMILIES


class _LayerView:
    """One layer's states as ``transformers`` 5.17 reads them (``layers[i].conv_states[0]``...)."""

    record_past = False

    def __init__(self, conv: torch.Tensor, ssm: torch.Tensor) -> None:
        self.conv_states = {0: conv}
        self.recurrent_states = {0: ssm}


class BufferStateCache:
    """A ``transformers`` cache over :class:`SSMStateLM`'s buffers (duck-typed; see the module docstring).

    Attributes:
        owner: the wrapper whose ``conv_state_<i>`` / ``ssm_state_<i>`` buffers hold the state.
        decoding: this call continues from the held state (one new token); ``False``: a prefill from zero state.
    """

    is_compileable = True

    def __init__(self, owner: "SSMStateLM") -> None:
        self.owner = owner
        self.decoding = False

    def _conv(self, i: int) -> torch.Tensor:
        return getattr(self.owner, f"{CONV_PREFIX}{i}")

    def _ssm(self, i: int) -> torch.Tensor:
        return getattr(self.owner, f"{SSM_PREFIX}{i}")

    # transformers >= 5.2x
    def get_conv_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        return self._conv(layer_idx) if self.decoding else None

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        return self._ssm(layer_idx) if self.decoding else None

    def is_recording_past(self, layer_idx: int) -> bool:
        return False

    # transformers 5.17
    def has_previous_state(self, layer_idx: int | None = None, state_idx: int | None = None) -> bool:
        return self.decoding

    @property
    def layers(self) -> list[_LayerView]:
        return [_LayerView(self._conv(i), self._ssm(i)) for i in range(self.owner.num_layers)]

    # both
    def update_conv_state(self, conv_states: torch.Tensor, layer_idx: int, state_idx: int = 0,
                          conv_kernel_size: int | None = None, **kwargs: Any) -> torch.Tensor:
        """Prefill: keep the last ``conv_kernel`` columns of ``conv_states`` ``[batch, intermediate, tokens]`` (left
        zero-padded when shorter) in the buffer; return what the causal convolution reads (the padded input)."""
        buf = self._conv(layer_idx)
        k = buf.shape[-1]
        full = conv_states
        if full.shape[-1] < k:
            full = torch.nn.functional.pad(full, (k - full.shape[-1], 0), value=0)
        buf.copy_(full[..., -k:])
        return full

    def update_recurrent_state(self, recurrent_states: torch.Tensor, layer_idx: int, state_idx: int = 0,
                               **kwargs: Any) -> torch.Tensor:
        """Prefill: the scan's final state ``[batch, intermediate, state_size]`` into the buffer (in place)."""
        buf = self._ssm(layer_idx)
        buf.copy_(recurrent_states)
        return buf


class SSMStateLM(torch.nn.Module):
    """A ``transformers`` Mamba causal LM reading and writing its recurrent state in this module's buffers.

    ``forward(input_ids)``: ``input_ids`` ``[batch, tokens]`` int64 -> logits ``[batch, tokens, vocab]`` (fp32, as
    ``MambaForCausalLM`` returns them). ``tokens > 1`` is a prefill from zero state that writes the final state;
    ``tokens == 1`` is a decode step that continues from the held state and updates it in place.
    """

    def __init__(self, lm: torch.nn.Module, batch: int) -> None:
        """Wrap ``lm``.

        Args:
            lm: a ``transformers`` ``MambaForCausalLM`` (any device; its layers may have been cut).
            batch: sequences the state holds.

        Raises:
            ValueError: ``batch`` < 1.
        """
        super().__init__()
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        self.lm = lm
        config = lm.config
        param = next(lm.parameters())
        self.num_layers = len(lm.backbone.layers)
        inter, k, n = config.intermediate_size, config.conv_kernel, config.state_size
        for i in range(self.num_layers):
            self.register_buffer(f"{CONV_PREFIX}{i}", torch.zeros(batch, inter, k, dtype=param.dtype,
                                                                  device=param.device), persistent=False)
            self.register_buffer(f"{SSM_PREFIX}{i}", torch.zeros(batch, inter, n, dtype=torch.float32,
                                                                 device=param.device), persistent=False)
        self.batch = batch
        self.cache = BufferStateCache(self)
        params = inspect.signature(lm.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "cache_params"

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        self.cache.decoding = input_ids.shape[1] == 1
        return self.lm(input_ids=input_ids, use_cache=True, **{self._cache_kwarg: self.cache}).logits


def build_ssm_state_lm(name: str, size: str, batch: int, *, device: str | torch.device = "cpu",
                       dtype: torch.dtype | None = None) -> SSMStateLM:
    """Registry SSM ``name`` at ``size`` wrapped with its state for ``batch`` sequences.

    Raises:
        UnsupportedModelError: the model's family has no state wrapper.
    """
    from torch_tessera.models import build_module, get_model

    spec = get_model(name)
    if spec.family not in SSM_STATE_FAMILIES:
        raise UnsupportedModelError(f"{name!r} ({spec.family}) has no SSM state wrapper; families with one: "
                                    f"{SSM_STATE_FAMILIES}")
    return SSMStateLM(build_module(name, size, device=device, dtype=dtype).model, batch).eval()
