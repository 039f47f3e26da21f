"""Built-in model registry: real architectures from their published configurations, with random weights.

Nothing is downloaded: every model is built from a config object. Each entry can build a ``tiny`` size (for CPU tests
and the embedded default) and, where defined, the ``full`` size (for planning on fake tensors and GPU runs).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Callable

import torch

from torch_tessera.errors import UnsupportedModelError


@dataclass(frozen=True)
class ModelSpec:
    """A registry entry.

    Attributes:
        name: registry name (``tessera inspect --model NAME``).
        family: ``"mlp"``, ``"llm"``, ``"moe"``, ``"ssm"``, ``"multimodal"``, ``"diffusion"``...
        description: one line, with the source of the configuration.
        build: ``build(size)`` -> ``(module, example_inputs)``; ``size`` is ``"tiny"`` or ``"full"``.
    """

    name: str
    family: str
    description: str
    build: Callable[[str], tuple[torch.nn.Module, tuple[Any, ...]]]


class MLP(torch.nn.Module):
    """LayerNorm -> Linear -> GELU -> Linear, with a residual. Shapes: x ``[batch, dim]`` -> ``[batch, dim]``."""

    def __init__(self, dim: int = 64, hidden: int = 256) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.up = torch.nn.Linear(dim, hidden)
        self.down = torch.nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def _build_mlp(size: str) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    dim, hidden, batch = (64, 256, 8) if size == "tiny" else (4096, 16384, 64)
    return MLP(dim, hidden).eval(), (torch.randn(batch, dim),)


def llama_config(size: str) -> Any:
    """Llama-3.1-8B's published configuration (``meta-llama/Llama-3.1-8B`` config.json), or a tiny one like it."""
    from transformers import LlamaConfig

    if size == "full":
        return LlamaConfig(
            vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
            num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072, rms_norm_eps=1e-5,
            rope_theta=500000.0, tie_word_embeddings=False, torch_dtype="bfloat16",
        )
    return LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False,
    )


class CausalLMLogits(torch.nn.Module):
    """Wraps a ``transformers`` causal LM so that ``forward(input_ids)`` returns the logits tensor only."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


def _build_llama(size: str) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    from transformers import LlamaForCausalLM

    config = llama_config(size)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    seq = 16 if size == "tiny" else 1024
    ids = torch.randint(0, config.vocab_size, (1, seq))
    return CausalLMLogits(model).eval(), (ids,)


REGISTRY: dict[str, ModelSpec] = {
    s.name: s
    for s in (
        ModelSpec("mlp", "mlp", "LayerNorm-Linear-GELU-Linear block with residual", _build_mlp),
        ModelSpec("llama", "llm", "Llama-3.1-8B architecture (transformers LlamaConfig); tiny: 2 layers, hidden 64",
                  _build_llama),
    )
}


def get_model(name: str) -> ModelSpec:
    """Look up a registry entry; an unknown name raises :class:`UnsupportedModelError` listing the registry."""
    spec = REGISTRY.get(name)
    if spec is None:
        close = difflib.get_close_matches(name, list(REGISTRY), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise UnsupportedModelError(f"unknown model {name!r}.{hint} Available: {', '.join(sorted(REGISTRY))}")
    return spec


def build_model(name: str, size: str = "tiny") -> tuple[torch.nn.Module, tuple[Any, ...]]:
    """Build registry model ``name`` at ``size`` (``"tiny"`` or ``"full"``) with random weights."""
    if size not in ("tiny", "full"):
        raise ValueError(f"size must be 'tiny' or 'full', got {size!r}")
    return get_model(name).build(size)
