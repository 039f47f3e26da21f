"""``backend/``: the ``torch.compile`` entry point. Entry function: :func:`tessera_backend`; :func:`explain` says what
it did with each graph."""

from __future__ import annotations

import inspect
import logging
import os
from typing import Any, Callable, Sequence

import torch

from torch_tessera.backend.checks import check_compilable, in_user_terms, warn_idle_budgeted
from torch_tessera.backend.config import TesseraConfig
from torch_tessera.backend.costs import choose_costs, plan_source, resolve_costs, with_costs_note
from torch_tessera.backend.explain import (NO_PLAN_ONE_DEVICE, GraphRecord, abandon_record, add_executor,
                                           close_record, explain, open_record)
from torch_tessera.compat.dynamo import as_user_error
from torch_tessera.errors import (ConfigError, DeviceUnavailableError, GpuNotPresentError, InfeasiblePlanError,
                                  LoweringError, NotApplicableError, TesseraFallbackWarning, warn_user)

log = logging.getLogger("torch_tessera.backend")

__all__ = ["tessera_backend", "TesseraConfig", "register", "explain", "USER_ERRORS"]

#: The remedy when option ``devices`` names a GPU this machine does not have.
MISSING_GPU_FIX = ("Run on a machine with that GPU. On this one, options={'devices': 'cpu:0,cpu:1'} runs the split "
                   "program on two CPU virtual devices (to check it computes what eager does; not a speed figure); "
                   "for the plan your GPUs would get, compile with options={'devices': 'cpu:0,cpu:1', 'dump_dir': "
                   "'dump'} and run `tessera plan --program dump/program_0.json --devices cuda:0,cuda:1` (missing "
                   "GPUs are modelled as H200s; sim:NAME devices model others).")

#: Errors the user's input causes (options, devices, a policy that does not apply, a model that does not fit,
#: ``fallback="raise"``): the backend raises them to the caller of the compiled model as themselves. Any other error
#: is a tessera bug, left for Dynamo to report as ``BackendCompilerFailed``.
USER_ERRORS = (ConfigError, DeviceUnavailableError, InfeasiblePlanError, LoweringError, NotApplicableError)


def tessera_backend(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    options: dict | None = None,
    mode: str | None = None,
) -> Callable:
    """The ``"tessera"`` backend: config -> checks -> lower -> (analyse -> plan) -> executor, or the Inductor fallback.

    Args:
        gm: the FX graph Dynamo captured.
        example_inputs: its example inputs.
        options: see :class:`TesseraConfig` (unknown keys raise :class:`~torch_tessera.errors.ConfigError`).
        mode: ``torch.compile``'s mode; leave unset.

    Returns:
        A callable computing ``gm``.

    Raises:
        ConfigError: bad options.
        InfeasiblePlanError: the model does not fit the devices' memory (the message names the device, the bytes
            needed and available, and the option that set the budget).
        LoweringError: the graph could not be lowered (``InferenceOnlyError``: it needs a backward) and
            ``fallback="raise"``.
        DeviceUnavailableError: option ``devices`` names a device this machine does not have.
        NotApplicableError: option ``policy`` names a baseline that does not apply to the graph (``af`` without
            attention kernels).

    These errors (:data:`USER_ERRORS`) reach the caller of the compiled model as themselves, not wrapped in Dynamo's
    ``BackendCompilerFailed``, so ``except torch_tessera.ConfigError`` catches them.
    """
    try:
        return _compile_or_fall_back(gm, example_inputs, TesseraConfig.from_options(options, mode))
    except USER_ERRORS as e:  # Dynamo would wrap it in BackendCompilerFailed: let it reach the user as itself
        raise as_user_error(e, inspect.currentframe()) from e.__cause__


def _compile_or_fall_back(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                          config: TesseraConfig) -> Callable:
    """The graph compiled by tessera, or by Inductor after a warning when it cannot be lowered (unless
    ``config.fallback == "raise"``), with its :class:`GraphRecord` for :func:`explain`."""
    record = open_record(gm, example_inputs)
    try:
        try:
            check_compilable(gm, example_inputs)
            return close_record(record, _compile(gm, example_inputs, config, record))
        except LoweringError as e:
            if config.fallback == "raise":
                raise
            return close_record(record, _fallback(gm, example_inputs, e, record))
    except BaseException:  # a Dynamo restart (it calls the backend again) or an error: no graph of this call runs
        abandon_record(record)
        raise


def _fallback(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], error: LoweringError,
              record: GraphRecord) -> Callable:
    """Plain Inductor for ``gm``, after one :class:`TesseraFallbackWarning` naming the reason."""
    from torch._inductor.compile_fx import compile_fx

    record.backend, record.reason, record.executors = "fallback", str(error).splitlines()[0], []
    message = (f"tessera could not compile graph {record.compile_id or record.index} ({record.reason}); it runs with "
               "plain Inductor instead. Pass options={'fallback': 'raise'} to make this an error.")
    if not record.warned:  # a restarted attempt of the same compile was already warned about
        record.warned = True
        log.warning("%s", message)
        warn_user(message, TesseraFallbackWarning)
    inductor = compile_fx(gm, list(example_inputs))

    def run(*args: Any) -> Any:  # held by Dynamo, so the record sees when the graph is dropped
        return inductor(*args)

    return run


def _check_devices_present(config: TesseraConfig) -> None:
    """Raise :class:`~torch_tessera.errors.GpuNotPresentError` with :data:`MISSING_GPU_FIX` when option ``devices``
    names a GPU this machine does not have."""
    from torch_tessera.target.devices import check_present, parse_device

    for name in config.devices:
        try:
            check_present(parse_device(name))
        except GpuNotPresentError as e:
            raise e.with_fix(MISSING_GPU_FIX) from None


def _compile(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: TesseraConfig,
             record: GraphRecord) -> Callable:
    from torch_tessera.lowering import lower
    from torch_tessera.runtime.executor import ProgramExecutor

    def on_captured(captured: Any) -> Callable:
        if config.dump_dir:
            _dump(captured, config.dump_dir)
        graphs = resolve_cuda_graphs(config, captured.program.device)
        if config.devices or graphs:
            executor: Any = _placed_runner(captured, config, graphs, record)
        else:
            if config.costs == "measured":
                log.info("costs: option costs='measured' but option devices is not set: the program runs on one "
                         "device (%s), nothing is placed, so nothing is measured", captured.program.device)
                record.costs = NO_PLAN_ONE_DEVICE
            executor = ProgramExecutor(captured.program, captured.kernel_objects)
        executors.append(executor)
        add_executor(record, executor)
        record.from_cache += int(captured.from_cache)
        return executor

    _check_devices_present(config)  # before lowering: a missing GPU is said at once, not after the compile
    executors: list[Any] = []
    compiled = lower(gm, example_inputs, on_captured)
    return _with_executors(compiled, executors)


def resolve_cuda_graphs(config: TesseraConfig, home: str) -> bool | str:
    """``config.cuda_graphs`` with its default decided: ``"whole"`` when the program runs on CUDA devices, off on CPU."""
    if config.cuda_graphs is not None:
        return config.cuda_graphs
    devices = config.devices or (home,)
    return "whole" if all(d.strip().lower().startswith(("cuda", "gpu")) for d in devices) else False


def _placed_runner(captured: Any, config: TesseraConfig, graphs: bool | str, record: GraphRecord) -> Any:
    """analyse PTX -> build the DAG -> place -> the multi-device runner."""
    from torch_tessera.backend.pipeline import analyze, place
    from torch_tessera.target.devices import open_device
    from torch_tessera.runtime.runner import TesseraRunner

    program = captured.program
    try:
        devices = [open_device(d) for d in (config.devices or (program.device,))]
    except GpuNotPresentError as e:
        raise e.with_fix(MISSING_GPU_FIX) from None
    home = torch.device(program.device)
    if devices[0].torch_device.type != home.type or (home.type == "cuda" and devices[0].torch_device != home):
        raise ConfigError(
            f"the first device of option devices ({config.devices[0]}) must hold the model's tensors, which are on "
            f"{program.device}: list {program.device} first"
        )
    dag = analyze(program)
    specs = [d.spec for d in devices]
    choice = None
    if config.policy not in ("home", "random"):
        kind = resolve_costs(config.costs, bool(config.devices), specs)
        choice = choose_costs(program, devices, kind, captured.kernel_objects)
    try:
        placement, plan = place(program, dag, specs, config.policy, seed=config.seed,
                                **({"costs": choice.costs, "topology": choice.topology} if choice else {}),
                                **({"dump_dir": config.dump_dir} if config.dump_dir else {}))
    except InfeasiblePlanError as e:
        raise in_user_terms(e, specs, config) from None
    except NotApplicableError as e:
        raise NotApplicableError(f"option policy={config.policy!r} does not apply to this graph: {e}. Fix: use "
                                 "policy='throughput' (the planner's, the default)") from None
    if config.devices:
        warn_idle_budgeted(placement, specs, config)
    if choice is not None:
        record.costs = choice.summary
        record.launches_timed = (record.launches_timed or 0) + choice.launches_timed
    if plan is not None:
        record.plan_source = plan_source(plan)
        log.info("plan: %s", record.plan_source)
        plan = with_costs_note(plan, choice.summary) if choice is not None else plan
    return TesseraRunner(program, dag, devices, placement, captured.kernel_objects, plan=plan,
                         timeout_s=config.timeout_s, cuda_graphs=graphs,
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
