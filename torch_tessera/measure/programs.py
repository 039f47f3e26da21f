"""Build each model family's programs over one set of weights, with their inputs and eager outputs, and compile each
once with the tessera backend.

| family | programs | state carried between calls (STATE buffers) | reset before every call |
| --- | --- | --- | --- |
| ``llm``, ``moe`` | ``prefill`` (1 x prompt), ``decode`` (batch x 1) | static KV cache (:mod:`torch_tessera.static_cache`) | cache-length counters set so that the call writes the last positions |
| ``ssm`` | ``prefill`` (1 x prompt), ``decode`` (batch x 1) | conv/SSM state (:mod:`torch_tessera.ssm_state`) | the state saved after an eager prefill of the decode batch's prompts |
| ``diffusion`` | ``denoise`` (one denoising step, the registry's batch) | none | nothing |

Every call of a program therefore computes the same output as its eager reference (``Compiled.want``). In bf16 that
reference carries bf16's own rounding, which a compiled program (fp32 inside fused kernels) does not share;
:meth:`Compiled.fp32_reference` is the same call with the weights, inputs and state in fp32, against which the check in
:mod:`.execute` measures both (see :func:`~torch_tessera.measure.execute.close_to_eager`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from torch_tessera.errors import ConfigError, TesseraError
from torch_tessera.measure.settings import MeasureSettings


@dataclass
class Compiled:
    """One program compiled once with the tessera backend.

    Attributes:
        name: the workload's program name (``"prefill"``, ``"decode"``, ``"denoise"``).
        module: the module compiled (for LLMs a :class:`~torch_tessera.static_cache.StaticCacheLM`, whose buffers
            are the live KV cache; for SSMs an :class:`~torch_tessera.ssm_state.SSMStateLM`).
        inputs: the forward's positional inputs.
        tokens: new tokens per sequence (KV caches: the counters are reset to ``context - tokens`` before a call).
        fn: the ``torch.compile`` result.
        runner: the backend's :class:`~torch_tessera.runtime.runner.TesseraRunner`.
        want: eager output (logits ``[batch, tokens, vocab]``, or the denoiser's ``[batch, C, H, W]``).
        args: the graph inputs the runner received (program order), for profiling and micro-batches.
        restore: puts the module's state back before a call (``None``: the KV-cache counter reset of :meth:`reset`).
        handover: prefixes of the module buffers a request carries to the next program's device (the prefill's KV
            cache or SSM state: what ``pd`` copies); empty when there is none.
    """

    name: str
    module: Any
    inputs: tuple
    tokens: int = 0
    fn: Any = None
    runner: Any = None
    want: torch.Tensor | None = None
    args: list = field(default_factory=list)
    restore: Callable[[], None] | None = None
    handover: tuple[str, ...] = ()
    _want_fp32: torch.Tensor | None = field(default=None, repr=False)

    @property
    def dtype(self) -> torch.dtype:
        """The model's parameter dtype (the output may differ: Mamba returns fp32 logits from a bf16 model)."""
        return next(self.module.parameters()).dtype

    def reset(self) -> None:
        """Put the state back so that this call computes :attr:`want`: ``restore()`` when given, else every
        cache-length counter set to ``context - tokens`` (this call writes the last positions)."""
        from torch_tessera.static_cache import LENGTH_PREFIX

        if self.restore is not None:
            self.restore()
            return
        for n, b in self.module.named_buffers():
            if n.startswith(LENGTH_PREFIX):
                b.fill_(self.module.context - self.tokens)

    def __call__(self) -> torch.Tensor:
        self.reset()
        return self.fn(*self.inputs)

    def fp32_reference(self) -> torch.Tensor:
        """The eager output of this call with the weights, floating inputs and state cast to fp32 (computed once).

        A copy of :attr:`module` taken after :meth:`reset` (so it starts from the state this call starts from: the
        bf16 state an eager bf16 prefill left, for Mamba's decode) is cast to fp32 and run eagerly, then dropped:
        the home device briefly holds the weights (and state) once more, in fp32. Output as :attr:`want`'s shape,
        fp32.
        """
        if self._want_fp32 is None:
            self.reset()
            ref = copy.deepcopy(self.module).float()
            inputs = tuple(x.float() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                           for x in self.inputs)
            with torch.no_grad():
                self._want_fp32 = ref(*inputs).float().clone()
            del ref
        return self._want_fp32


def cut_layers(model: torch.nn.Module, family: str, n: int | None) -> None:
    """Keep ``n`` repeated blocks of a registry model (in place; ``None``: keep all).

    LLMs and SSMs keep their first ``n`` layers. ``dit`` keeps its first ``n - 1`` joint blocks and its last one
    (SD3's last block differs: it updates only the image stream, ``context_pre_only``).

    Args:
        model: the ``transformers`` LM (``LlamaForCausalLM``, ``MambaForCausalLM``...) or the diffusers transformer.
        family: its registry family.
        n: blocks to keep.

    Raises:
        ConfigError: ``n`` is more than the model has.
    """
    if n is None:
        return
    if family == "diffusion":
        blocks = model.transformer_blocks
        if n > len(blocks):
            raise ConfigError(f"--layers {n}: the model has only {len(blocks)} transformer blocks")
        model.transformer_blocks = torch.nn.ModuleList(list(blocks[:n - 1]) + [blocks[-1]])
        return
    owner = model.backbone if family == "ssm" else model.model
    layers = owner.layers
    if n > len(layers):
        raise ConfigError(f"--layers {n}: the model has only {len(layers)} layers")
    owner.layers = layers[:n]
    model.config.num_hidden_layers = n
    derived = isinstance(getattr(type(model.config), "layer_types", None), property)  # Mamba: from the layer count
    if getattr(model.config, "layer_types", None) and not derived:
        model.config.layer_types = model.config.layer_types[:n]


def _saved_state(module: torch.nn.Module) -> Callable[[], None]:
    """A function putting ``module``'s buffers back to their values now (one saved copy of each)."""
    saved = [(b, b.detach().clone()) for b in module.buffers()]

    def restore() -> None:
        for live, copy in saved:
            live.copy_(copy)

    return restore


def _kv_programs(s: MeasureSettings, home: str, dtype: torch.dtype) -> list[Compiled]:
    from torch_tessera.models import build_module, get_model
    from torch_tessera.static_cache import KEY_PREFIX, VALUE_PREFIX, StaticCacheLM

    p, b, c = s.shape
    lm = build_module(s.model, s.size, device=home, dtype=dtype).model
    cut_layers(lm, s.family, s.kept_layers)
    spec = get_model(s.model)
    out = []
    for name, batch, tokens in (("prefill", 1, p), ("decode", b, 1)):
        module = StaticCacheLM(lm, batch, c).eval()
        (ids,) = spec.example_inputs(s.size, batch, tokens, device=home)
        pos = torch.arange(c - tokens, c, device=home).expand(batch, tokens).contiguous()
        prog = Compiled(name, module, (ids, pos), tokens,
                        handover=(KEY_PREFIX, VALUE_PREFIX) if name == "prefill" else ())
        out.append(prog)
    return out


def _ssm_programs(s: MeasureSettings, home: str, dtype: torch.dtype) -> list[Compiled]:
    from torch_tessera.models import build_module, get_model
    from torch_tessera.ssm_state import CONV_PREFIX, SSM_PREFIX, SSMStateLM

    p, b, _ = s.shape
    lm = build_module(s.model, s.size, device=home, dtype=dtype).model
    cut_layers(lm, s.family, s.kept_layers)
    spec = get_model(s.model)
    prefill = SSMStateLM(lm, 1).eval()
    (ids,) = spec.example_inputs(s.size, 1, p, device=home)
    out = [Compiled("prefill", prefill, (ids,), p, restore=_saved_state(prefill), handover=(CONV_PREFIX, SSM_PREFIX))]
    decode = SSMStateLM(lm, b).eval()
    (prompts,) = spec.example_inputs(s.size, b, p, device=home, seed=1)
    with torch.no_grad():
        decode(prompts)  # each sequence's state after its prompt: what a decode step continues from
    (ids,) = spec.example_inputs(s.size, b, 1, device=home, seed=2)
    out.append(Compiled("decode", decode, (ids,), 1, restore=_saved_state(decode)))
    return out


def _diffusion_programs(s: MeasureSettings, home: str, dtype: torch.dtype) -> list[Compiled]:
    from torch_tessera.models import build_module, get_model

    _, batch, _ = s.shape
    module = build_module(s.model, s.size, device=home, dtype=dtype)
    cut_layers(module.model, s.family, s.kept_layers)
    inputs = get_model(s.model).example_inputs(s.size, batch, device=home, dtype=dtype)
    return [Compiled("denoise", module, inputs)]


#: Family -> builder of its programs (see the module docstring).
BUILDERS = {"llm": _kv_programs, "moe": _kv_programs, "ssm": _ssm_programs, "diffusion": _diffusion_programs}


def build_programs(s: MeasureSettings, home: str) -> list[Compiled]:
    """The model's programs over one set of weights on ``home`` (random weights: bf16 on CUDA, fp32 on CPU), with
    their inputs and eager outputs (``want``), in the order a workload step runs them.

    Raises:
        ConfigError: ``s.kept_layers`` is more than the model has; or, on the CPU, the whole model's weights (built
            before the layers past ``kept_layers`` are dropped) would not fit in this machine's available memory.
    """
    dtype = torch.bfloat16 if home.startswith("cuda") else torch.float32
    if not home.startswith("cuda"):
        check_host_memory(s, dtype)
    progs = BUILDERS[s.family](s, home, dtype)
    with torch.no_grad():
        for prog in progs:
            prog.reset()
            prog.want = prog.module(*prog.inputs).clone()
    return progs


#: share of the host's available memory the whole model's weights may take (the programs, their inputs, caches and
#: the compiler need the rest)
HOST_MEMORY_SHARE = 0.6


def available_host_bytes() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes (Linux), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_host_memory(s: MeasureSettings, dtype: torch.dtype, available: int | None = None) -> None:
    """Refuse a CPU run whose model would not fit: the builders make the whole model (all its layers) at ``dtype``
    on the host before keeping ``s.kept_layers``, so its parameter bytes must stay under
    :data:`HOST_MEMORY_SHARE` of the available memory (``available`` bytes; default :func:`available_host_bytes`).

    Raises:
        ConfigError: naming the model's size in GB, the memory available, and the options that fit.
    """
    from torch_tessera.errors import ConfigError
    from torch_tessera.models import parameter_bytes

    available = available_host_bytes() if available is None else available
    if available is None:
        return
    need = parameter_bytes(s.model, s.size, dtype)
    if need <= HOST_MEMORY_SHARE * available:
        return
    raise ConfigError(
        f"--measure on the CPU builds the whole {s.size} {s.model} ({need / 1e9:.1f} GB of "
        f"{str(dtype).removeprefix('torch.')} weights, before keeping {s.kept_layers} layer(s)), and this machine has "
        f"{available / 1e9:.1f} GB of memory available: it would run out of memory. Use --size tiny to check plans on "
        "CPU virtual devices, or run --measure --size full on a machine with the GPUs (--devices cuda:0,cuda:1); "
        "without --measure, tessera bench predicts the full size from the cost model")


class _ArgsRecorder:
    """Stands in for a runner's executor for one call and keeps the graph inputs it was given."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.args = inner, []

    def __call__(self, args: list) -> list:
        self.args = list(args)
        return self.inner(args)


def compile_program(prog: Compiled, devices: str, cuda_graphs: bool) -> None:
    """Compile ``prog`` once with the tessera backend (home placement) and record its graph inputs.

    Raises:
        TesseraError: Dynamo split the module into several graphs (the bench needs one program per step).
    """
    from torch_tessera.backend.recording import RecordingBackend

    backend = RecordingBackend(devices=devices, policy="home", cuda_graphs=cuda_graphs)
    prog.fn = torch.compile(prog.module, backend=backend, dynamic=False)
    with torch.no_grad():
        prog()
        if len(backend.executors) != 1:
            raise TesseraError(f"{prog.name}: Dynamo produced {len(backend.executors)} graphs; the measured bench "
                               "needs one program per step (look for graph breaks with TORCH_LOGS=graph_breaks)")
        prog.runner = backend.executors[0]
        rec = _ArgsRecorder(prog.runner.executor)
        prog.runner.executor = rec
        try:
            prog()
        finally:
            prog.runner.executor = rec.inner
        prog.args = rec.args
