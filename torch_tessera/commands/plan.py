"""``tessera plan``: plan a model over devices, print the plan and every baseline, write a Gantt chart.

Examples::

    tessera plan --model llama-3.1-8b --devices sim:a100,sim:l40s            # model lowering: wired by the lead
    tessera plan --synthetic-layers 32 --devices big,small --policy latency  # a synthetic transformer, no lowering
    tessera plan --program dump/program_0.json --devices sim:a100,sim:l40s   # a dumped program (dump_dir option)

This module holds the rendering side: :func:`plan_all` (the policy and every baseline over one workload),
:func:`best_throughput` (the throughput plan chosen from a space holding every baseline's placement, as ``tessera
bench`` chooses tessera) and :func:`report` (the text). ``_model_inputs`` is the hook where the lead connects lowering and the cost model.
"""

from __future__ import annotations

import argparse
import difflib
import logging
from pathlib import Path
from typing import Mapping

from torch_tessera.errors import ConfigError, InfeasiblePlanError, TesseraError
from torch_tessera.graph.types import DependencyGraph
from torch_tessera.target.costs import CostTable, Topology
from torch_tessera.scheduler import NotApplicableError, Plan, Workload, available_baselines, plan
from torch_tessera.outpaths import DEFAULT_OUT_DIR
from torch_tessera.scheduler.gantt import write_gantt
from torch_tessera.scheduler.synthetic import DEVICE_PEAKS
from torch_tessera.scheduler.pipeline_plan import PipelineModel
from torch_tessera.scheduler.report import compare

log = logging.getLogger(__name__)

HELP = "plan a model over devices (lowered without weights): the plan, every baseline, a Gantt chart"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``tessera plan``."""
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="registry model name, e.g. llama-3.1-8b (lowered with fake weights)")
    src.add_argument("--synthetic-layers", type=int, metavar="N",
                     help="plan a synthetic N-layer transformer (prefill + decode) instead of a model")
    src.add_argument("--program", metavar="FILE",
                     help="plan a program the backend dumped (options={'dump_dir': ...} writes program_<n>.json), "
                          "without lowering: its PTX accesses are derived again from the kernel sources it holds")
    parser.add_argument("--devices", required=True,
                        help="comma-separated devices, e.g. sim:a100,sim:l40s; with --synthetic-layers the synthetic "
                             f"devices {', '.join(sorted(DEVICE_PEAKS))}, e.g. big,small")
    parser.add_argument("--size", default="full", choices=["full", "tiny"], help="model size (default: full)")
    parser.add_argument("--policy", default="throughput", choices=["throughput", "latency"],
                        help="what the plan minimises: throughput (cycle time per step) or latency (one request's "
                             "prefill + decode) (default: throughput)")
    parser.add_argument("--micro-batches", type=int, default=2,
                        help="micro-batches in flight (throughput); at the default 2 the planner also tries more where the "
                             "simulator says they help (the plan prints the count it chose); another value is used as given")
    parser.add_argument("--time-limit", type=float, default=10.0, help="solver time limit, seconds")
    parser.add_argument("--memory", default=None,
                        help="per-device budgets, comma-separated: GB (80,48) or sizes (40GB,512MB) (default: the "
                             "devices' memory)")
    parser.add_argument("--output-tokens", type=float, default=129.0,
                        help="mean output tokens per request: decode runs per prefill (default: 129, as tessera bench: "
                             "the conversation workload's mean)")
    parser.add_argument("--gantt", default=f"{DEFAULT_OUT_DIR}/tessera_plan.png",
                        help=f"Gantt chart PNG path ('' to skip; default: {DEFAULT_OUT_DIR}/tessera_plan.png, where "
                             "every command writes its files)")
    parser.add_argument("--no-baselines", action="store_true", help="plan only the chosen policy")
    parser.add_argument("--no-cache", action="store_true", help="do not read or write the plan cache")
    parser.add_argument("--dump-dir", default=None,
                        help="write every MILP solved as milp_<n>.mps and every plan as plan_<policy>_<n>.json there")


def plan_all(dag_or_workload: DependencyGraph | Workload, costs: CostTable | Mapping[str, CostTable] | None,
             topology: Topology, policy: str = "throughput", baselines: bool = True,
             **options) -> dict[str, Plan | TesseraError]:
    """The chosen policy and (with ``baselines``) the other policy and every baseline, each a plan or the error that
    makes it n/a.

    ``options`` go to :func:`torch_tessera.scheduler.plan` (memory_budgets, micro_batches, time_limit, cache_dir).
    Baselines use the policy's objective (cycle time for throughput, latency for latency).
    """
    objective = "cycle" if policy == "throughput" else "latency"
    names = [policy]
    if baselines:
        names += ["latency" if policy == "throughput" else "throughput"] + available_baselines(len(topology.devices))
    out: dict[str, Plan | TesseraError] = {}
    for name in names:
        kw = dict(options)
        if name not in ("throughput", "latency"):
            kw.pop("cache_dir", None)
            kw["objective"] = objective
        try:
            out[name] = plan(dag_or_workload, costs, topology, policy=name, **kw)
        except (NotApplicableError, InfeasiblePlanError) as e:
            out[name] = e
    return out


#: The throughput planner's own placement, kept beside ``throughput`` when another plan of its space is predicted faster.
PLANNER = "throughput-planner"


def step_seconds(p: Plan) -> float:
    """Seconds per workload step ``tessera plan`` ranks throughput plans by: the simulated step of the plan's
    pipelined schedules (:attr:`Plan.simulated_seconds`, what the planner scores its own placements by), or, for a
    plan that is not simulated (request-dist's replicas: no cut edge, each replica alone on its GPU), its cycle,
    which is what the simulator takes for programs each wholly on their own device."""
    return p.simulated_seconds if p.simulated_seconds is not None else p.cycle_seconds


def best_throughput(plans: Mapping[str, Plan | TesseraError], workload: Workload, topology: Topology,
                    **stream_options) -> tuple[dict[str, Plan | TesseraError], str]:
    """``plans`` with ``throughput`` the fastest plan of a space that contains every baseline's placement: the
    planner's single placement, one request stream per device (:func:`~torch_tessera.scheduler.plan_streams`, whose
    space holds request-dist), and each baseline plan in ``plans`` (homo-*, request-dist, pd, af, layer); the space
    ``tessera bench`` chooses tessera from (:func:`torch_tessera.benchmark.choose_tessera`), ranked here by
    :func:`step_seconds` (the simulated step, the planner's own score). So no baseline's simulated step is below the
    throughput plan's. When another plan wins, the planner's own placement stays as :data:`PLANNER` and the note
    gives its simulated step beside the best baseline's, and why its cycle differs when it does by more than 10 %.

    Args:
        plans: :func:`plan_all`'s result for the throughput policy (with its baselines).
        workload / topology: what they were planned on (a DAG instead of a workload: no streams plan).
        stream_options: passed to :func:`~torch_tessera.scheduler.plan_streams` (``micro_batches``...).

    Returns:
        ``(plans, note)``: the note names the plan chosen and why (empty when the planner's placement stays).
    """
    from torch_tessera.benchmark import SINGLE, choose_tessera

    mine = plans.get("throughput")
    if not isinstance(mine, Plan):
        return dict(plans), ""
    work = {("tessera" if k == "throughput" else k): v for k, v in plans.items() if k != "latency"}
    rank = dict(score=step_seconds, scored="simulated step")
    try:
        choice = choose_tessera(work, workload if isinstance(workload, Workload) else None, topology, **rank,
                                **stream_options)
    except (NotApplicableError, ValueError) as e:
        log.warning("throughput plan: the one-request-stream-per-device plan was not made (%s)", e)
        choice = choose_tessera(work, streams=False, **rank)
    out = dict(plans)
    if choice.chosen == "tessera":
        return out, ""
    out["throughput"] = choice.plans["tessera"]
    out[PLANNER] = choice.plans[SINGLE]
    note = ("throughput plan: " + choice.note.replace("tessera = ", "", 1).replace("tessera's space",
            "a space holding every baseline's placement").replace(SINGLE, PLANNER))
    return out, note + "\n" + _planner_line(mine, work, topology)


def _planner_line(mine: Plan, work: Mapping[str, Plan | TesseraError], topology: Topology) -> str:
    """The planner's single placement against the best baseline, both by :func:`step_seconds`; and, when its cycle
    is more than 10 % off its simulated step, how much of the cycle is the per-cut charge the simulator replaces."""
    import numpy as np

    from torch_tessera.scheduler.modulo import WAIT_SECONDS

    base = {k: v for k, v in work.items() if k != "tessera" and isinstance(v, Plan)}
    line = f"{PLANNER} (the planner's single placement): simulated {step_seconds(mine) * 1e3:.4g} ms/step"
    if base:
        best = min(base, key=lambda k: step_seconds(base[k]))
        line += (f", {step_seconds(base[best]) / step_seconds(mine):.2f}x the best baseline, {best} "
                 f"({step_seconds(base[best]) * 1e3:.4g} ms/step)")
    sim = mine.simulated_seconds
    if sim is None or abs(mine.cycle_seconds - sim) <= 0.1 * sim:
        return line + "."
    line += f". Its cycle/step, {mine.cycle_seconds * 1e3:.4g} ms, is {mine.cycle_seconds / sim:.2f}x that"
    hop = np.asarray(topology.hop_overhead if topology.hop_overhead is not None else 0.0, dtype=float)
    busiest = int(np.argmax(mine.device_seconds)) if mine.device_seconds else 0
    charged = mine.hop_seconds[busiest] if len(mine.hop_seconds) > busiest else 0.0
    if mine.cut_edges and charged > 0.05 * mine.cycle_seconds:
        line += (f": {charged * 1e3:.4g} ms of it on {mine.devices[busiest]} is the cycle model's per-cut charge "
                 f"({float(hop.max()) * 1e6:.3g} us per cut edge per micro-batch on both GPUs, and a share of each "
                 f"copy; docs/BENCHMARKS.md, per-hop charge) over its {len(mine.cut_edges)} cut edges, where the "
                 f"simulator charges a {WAIT_SECONDS * 1e6:.3g} us wait and the link")
    else:
        line += (": the cycle model assumes micro-batches overlap across steps, the simulator runs each step's "
                 "micro-batches with their fill and drain")
    return line + "."


def report(plans: Mapping[str, Plan | TesseraError], policy: str) -> str:
    """The chosen plan's summary, then one comparison line per plan (speed-ups against the first ``homo-*``)."""
    main = plans[policy]
    head = main.summary() if isinstance(main, Plan) else f"{policy}: {main}"
    ref = next((k for k in plans if k.startswith("homo-") and isinstance(plans[k], Plan)), None)
    return head + "\n\n" + compare(plans, ref)


def _synthetic_inputs(args: argparse.Namespace) -> tuple[Workload, Topology, PipelineModel]:
    from torch_tessera.scheduler import synthetic

    given = [d.strip() for d in args.devices.split(",")]
    devices = tuple(d.removeprefix("sim:") for d in given)
    unknown = [g for g, d in zip(given, devices) if d not in synthetic.DEVICE_PEAKS]
    if unknown:
        raise ConfigError(f"option --devices={args.devices!r}: --synthetic-layers plans on the synthetic devices "
                          f"{', '.join(sorted(synthetic.DEVICE_PEAKS))}, not {', '.join(unknown)}; "
                          "e.g. --devices big,small")
    pre = synthetic.transformer_dag(args.synthetic_layers, tokens=1024, context=1024)
    dec = synthetic.transformer_dag(args.synthetic_layers, tokens=64, context=1024)
    wl = Workload.llm(pre, synthetic.roofline_costs(pre, devices), dec, synthetic.roofline_costs(dec, devices),
                      args.output_tokens)
    topo = synthetic.nvlink_topology(devices)
    return wl, topo, PipelineModel.from_names(topo.devices)


def _program_inputs(args: argparse.Namespace) -> tuple[Workload, Topology, PipelineModel]:
    """Load ``args.program``, analyse its PTX accesses, cost it on ``args.devices``: a one-program workload.

    Raises:
        ProgramFileError: the file is missing, malformed or of another format version.
    """
    from torch_tessera.backend.pipeline import analyze, estimate
    from torch_tessera.lowering.serialize import load_program
    from torch_tessera.target.devices import parse_devices

    program = load_program(args.program)
    specs = parse_devices(args.devices, assume_gpu="h200")
    _say_assumed(specs)
    dag = analyze(program)
    costs, topology = estimate(program, specs)
    print(f"loaded {args.program}: {len(program.launches)} launches lowered for {program.device}")
    return Workload.single(dag, costs), topology, PipelineModel.from_specs(specs)


def _model_inputs(args: argparse.Namespace) -> tuple[Workload, Topology, PipelineModel]:
    """Lower ``args.model`` without weights (prefill and decode graphs for LLMs) and cost it on ``args.devices``."""
    from torch_tessera.backend.workload import model_workload
    from torch_tessera.target.devices import parse_devices

    name = _registry_name(args.model)  # before the long lowering starts
    specs = parse_devices(args.devices, assume_gpu="h200")
    _say_assumed(specs)
    print(f"lowering {args.model} ({args.size}) without its weights, then PTX analysis and costs (the first time up "
          "to two minutes for llama-3.1-8b on a 2-core CPU; seconds once the program cache holds it)", flush=True)
    mw = model_workload(name, specs, size=args.size, mean_output_tokens=args.output_tokens)
    print(f"lowered, analysed and costed {args.model} ({args.size}) in {mw.seconds:.1f} s")
    return mw.workload, mw.topology, PipelineModel.from_specs(specs)


def _say_assumed(specs) -> None:
    """Print :func:`~torch_tessera.target.devices.assumed_note` when some GPU named is planned from the catalog."""
    from torch_tessera.target.devices import assumed_note

    note = assumed_note(specs)
    if note:
        print(note)


#: Names users type for registry models.
MODEL_ALIASES = {"llama-3.1-8b": "llama", "mixtral-8x7b": "moe", "mamba-2.8b": "mamba", "sd3.5-medium": "dit"}


def _registry_name(model: str) -> str:
    """The registry name of ``--model`` (an alias such as ``llama-3.1-8b`` or a registry name).

    Raises:
        UnsupportedModelError: an unknown name; the message lists the registry names and the aliases.
    """
    from torch_tessera.errors import UnsupportedModelError
    from torch_tessera.models import REGISTRY

    name = MODEL_ALIASES.get(model, model)
    if name in REGISTRY:
        return name
    known = sorted([*REGISTRY, *MODEL_ALIASES])
    close = difflib.get_close_matches(model, known, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    listed = ", ".join(f"{k} (= {MODEL_ALIASES[k]})" if k in MODEL_ALIASES else k for k in known)
    raise UnsupportedModelError(f"unknown model {model!r}.{hint} Available: {listed}")


def _gigabytes(text: str) -> list[float]:
    """``--memory``'s per-device budgets in GB (comma-separated positive numbers of GB, or sizes with a unit as in a
    device string's ``mem=``: ``40GB``, ``40GiB``, ``512MB``)."""
    from torch_tessera.target.devices import parse_size

    def one(x: str) -> float:
        try:
            return float(x)
        except ValueError:
            return parse_size(x) / 1e9

    try:
        values = [one(x) for x in text.split(",")]
    except ValueError:
        raise ConfigError(f"option --memory={text!r} must be budgets in GB separated by commas, e.g. 80,48 "
                          "(or sizes with a unit: 40GB,512MB)") from None
    if any(not v > 0 for v in values):
        raise ConfigError(f"option --memory={text!r}: every budget must be a positive number of GB")
    return values


def _check_budget_count(memory: str, devices: str) -> None:
    """``--memory`` gives one budget per ``--devices`` entry (checked before any work)."""
    names = [d.strip() for d in devices.split(",")]
    n = len(memory.split(","))
    if n != len(names):
        raise ConfigError(f"option --memory={memory!r} gives {n} budget(s) for {len(names)} devices "
                          f"({', '.join(names)}): give one per device of --devices, in its order, e.g. "
                          f"--memory {','.join(['80'] * len(names))}")


def _in_cli_terms(error: TesseraError, memory: str | None) -> TesseraError:
    """An infeasible plan's error with its fix named in ``tessera plan``'s options (``--memory``, ``--devices``),
    not the scheduler's ``memory_budgets``; other errors as they are."""
    if not isinstance(error, InfeasiblePlanError) or "memory_budgets" not in str(error):
        return error
    head = str(error).split(" Fix: ")[0]
    budget = (f"raise --memory (now {memory} GB)" if memory else
              "pass larger budgets with --memory (now the devices' memory)")
    return InfeasiblePlanError(f"{head} Fix: {budget}, add a device to --devices, or use a plan that spreads the "
                               "weights", error.shortfalls, error.lower_bound)


def run(args: argparse.Namespace) -> int:
    budgets = [g * 1e9 for g in _gigabytes(args.memory)] if args.memory else None  # checked before any work
    if args.memory:
        _check_budget_count(args.memory, args.devices)
    inputs = _synthetic_inputs if args.synthetic_layers else _program_inputs if args.program else _model_inputs
    wl, topo, model = inputs(args)
    throughput = args.policy == "throughput"
    plans = plan_all(wl, None, topo, args.policy, throughput or not args.no_baselines, memory_budgets=budgets,
                     micro_batches=args.micro_batches, time_limit=args.time_limit,
                     cache_dir=False if args.no_cache else None, pipeline=model,
                     **({"dump_dir": args.dump_dir} if args.dump_dir else {}))
    note = ""
    if throughput:  # chosen from a space holding every baseline's placement, so never below one's prediction
        plans, note = best_throughput(plans, wl, topo, micro_batches=args.micro_batches, memory_budgets=budgets)
        if args.no_baselines:
            plans = {k: v for k, v in plans.items() if k in ("throughput", PLANNER)}
    plans = {k: _in_cli_terms(v, args.memory) if isinstance(v, TesseraError) else v for k, v in plans.items()}
    print(report(plans, args.policy))
    if note:
        print(note)
    chosen = plans[args.policy]
    if args.gantt and isinstance(chosen, Plan):
        path = write_gantt(chosen, wl, None, topo, Path(args.gantt), pipeline=model)
        print(f"\nGantt chart: {path}")
    return 0 if isinstance(chosen, Plan) else 1
