"""Built-in model registry: real architectures from their published configurations, with random weights.

Nothing is downloaded: every model is built from a config object (``transformers`` / ``diffusers`` classes, or plain
torch). Each entry builds a ``tiny`` size (CPU tests and the embedded default: compiles with the tessera backend on
CPU in seconds) and a ``full`` size (the published configuration, for planning on the meta device and GPU runs).

| name | family | full size (published configuration) | bf16 weights |
| --- | --- | --- | --- |
| ``mlp`` | mlp | LayerNorm-Linear-GELU-Linear, 4096 -> 16384 -> 4096 | 0.27 GB |
| ``llama`` | llm | Llama-3.1-8B | 16.1 GB |
| ``moe`` | moe | Mixtral-8x7B, unscaled (8 experts, top-2) | 93.4 GB |
| ``mamba`` | ssm | mamba-2.8b (``state-spaces/mamba-2.8b-hf``) | 5.5 GB |
| ``qwen2-vl`` | multimodal | Qwen2-VL-7B (ViT 675M + Qwen2-7B) | 16.6 GB |
| ``dit`` | diffusion | SD3.5-medium MMDiT (``SD3Transformer2DModel``) | 4.9 GB |

Every ``full`` model fits one 141 GB H200 in bf16 unscaled: Mixtral-8x7B (46.7 B parameters) leaves ~47 GB for the KV
cache. The ``bf16 weights`` column is what :func:`parameter_bytes` computes (tests check the fit).
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import importlib.util
import inspect
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from torch_tessera.errors import UnsupportedModelError

log = logging.getLogger(__name__)

SIZES = ("tiny", "full")
#: Vocabulary of every tiny token model.
TINY_VOCAB = 256
#: MLP (dim, hidden) per size.
MLP_DIMS = {"tiny": (64, 256), "full": (4096, 16384)}
OUTPUT_UNITS = ("tokens", "images", "rows")


@dataclass(frozen=True)
class ModelSpec:
    """A registry entry: how to build a model and its inputs, and which serving baselines apply to it.

    Attributes:
        name: registry name (``tessera bench --model NAME``).
        family: ``"mlp"``, ``"llm"``, ``"moe"``, ``"ssm"``, ``"multimodal"`` or ``"diffusion"``.
        description: one line, with the source of the configuration and any scaling of ``full``.
        make_module: ``make_module(size)`` -> the module with random weights, in the current default dtype and device.
        make_inputs: ``make_inputs(size, batch, seq, generator)`` -> the forward's positional inputs on CPU (fp32
            floats). ``seq`` is tokens per sequence for token models; for ``qwen2-vl`` it includes the image's tokens;
            ``mlp`` and ``dit`` ignore it (rows / a fixed latent resolution per size).
        default_shape: ``{size: (batch, seq)}`` used by :meth:`build` and :func:`build_model`.
        prefill_decode: the model generates tokens autoregressively, so prefill/decode disaggregation (``pd``) and
            TTFT/TPOT apply.
        attention_ffn_split: the model has attention and FFN/expert blocks to split between devices (``af``); not
            for Mamba (no attention) or diffusion (as the paper marks it).
        output_unit: what throughput counts: ``"tokens"`` (output tokens/s), ``"images"`` (images/min), ``"rows"``.
        forwards_per_output: forwards per output unit beyond decoding: for ``dit`` the denoising steps per image
            (diffusers' StableDiffusion3Pipeline default ``num_inference_steps=28``); 1 otherwise.
    """

    name: str
    family: str
    description: str
    make_module: Callable[[str], torch.nn.Module]
    make_inputs: Callable[[str, int, int, torch.Generator], tuple[torch.Tensor, ...]]
    default_shape: dict[str, tuple[int, int]] = field(default_factory=dict)
    prefill_decode: bool = False
    attention_ffn_split: bool = False
    output_unit: str = "tokens"
    forwards_per_output: int = 1

    def __post_init__(self) -> None:
        if self.output_unit not in OUTPUT_UNITS:
            raise ValueError(f"output_unit {self.output_unit!r} is not one of {OUTPUT_UNITS}")
        if set(self.default_shape) != set(SIZES):
            raise ValueError(f"default_shape must give (batch, seq) for each of {SIZES}")

    def example_inputs(
        self,
        size: str = "tiny",
        batch: int | None = None,
        seq: int | None = None,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        seed: int = 0,
    ) -> tuple[torch.Tensor, ...]:
        """Inputs for one forward at ``size``, ``batch`` x ``seq`` (defaults: :attr:`default_shape`).

        Args:
            size: ``"tiny"`` or ``"full"``.
            batch: sequences (images, rows) per forward.
            seq: tokens per sequence (see :attr:`make_inputs` for what each family does with it).
            device: where the tensors go (``"meta"`` for planning without memory).
            dtype: floating inputs are cast to it (the model's dtype); integer inputs keep theirs.
            seed: seed of the random token ids / pixels / latents.
        """
        _check_size(size)
        d_batch, d_seq = self.default_shape[size]
        gen = torch.Generator().manual_seed(seed)
        inputs = self.make_inputs(size, batch or d_batch, seq or d_seq, gen)
        return tuple(_to(x, device, dtype) for x in inputs)

    def outputs_per_forward(self, batch: int) -> float:
        """Output units (:attr:`output_unit`) one forward of ``batch`` yields outside decoding: ``batch /
        forwards_per_output`` (for ``dit``: images per denoising step). The predicted and the measured bench both
        count throughput with it."""
        return batch / self.forwards_per_output

    def build(self, size: str = "tiny") -> tuple[torch.nn.Module, tuple[Any, ...]]:
        """``(module, example_inputs)`` at ``size`` on CPU (tiny: fp32; full: bf16). See :func:`build_model`."""
        return build_model(self.name, size)


def _to(x: torch.Tensor, device: str | torch.device, dtype: torch.dtype | None) -> torch.Tensor:
    if dtype is not None and x.is_floating_point():
        x = x.to(dtype)
    return x.to(device)


def _check_size(size: str) -> None:
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


def _token_ids(vocab: int) -> Callable[[str, int, int, torch.Generator], tuple[torch.Tensor, ...]]:
    """Inputs of a causal LM: random token ids ``[batch, seq]`` (int64) below ``vocab(size)``."""

    def make(size: str, batch: int, seq: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        return (torch.randint(0, vocab if size == "full" else TINY_VOCAB, (batch, seq), generator=gen),)

    return make


def _mlp_inputs(size: str, batch: int, seq: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    return (torch.randn(batch, MLP_DIMS[size][0], generator=gen),)


# -- forward wrappers: each returns one tensor -------------------------------------------------------------------------
class MLP(torch.nn.Module):
    """LayerNorm -> Linear -> GELU -> Linear, with a residual. Shapes: x ``[batch, dim]`` -> ``[batch, dim]``."""

    def __init__(self, dim: int = 64, hidden: int = 256) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.up = torch.nn.Linear(dim, hidden)
        self.down = torch.nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class CausalLMLogits(torch.nn.Module):
    """Wraps a ``transformers`` causal LM so that ``forward(input_ids)`` returns the logits tensor only."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


class VisionLanguageLogits(torch.nn.Module):
    """Wraps a Qwen2-VL-style model: ``forward(input_ids, pixel_values, image_grid_thw, mm_token_type_ids)`` -> logits.

    Shapes: ``input_ids`` / ``mm_token_type_ids`` ``[batch, seq]`` (int64 / int32: 1 marks an image token),
    ``pixel_values`` ``[patches, 3 * temporal_patch * patch**2]``, ``image_grid_thw`` ``[images, 3]`` (int64).
    ``mm_token_type_ids`` is passed on only where the installed ``transformers`` takes it (5.2x does; earlier 5.x
    versions find the image tokens from ``input_ids``).
    """

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.takes_token_types = "mm_token_type_ids" in inspect.signature(model.forward).parameters

    def forward(self, input_ids: torch.Tensor, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor,
                mm_token_type_ids: torch.Tensor) -> torch.Tensor:
        extra = {"mm_token_type_ids": mm_token_type_ids} if self.takes_token_types else {}
        return self.model(input_ids=input_ids, pixel_values=pixel_values, image_grid_thw=image_grid_thw,
                          use_cache=False, **extra).logits


class DenoiserOutput(torch.nn.Module):
    """Wraps a ``diffusers`` SD3 transformer: one denoising step -> the predicted velocity ``[batch, C, H, W]``.

    Inputs: latents ``[batch, C, H, W]``, text embeddings ``[batch, tokens, joint_dim]``, pooled text embeddings
    ``[batch, pooled_dim]``, timestep ``[batch]`` (float, 0..1000).
    """

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, latents: torch.Tensor, text: torch.Tensor, pooled: torch.Tensor,
                timestep: torch.Tensor) -> torch.Tensor:
        return self.model(hidden_states=latents, encoder_hidden_states=text, pooled_projections=pooled,
                          timestep=timestep, return_dict=False)[0]


# -- configurations and builders ---------------------------------------------------------------------------------------
def build_mlp(size: str) -> torch.nn.Module:
    return MLP(*MLP_DIMS[size])


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
        vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False,
    )


def build_llama(size: str) -> torch.nn.Module:
    from transformers import LlamaForCausalLM

    config = llama_config(size)
    config._attn_implementation = "sdpa"
    return CausalLMLogits(LlamaForCausalLM(config))


def mixtral_config(size: str) -> Any:
    """Mixtral-8x7B's published configuration (``mistralai/Mixtral-8x7B-v0.1`` config.json), or a tiny one like it.

    Experts run with ``transformers``' default experts implementation (``grouped_mm``: tokens sorted by expert, one
    grouped GEMM per projection; shapes do not depend on the routing, so one compiled graph serves every batch).
    """
    from transformers import MixtralConfig

    if size == "full":
        return MixtralConfig(
            vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
            num_attention_heads=32, num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2,
            max_position_embeddings=32768, rms_norm_eps=1e-5, rope_theta=1e6, sliding_window=None,
            tie_word_embeddings=False,
        )
    return MixtralConfig(
        vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=256,
        sliding_window=None, tie_word_embeddings=False,
    )


def build_mixtral(size: str) -> torch.nn.Module:
    from transformers import MixtralForCausalLM

    config = mixtral_config(size)
    config._attn_implementation = "sdpa"
    return CausalLMLogits(MixtralForCausalLM(config))


def mamba_config(size: str) -> Any:
    """Mamba 2.8B's published configuration (``state-spaces/mamba-2.8b-hf`` config.json), or a tiny one like it."""
    from transformers import MambaConfig

    if size == "full":
        return MambaConfig(
            vocab_size=50280, hidden_size=2560, state_size=16, num_hidden_layers=64, expand=2, conv_kernel=4,
            time_step_rank=160, layer_norm_epsilon=1e-5, use_bias=False, use_conv_bias=True, residual_in_fp32=True,
            tie_word_embeddings=True,
        )
    # Small widths on purpose: the Triton interpreter runs each program of a grid in turn, and the scan's grid is
    # batch x intermediate size.
    return MambaConfig(vocab_size=TINY_VOCAB, hidden_size=32, state_size=4, num_hidden_layers=2, expand=2,
                       conv_kernel=4, tie_word_embeddings=True)


def build_mamba(size: str) -> torch.nn.Module:
    from transformers import MambaForCausalLM

    for package in ("mamba_ssm", "causal_conv1d"):
        if importlib.util.find_spec(package) is not None:
            log.warning("%s is installed: transformers may run Mamba through its CUDA kernels, which tessera sees as "
                        "opaque extern calls. Uninstall it to lower the torch scan path.", package)
    return CausalLMLogits(MambaForCausalLM(mamba_config(size)))


#: Qwen2-VL image per size: (side in pixels, ViT patch side); the vision tower merges 2x2 patches into one token.
QWEN2_VL_IMAGE = {"tiny": (16, 4), "full": (504, 14)}
#: Qwen2-VL special token ids per size: image, video, vision start, vision end.
QWEN2_VL_TOKENS = {"tiny": (250, 251, 252, 253), "full": (151655, 151656, 151652, 151653)}


def qwen2_vl_config(size: str) -> Any:
    """Qwen2-VL-7B's published configuration (``Qwen/Qwen2-VL-7B-Instruct`` config.json), or a tiny one like it."""
    from transformers import Qwen2VLConfig

    image, video, start, end = QWEN2_VL_TOKENS[size]
    patch = QWEN2_VL_IMAGE[size][1]
    if size == "full":
        text = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                    num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32768, rms_norm_eps=1e-6,
                    rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]})
        vision = dict(depth=32, embed_dim=1280, hidden_size=3584, num_heads=16, mlp_ratio=4)
    else:
        text = dict(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
                    bos_token_id=None, eos_token_id=None,
                    rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]})
        vision = dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2)
    vision.update(patch_size=patch, spatial_merge_size=2, temporal_patch_size=2, in_channels=3)
    return Qwen2VLConfig(text_config=text, vision_config=vision, image_token_id=image, video_token_id=video,
                         vision_start_token_id=start, vision_end_token_id=end, tie_word_embeddings=False)


def build_qwen2_vl(size: str) -> torch.nn.Module:
    from transformers import Qwen2VLForConditionalGeneration

    config = qwen2_vl_config(size)
    config._attn_implementation = "sdpa"
    return VisionLanguageLogits(Qwen2VLForConditionalGeneration(config))


def qwen2_vl_inputs(size: str, batch: int, seq: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """One image per sequence: ``[text, vision_start, image tokens..., vision_end, text...]`` of ``seq`` tokens."""
    side, patch = QWEN2_VL_IMAGE[size]
    image, _, start, end = QWEN2_VL_TOKENS[size]
    grid = side // patch
    n_image = (grid // 2) ** 2
    if seq < n_image + 3:
        raise ValueError(f"qwen2-vl {size}: seq={seq} cannot hold one image ({n_image} tokens) plus 3 text tokens")
    ids = torch.randint(0, min(QWEN2_VL_TOKENS[size]), (batch, seq), generator=gen)
    ids[:, 1] = start
    ids[:, 2:2 + n_image] = image
    ids[:, 2 + n_image] = end
    pixels = torch.randn(batch * grid * grid, 3 * 2 * patch * patch, generator=gen)
    grid_thw = torch.tensor([[1, grid, grid]] * batch)
    return ids, pixels, grid_thw, (ids == image).int()


#: SD3 shapes per size: latent channels, latent side, text tokens (77 CLIP + 256 T5), joint dim, pooled dim.
SD3_SHAPES = {"tiny": (4, 8, 6, 16, 16), "full": (16, 128, 333, 4096, 2048)}


def build_sd3(size: str) -> torch.nn.Module:
    """SD3.5-medium's MMDiT (``stabilityai/stable-diffusion-3.5-medium`` transformer/config.json), or a tiny one."""
    from diffusers import SD3Transformer2DModel

    channels, side, _, joint, pooled = SD3_SHAPES[size]
    if size == "full":
        model = SD3Transformer2DModel(
            sample_size=side, patch_size=2, in_channels=channels, out_channels=channels, num_layers=24,
            attention_head_dim=64, num_attention_heads=24, joint_attention_dim=joint, caption_projection_dim=1536,
            pooled_projection_dim=pooled, pos_embed_max_size=384, dual_attention_layers=tuple(range(13)),
            qk_norm="rms_norm",
        )
    else:
        model = SD3Transformer2DModel(
            sample_size=side, patch_size=2, in_channels=channels, out_channels=channels, num_layers=2,
            attention_head_dim=8, num_attention_heads=2, joint_attention_dim=joint, caption_projection_dim=16,
            pooled_projection_dim=pooled, pos_embed_max_size=16, dual_attention_layers=(0,), qk_norm="rms_norm",
        )
    # diffusers' from_pretrained(torch_dtype=...) casts everything, the fp32 positional-embedding buffer included.
    for sub in model.modules():
        for key, buf in sub._buffers.items():
            if buf is not None and buf.is_floating_point():
                sub._buffers[key] = buf.to(torch.get_default_dtype())
    return DenoiserOutput(model)


def sd3_inputs(size: str, batch: int, seq: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Latents, text embeddings, pooled embeddings and a timestep for ``batch`` images (``seq`` is not used)."""
    channels, side, tokens, joint, pooled = SD3_SHAPES[size]
    return (
        torch.randn(batch, channels, side, side, generator=gen),
        torch.randn(batch, tokens, joint, generator=gen),
        torch.randn(batch, pooled, generator=gen),
        torch.rand(batch, generator=gen) * 1000.0,
    )


REGISTRY: dict[str, ModelSpec] = {
    s.name: s
    for s in (
        ModelSpec(
            "mlp", "mlp", "LayerNorm-Linear-GELU-Linear block with residual (tiny 64->256, full 4096->16384)",
            build_mlp, _mlp_inputs, {"tiny": (8, 1), "full": (64, 1)}, output_unit="rows",
        ),
        ModelSpec(
            "llama", "llm", "Llama-3.1-8B (meta-llama/Llama-3.1-8B config.json), unscaled; tiny: 2 layers, hidden 64",
            build_llama, _token_ids(128256), {"tiny": (1, 16), "full": (1, 1024)},
            prefill_decode=True, attention_ffn_split=True,
        ),
        ModelSpec(
            "moe", "moe",
            "Mixtral-8x7B (mistralai/Mixtral-8x7B-v0.1 config.json: 8 experts, top-2), unscaled: 46.7 B parameters, "
            "93.4 GB in bf16, fits one 141 GB H200; tiny: 2 layers, 4 experts, top-2",
            build_mixtral, _token_ids(32000), {"tiny": (1, 16), "full": (1, 1024)},
            prefill_decode=True, attention_ffn_split=True,
        ),
        ModelSpec(
            "mamba", "ssm",
            "Mamba 2.8B (state-spaces/mamba-2.8b-hf config.json), unscaled, torch scan path (no CUDA kernels); "
            "tiny: 2 layers, hidden 32",
            build_mamba, _token_ids(50280), {"tiny": (1, 8), "full": (1, 1024)},
            prefill_decode=True, attention_ffn_split=False,
        ),
        ModelSpec(
            "qwen2-vl", "multimodal",
            "Qwen2-VL-7B (Qwen/Qwen2-VL-7B-Instruct config.json), unscaled: ViT encoder + Qwen2 LLM, one 504x504 "
            "image (324 tokens) per sequence; tiny: 1+1 layers, one 16x16 image (4 tokens)",
            build_qwen2_vl, qwen2_vl_inputs, {"tiny": (1, 12), "full": (1, 1024)},
            prefill_decode=True, attention_ffn_split=True,
        ),
        ModelSpec(
            "dit", "diffusion",
            "Stable Diffusion 3.5 medium MMDiT (stabilityai/stable-diffusion-3.5-medium transformer/config.json, "
            "diffusers SD3Transformer2DModel), unscaled; one denoising step of 1024x1024 images (128x128 latents, "
            "333 text tokens); tiny: 2 layers, 8x8 latents",
            build_sd3, sd3_inputs, {"tiny": (1, 0), "full": (1, 0)},
            output_unit="images", forwards_per_output=28,
        ),
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


def build_module(
    name: str, size: str = "tiny", *, device: str | torch.device | None = None, dtype: torch.dtype | None = None
) -> torch.nn.Module:
    """Build registry model ``name`` at ``size`` with random weights (seeded), in eval mode.

    Args:
        name: registry name.
        size: ``"tiny"`` or ``"full"``.
        device: where the parameters are created (``"meta"``: no memory, for planning and :func:`parameter_bytes`;
            ``"cuda"``: directly on the GPU, never materialising the full model on the host). Default: CPU.
        dtype: parameter dtype; default fp32 for ``tiny``, bf16 for ``full``.
    """
    spec = get_model(name)
    _check_size(size)
    dtype = dtype or (torch.float32 if size == "tiny" else torch.bfloat16)
    torch.manual_seed(0)
    with _default_dtype(dtype), torch.device(device or "cpu"):
        module = spec.make_module(size)
    return module.eval()


def build_model(
    name: str, size: str = "tiny", *, device: str | torch.device | None = None, dtype: torch.dtype | None = None
) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    """Build registry model ``name`` at ``size`` with random weights and its default example inputs.

    Args and defaults as :func:`build_module`; the inputs use :attr:`ModelSpec.default_shape` and the module's dtype.

    Returns:
        ``(module, example_inputs)``; ``module(*example_inputs)`` returns one tensor.
    """
    module = build_module(name, size, device=device, dtype=dtype)
    dtype = dtype or (torch.float32 if size == "tiny" else torch.bfloat16)
    return module, get_model(name).example_inputs(size, device=device or "cpu", dtype=dtype)


@functools.lru_cache(maxsize=32)
def parameter_bytes(name: str, size: str = "full", dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes of the model's parameters and buffers at ``dtype``, computed on the meta device (nothing allocated;
    about a second for a full-size model, so remembered per arguments)."""
    module = build_module(name, size, device="meta", dtype=dtype)
    tensors = list(module.parameters()) + list(module.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)

