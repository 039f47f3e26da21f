"""``backend/``: the ``torch.compile`` entry point. Entry function: :func:`tessera_backend`."""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Sequence

import torch

from torch_tessera.backend.config import TesseraConfig
from torch_tessera.errors import LoweringError

log = logging.getLogger("torch_tessera.backend")

__all__ = ["tessera_backend", "TesseraConfig", "register"]


def tessera_backend(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    options: dict | None = None,
    mode: str | None = None,
) -> Callable:
    """The ``"tessera"`` backend: lower -> capture the kernel program -> run it with our executor.

    Args:
        gm: the FX graph Dynamo captured.
        example_inputs: its example inputs.
        options: see :class:`TesseraConfig` (unknown keys raise :class:`~torch_tessera.errors.ConfigError`).
        mode: ``torch.compile``'s mode; leave unset.

    Returns:
        A callable computing ``gm``.

    Raises:
        ConfigError: bad options.
        LoweringError: the graph could not be lowered and ``fallback="raise"``.
    """
    config = TesseraConfig.from_options(options, mode)
    try:
        return _compile(gm, example_inputs, config)
    except LoweringError as e:
        if config.fallback == "raise":
            raise
        log.warning(
            "tessera could not lower this graph (%s); running it with plain Inductor instead. "
            "Pass options={'fallback': 'raise'} to make this an error.",
            e,
        )
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(gm, list(example_inputs))


def _compile(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: TesseraConfig) -> Callable:
    from torch_tessera.lowering import lower
    from torch_tessera.runtime.executor import ProgramExecutor

    executors: list[Any] = []

    def on_captured(captured: Any) -> Callable:
        if config.dump_dir:
            _dump(captured, config.dump_dir)
        if config.devices or config.cuda_graphs:
            executor: Any = _placed_runner(captured, config)
        else:
            executor = ProgramExecutor(captured.program, captured.kernel_objects)
        executors.append(executor)
        return executor

    compiled = lower(gm, example_inputs, on_captured)
    return _with_executors(compiled, executors)


def _placed_runner(captured: Any, config: TesseraConfig) -> Any:
    """analyse PTX -> build the DAG -> place -> the multi-device runner."""
    from torch_tessera.backend.pipeline import analyze, place
    from torch_tessera.target.devices import open_device
    from torch_tessera.runtime.runner import TesseraRunner

    program = captured.program
    devices = [open_device(d) for d in (config.devices or (program.device,))]
    home = torch.device(program.device)
    if devices[0].torch_device.type != home.type or (home.type == "cuda" and devices[0].torch_device != home):
        raise LoweringError(
            f"the first device ({config.devices[0]}) must hold the model's tensors, which are on {program.device}"
        )
    dag = analyze(program)
    placement, plan = place(program, dag, [d.spec for d in devices], config.policy, seed=config.seed,
                            **({"dump_dir": config.dump_dir} if config.dump_dir else {}))
    return TesseraRunner(program, dag, devices, placement, captured.kernel_objects, plan=plan,
                         timeout_s=config.timeout_s, cuda_graphs=config.cuda_graphs,
                         graph_copies=config.graph_copies, priority_class=config.priority,
                         static_inputs=config.static_inputs)


def _with_executors(fn: Callable, executors: list) -> Callable:
    """``fn`` with ``tessera_executors`` attached: one executor (holding its ``program``) per inner graph."""

    def run(*args: Any) -> Any:
        return fn(*args)

    run.tessera_executors = executors  # type: ignore[attr-defined]
    return run


def _dump(captured: Any, dump_dir: str) -> None:
    from torch_tessera.lowering.serialize import dump_program

    os.makedirs(dump_dir, exist_ok=True)
    n = len([f for f in os.listdir(dump_dir) if f.startswith("program_")])
    dump_program(captured.program, os.path.join(dump_dir, f"program_{n}.json"))  # lowering.load_program reads it
    for name, src in captured.program.kernels.items():
        with open(os.path.join(dump_dir, f"{name}.py"), "w") as f:
            f.write(src.source)
    log.info("dumped program %d to %s", n, dump_dir)


def register() -> None:
    """Register ``"tessera"`` with Dynamo (done on ``import torch_tessera``; the entry point covers the rest)."""
    from torch._dynamo import list_backends, register_backend

    if "tessera" not in list_backends(exclude_tags=()):
        register_backend(name="tessera")(tessera_backend)
