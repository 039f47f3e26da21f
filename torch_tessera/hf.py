"""HuggingFace ``generate`` on the tessera backend with a bounded number of programs: prompts padded to length buckets.

tessera compiles one program per static shape. A serving loop sees prompts of many lengths; compiled as they come,
each length is a new prefill program (seconds each, and Dynamo gives up after its recompile limit).
:func:`compile_for_generate` pads every prompt on the left to the smallest bucket that holds it (the attention mask
hides the padding) and sizes the static KV cache ``bucket + max_new_tokens``, so each (bucket, ``max_new_tokens``)
pair compiles exactly one prefill and one decode program, whatever the prompt lengths inside the bucket.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch

from torch_tessera.errors import ConfigError

#: Default prompt-length buckets (tokens).
DEFAULT_BUCKETS = (32, 64, 128, 256, 512, 1024, 2048, 4096)


@dataclass
class BucketedGenerate:
    """``model.generate`` over prompts padded to length buckets (made by :func:`compile_for_generate`).

    Attributes:
        model: the HF causal LM whose ``forward`` is compiled with tessera.
        buckets: prompt lengths (tokens, ascending) a prompt is padded up to.
        pad_token_id: the token the padding holds (masked out, never attended to).
        shapes: ``(batch, bucket, max_new_tokens)`` of every generate call so far: each distinct one is one prefill
            and one decode program.
    """

    model: Any
    buckets: tuple[int, ...]
    pad_token_id: int
    shapes: list = field(default_factory=list)

    @property
    def tessera_compiled(self) -> Any:
        """What :func:`torch_tessera.explain` reports on for this generator: the model whose forward it compiled."""
        return self.model

    def bucket(self, length: int) -> int:
        """The smallest bucket holding ``length`` tokens.

        Raises:
            ConfigError: ``length`` exceeds the largest bucket.
        """
        i = bisect.bisect_left(self.buckets, length)
        if i == len(self.buckets):
            raise ConfigError(f"a prompt of {length} tokens is longer than the largest bucket {self.buckets[-1]}; "
                              "pass larger buckets to compile_for_generate")
        return self.buckets[i]

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                 max_new_tokens: int = 32, **kwargs: Any) -> torch.Tensor:
        """Greedy-or-sampled ``generate`` of ``input_ids`` (``[batch, length]`` int64) padded to its bucket.

        Args:
            input_ids: prompt tokens; rows already left-padded need ``attention_mask``.
            attention_mask: ``[batch, length]`` 1 for real tokens, 0 for padding (default all ones).
            max_new_tokens: tokens to generate (part of the program shape: keep it fixed in a serving loop).
            kwargs: passed to ``model.generate`` (``do_sample``...); the cache is always static.

        Returns:
            ``[batch, length + new]`` token ids: the prompt as given, then the generated tokens (padding removed).
        """
        batch, length = input_ids.shape
        bucket = self.bucket(length)
        pad = bucket - length
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        fill = torch.full((batch, pad), self.pad_token_id, dtype=input_ids.dtype, device=input_ids.device)
        ids = torch.cat([fill, input_ids], dim=1)
        mask = torch.cat([torch.zeros_like(fill), attention_mask.to(input_ids.dtype)], dim=1)
        self.shapes.append((batch, bucket, max_new_tokens))
        out = self.model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                  pad_token_id=self.pad_token_id, cache_implementation="static",
                                  disable_compile=True, **kwargs)
        return out[:, pad:]


def compile_for_generate(model: Any, options: Mapping[str, Any] | None = None,
                         buckets: Sequence[int] = DEFAULT_BUCKETS, *, backend: Any = "tessera") -> BucketedGenerate:
    """Compile ``model.forward`` with tessera (``dynamic=False``) and return a generator that pads prompts to
    ``buckets``, so a serving loop compiles one prefill and one decode program per bucket.

    Like HuggingFace's static-cache recipe, this sets ``model.forward`` to the compiled forward on ``model`` itself:
    a later ``model.generate`` also runs through tessera. ``del model.forward`` restores the eager forward.

    Args:
        model: a HuggingFace causal LM (``generate`` with ``cache_implementation="static"`` must work for it).
        options: tessera's options (see :class:`torch_tessera.backend.config.TesseraConfig`).
        buckets: prompt lengths in tokens (positive, any order).
        backend: the ``torch.compile`` backend (a ``RecordingBackend`` in tests).

    Returns:
        A :class:`BucketedGenerate`; call its ``generate`` under ``torch.no_grad()`` (tessera is inference-only).

    Raises:
        ConfigError: empty or non-positive buckets, or bad options.
    """
    from torch_tessera.backend.config import TesseraConfig

    if not buckets or any(isinstance(b, bool) or not isinstance(b, int) or b <= 0 for b in buckets):
        raise ConfigError(f"buckets={tuple(buckets)!r} must be positive token counts, e.g. (32, 64, 128)")
    sizes = tuple(sorted(set(buckets)))
    if backend == "tessera":
        TesseraConfig.from_options(options)  # bad options fail here, not at the first prompt
    gen = getattr(model, "generation_config", None)
    pad = getattr(gen, "pad_token_id", None)
    if pad is None:
        pad = getattr(gen, "eos_token_id", None)
    if isinstance(pad, (list, tuple)):
        pad = pad[0]
    kwargs = {"options": dict(options or {})} if backend == "tessera" else {}
    model.forward = torch.compile(model.forward, backend=backend, dynamic=False, **kwargs)
    return BucketedGenerate(model, sizes, int(pad if pad is not None else 0))
