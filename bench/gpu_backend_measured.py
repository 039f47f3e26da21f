"""Plans from measurements (issue 24, item 2) on one GPU: HF generate with Llama-3.1-8B's shape under tessera with
measured costs on the whole GPU and on two green-context partitions, against the cost model, and the warm caches.

ONE process (a child of this script) builds ``LlamaForCausalLM`` (``build_llama`` of ``gpu_backend_default.py``:
the registry's full Llama config, ``--layers`` decoder layers, random bf16 weights, no download) and runs greedy
``generate`` (batch ``--batch``, prompt ``--prompt``, ``--new`` new tokens, static cache, ``model.forward`` compiled
with ``dynamic=False``) in three cases, in this order:

* ``cuda:0``: ``options={"devices": "cuda:0"}`` (costs ``"auto"``: measured);
* ``pair``: ``options={"devices": "cuda:0@104sm,cuda:0@24sm"}`` (measured);
* ``pair-model``: the same with ``costs="model"``.

The profile and plan caches start empty (``TESSERA_CACHE_DIR=<out>/cache``, removed first). Each case: the first
``generate`` (compile, profiling and planning included) is timed, then ``--repeats`` more; ``compile_s`` = first
generate - median generate, ``ms_per_token`` = median generate / ``--new``. Tokens are compared with the ``cuda:0``
case; ``explain`` is ``str(torch_tessera.explain(model.forward))``, ``launches_timed`` its (distinct launch, device)
pairs timed while compiling. Then a SECOND fresh process repeats ``pair`` with the caches warm: it must time 0
launches and reuse every plan (``plan_sources`` all "reused from the plan cache").

Writes ``backend_measured.json`` and ``backend_measured.md`` (a short table) under ``--out``::

    python bench/gpu_backend_measured.py --out $OUT/backend_measured

CPU dry run of the logic (tiny model, CPU virtual devices, costs="measured", Triton's interpreter; numbers
meaningless)::

    TRITON_INTERPRET=1 python bench/gpu_backend_measured.py --out /tmp/bm --device cpu --size tiny --layers 1 \\
        --batch 1 --prompt 8 --new 3 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from gpu_backend_default import build_llama, timed_generates  # this directory is on sys.path when the script runs

PAIR = "cuda:0@104sm,cuda:0@24sm"
CASES = {"cuda:0": {"devices": "cuda:0"}, "pair": {"devices": PAIR}, "pair-model": {"devices": PAIR, "costs": "model"}}


def _options(name: str, device: str) -> dict:
    """The case's options; on a CPU dry run the devices are CPU virtual ones and measuring is asked for."""
    opts = dict(CASES[name])
    if device == "cpu":
        opts["devices"] = "cpu:0" if opts["devices"] == "cuda:0" else "cpu:0,cpu:1"
        opts.setdefault("costs", "measured")
    return opts


def run_cases(args: argparse.Namespace, cases: list[str]) -> dict:
    """One process: build the model once, then each case (compile, first generate, timed repeats, explain)."""
    import torch

    import torch_tessera

    model, ids = build_llama(args.size, args.layers, args.batch, args.prompt, args.device)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    kw = dict(max_new_tokens=args.new, min_new_tokens=args.new, do_sample=False, cache_implementation="static",
              disable_compile=True)
    orig = model.forward
    out: dict = {"layers": args.layers, "torch": torch.__version__, "cases": {}}
    ref = None
    for name in cases:
        torch._dynamo.reset()
        opts = _options(name, args.device)
        model.forward = torch.compile(orig, backend="tessera", options=opts, dynamic=False)
        row: dict = {"options": opts}
        try:
            seq, first, walls, caught = timed_generates(model, ids, kw, args.repeats, sync)
            med = statistics.median(walls)
            # this case's graphs: those of earlier cases (same code, dropped by dynamo.reset) have no live program
            reports = [r for r in torch_tessera.explain(model.forward) if r.programs or r.backend != "tessera"]
            ref = seq if ref is None else ref
            row.update(first_generate_s=first, compile_s=first - med, generate_s=walls,
                       ms_per_token=1e3 * med / args.new, tokens_equal_first_case=bool(torch.equal(seq, ref)),
                       explain="\n".join(r.line() for r in reports),
                       launches_timed=sum(r.launches_timed or 0 for r in reports),
                       plan_sources=[r.plan_source for r in reports],
                       backends=[r.backend for r in reports],
                       warnings=sorted({f"{w.category.__name__}: {str(w.message)[:300]}" for w in caught
                                        if "tessera" in w.category.__name__.lower()}))
        except Exception as e:  # noqa: BLE001 - a failed case is a result; the others still run
            row["error"] = f"{type(e).__name__}: {str(e)[:2000]}"
        model.forward = orig
        out["cases"][name] = row
        if args.result:  # after every case: a child stopped by its time limit still leaves what it measured
            Path(args.result).write_text(json.dumps(out, indent=1))
        print(f"{name}: " + (row.get("error") or f"{row['ms_per_token']:.2f} ms/token, compile {row['compile_s']:.1f}"
              f" s, {row['launches_timed']} launches timed, tokens equal {row['tokens_equal_first_case']}"),
              flush=True)
    return out


def _child(args: argparse.Namespace, cases: list[str], tag: str, timeout: float) -> dict:
    path = Path(args.out) / f"{tag}.json"
    path.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "--out", args.out, "--layers", str(args.layers), "--cases", ",".join(cases),
           "--device", args.device, "--size", args.size, "--batch", str(args.batch), "--prompt", str(args.prompt),
           "--new", str(args.new), "--repeats", str(args.repeats), "--result", str(path)]
    env = {**os.environ, "TESSERA_CACHE_DIR": str(Path(args.out) / "cache")}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, timeout=max(timeout, 1.0), capture_output=True, text=True, env=env)
        log = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        log = f"timed out after {timeout:.0f} s\n{(e.stdout or b'')!s}"[-4000:]
    (Path(args.out) / f"{tag}.log").write_text(log)
    res = json.loads(path.read_text()) if path.exists() else {}
    if "timed out" in log[:40] or not path.exists():
        res["error"] = log[-3000:]
    res["process_s"] = time.perf_counter() - t0
    return res


def table(main: dict, warm: dict) -> str:
    """Markdown: one row per case (and the warm repeat), ms/token relative to the cuda:0 case."""
    cases = main.get("cases", {})
    base = cases.get("cuda:0", {}).get("ms_per_token")
    rows = ["| case | compile s | ms/token | vs cuda:0 | launches timed | plan | tokens = cuda:0 |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in [*cases.items(), *(("pair (warm, new process)", r) for r in warm.get("cases", {}).values())]:
        if "error" in r:
            rows.append(f"| {name} | error: {r['error'][:120]} | | | | | |")
            continue
        rel = f"{r['ms_per_token'] / base:.2f}x" if base else "-"
        plans = "; ".join(sorted({(p or "-").split(" (")[0] for p in r["plan_sources"]}))
        rows.append(f"| {name} | {r['compile_s']:.1f} | {r['ms_per_token']:.2f} | {rel} | {r['launches_timed']} | "
                    f"{plans} | {r['tokens_equal_first_case']} |")
    for tag, run in (("first process", main), ("warm process", warm)):
        if "error" in run or "skipped" in run:
            rows.append(f"\n{tag}: {(run.get('error') or run.get('skipped')).strip().splitlines()[-1][:300]}")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for backend_measured.json/.md, the logs and the cache")
    ap.add_argument("--layers", type=int, default=8, help="decoder layers")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=32, help="new tokens per generate")
    ap.add_argument("--repeats", type=int, default=2, help="timed generates after the first (median)")
    ap.add_argument("--budget-s", type=float, default=280.0, help="seconds for both processes together")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help=argparse.SUPPRESS)
    ap.add_argument("--size", default="full", choices=("full", "tiny"), help=argparse.SUPPRESS)
    ap.add_argument("--cases", default=None, help=argparse.SUPPRESS)  # child mode
    ap.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.result is not None:  # child: one process
        run_cases(args, args.cases.split(","))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "cache", ignore_errors=True)  # the first process starts with empty profile/plan caches
    t0 = time.perf_counter()
    main_run = _child(args, list(CASES), "main", args.budget_s)
    left = args.budget_s - (time.perf_counter() - t0)
    warm = _child(args, ["pair"], "warm", left) if left > 20 else {"skipped": "time budget spent"}
    md = table(main_run, warm)
    report = {"args": vars(args), "main": main_run, "warm": warm, "table": md, "wall_s": time.perf_counter() - t0}
    (out / "backend_measured.json").write_text(json.dumps(report, indent=1))
    (out / "backend_measured.md").write_text(md + "\n")
    print(md)
    for name, r in [*main_run.get("cases", {}).items(), *(("warm " + k, v) for k, v in warm.get("cases", {}).items())]:
        print(f"\n## {name}\n{r.get('explain', r.get('error', ''))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
