"""Greedy generation of a Llama-3.1-8B-sized model (random bf16 weights, static KV cache) on two devices (CUDA).

Compares, for 32 new tokens: eager, single-GPU Inductor, and tessera with ``--policy`` on ``--devices`` (default: the
attention kernels on a 72-SM green context of GPU 1, the rest on the whole GPU 0: cuts in every layer), with and
without CUDA graphs. Reports token equality with Inductor, the logits cosine of every step before the first differing
token (steps after it see different prefixes), the reference's top-1 / top-2 logit margin where tokens first differ
(a near-tie there means numerics, not a bug), and time per decode step. Writes generate.json under --out.

The issue-5 check (Must-show: under a plan with at least one cut per layer, decode logits agree with single-GPU
Inductor, cosine >= 0.999, and 32 greedy tokens are identical) is one command::

    python3 bench/gpu_generate_check.py --out $OUT/gen --layers 32 --graphs --graph-copies push --policy af \\
        --skip "eager,tessera af" --sdpa efficient --repeat-reference

(Inductor in this process, ``tessera af +graphs`` with push copies in a child process started at once, so that its
compile overlaps the reference's; it waits for ``reference.pt`` before comparing.) Each tessera row holds
the cut edges of every program per decoder layer (``cut_edges_per_layer``: prefill and decode), the decode steps'
minimum logits cosine before the first differing token, and ``must_show``: each condition and whether all hold.

Exact equality needs a reference that reproduces itself: ``--repeat-reference`` compiles Inductor a second time and
compares it with the first. Measured 2026-11-30 on two H200s (torch 2.11, docs/BENCHMARKS.md, session 7): with
``--sdpa efficient`` (the memory-efficient attention kernel alone) two Inductor compiles gave the same 32 tokens and
bitwise the same logits, and so did tessera's af plan. With ``--deterministic`` (Inductor's deterministic mode,
``torch._inductor.config.deterministic``) two Inductor compiles already disagreed (7-8 of 8 sequences, with either
attention kernel), and cuDNN's attention (PyTorch's default there) changed its output between two runs on identical
inputs (``bench/gpu_launch_bitwise.py``).
CUDA-graph cases run in a child process (``--only``, output in ``child_<case>.log``), so a device-side assert there
cannot end the other cases; children run beside this process, so their ms/token and the in-process cases' may overlap
(compare speeds from runs without children).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

from torch_tessera.backend.recording import RecordingBackend
from torch_tessera.measure.gpu_checks import must_show, must_show_summary, per_layer_cuts

NEW = 32
#: ``--sdpa`` choices -> the ``torch.backends.cuda`` switch of each backend (the chosen one alone stays on)
SDPA_BACKENDS = {"default": None, "cudnn": "enable_cudnn_sdp", "efficient": "enable_mem_efficient_sdp",
                 "flash": "enable_flash_sdp", "math": "enable_math_sdp"}


def use_sdpa(backend: str) -> None:
    """Leave only ``backend`` (a key of :data:`SDPA_BACKENDS`) among the attention kernels; ``"default"``: no change."""
    if backend != "default":
        for name, switch in SDPA_BACKENDS.items():
            if switch is not None:
                getattr(torch.backends.cuda, switch)(name == backend)


def build_llama(size: str, layers: int, batch: int, prompt: int, device: str) -> tuple:
    """The Llama-3.1-8B-shaped model (``size`` of the registry, ``layers`` decoder layers, SDPA attention, random bf16
    weights from seed 0, eval mode) on ``device``, and ``batch`` random prompts of ``prompt`` token ids."""
    from transformers import LlamaForCausalLM

    from torch_tessera.models import llama_config

    cfg = llama_config(size)
    cfg.num_hidden_layers = layers
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    return model, torch.randint(0, cfg.vocab_size, (batch, prompt), device=device)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--devices", default="cuda:0,cuda:1@72sm")
    ap.add_argument("--policy", default="af")
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--sdpa", default="default", choices=tuple(SDPA_BACKENDS),
                    help="the only scaled-dot-product-attention backend enabled, for every case (default: PyTorch's "
                         "choice: cuDNN's on the H200 with torch 2.11)")
    ap.add_argument("--repeat-reference", action="store_true",
                    help="also compile Inductor a second time and compare it with the first (its own reproducibility)")
    ap.add_argument("--graphs", action="store_true", help="also run each policy with CUDA graphs (child process)")
    ap.add_argument("--graph-copies", default="link", choices=("link", "producer", "push"),
                    help="how copies inside the one CUDA graph run (the backend's graph_copies option)")
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # "cpu": a smoke run of this script's logic
    ap.add_argument("--size", default="full", choices=("full", "tiny"), help=argparse.SUPPRESS)
    ap.add_argument("--skip", default="", help="comma-separated case names not to run (e.g. 'tessera af,eager')")
    ap.add_argument("--only", default=None, help="run this one case (and the Inductor reference) only")
    ap.add_argument("--in-child", default="graphs", choices=("graphs", "all"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.only:
        import logging

        logging.basicConfig(level=logging.WARNING)
        logging.getLogger("torch_tessera").setLevel(logging.INFO)
    if args.deterministic:
        import torch._inductor.config as inductor_config

        if not hasattr(inductor_config, "deterministic"):
            print("this torch has no torch._inductor.config.deterministic", file=sys.stderr)
            return 2
        inductor_config.deterministic = True
    use_sdpa(args.sdpa)
    from torch_tessera.runtime.schedule import cut_edge_count, cut_edges_per_layer

    model, ids = build_llama(args.size, args.layers, args.batch, args.prompt, args.device)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    kw = dict(max_new_tokens=NEW, do_sample=False, cache_implementation="static", disable_compile=True,
              return_dict_in_generate=True, output_logits=True)
    res: dict = {"args": vars(args), "torch": torch.__version__, "runs": {}, "errors": {}, "must_show": {}}
    orig_forward = model.forward

    def run(name, forward):
        model.forward = forward
        with torch.no_grad():
            out = model.generate(ids, **kw)  # compiles
            sync()
            t0 = time.perf_counter()
            out = model.generate(ids, **kw)
            sync()
            wall = time.perf_counter() - t0
        model.forward = orig_forward
        logits = torch.stack([x.float() for x in out.logits])
        return out.sequences, logits, wall

    ref_seq = ref_logits = None
    cases = [("inductor", "inductor"), ("eager", None)]
    if args.repeat_reference:
        cases.insert(1, ("inductor again", "inductor"))
    for pol in args.policy.split(","):  # graphs first: the case a time limit should not cut off
        if args.graphs:
            cases += [(f"tessera {pol} +graphs", {"devices": args.devices, "policy": pol, "cuda_graphs": True,
                                                   "graph_copies": args.graph_copies})]
        cases += [(f"tessera {pol}", {"devices": args.devices, "policy": pol})]
    skip = {c.strip() for c in args.skip.split(",") if c.strip()}
    cases = [c for c in cases if c[0] not in skip or c[0] == "inductor"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    children = {}
    if args.only:
        cases = [c for c in cases if c[0] == args.only]
    else:  # child cases start now: they compile while this process runs the Inductor reference they compare with
        for f in [out / "reference.pt", out / "reference.failed", *out.glob("generate_*.json")]:
            f.unlink(missing_ok=True)
        children = {name: _start_child(args, name, out) for name, how in cases
                    if isinstance(how, dict) and (how.get("cuda_graphs") or args.in_child == "all")}
    for name, how in cases:
        if name in children:
            continue
        try:
            torch._dynamo.reset()
            rec = None
            if how is None:
                fwd = orig_forward
            elif how == "inductor":
                fwd = torch.compile(orig_forward, backend="inductor", dynamic=False)
            else:
                rec = RecordingBackend(**how)
                fwd = torch.compile(orig_forward, backend=rec, dynamic=False)
            seq, logits, wall = run(name, fwd)
            row = {"seconds_per_generate": wall, "ms_per_token": wall * 1e3 / NEW}
            if name == "inductor":
                ref_seq, ref_logits = seq, logits
                torch.save((seq.cpu(), logits.cpu()), out / "reference.tmp")
                os.replace(out / "reference.tmp", out / "reference.pt")  # whole, for a child polling for it
            if args.only and ref_seq is None:
                ref_seq, ref_logits = _wait_reference(out)  # the parent's Inductor run
            if ref_seq is not None and name != "inductor":
                ref_seq, ref_logits = ref_seq.to(seq.device), ref_logits.to(logits.device)
                row["tokens_equal_inductor"] = bool(torch.equal(seq, ref_seq))
                row["first_difference"] = (int((seq != ref_seq).nonzero()[0, 1]) if not torch.equal(seq, ref_seq)
                                           else None)
                row.update(_compare(seq, logits, ref_seq, ref_logits, args.prompt))
            if rec is not None:
                exs = rec.executors
                row["graphs"] = len(exs)
                row["graph_copies"] = how.get("graph_copies", "link") if how.get("cuda_graphs") else None
                row["cut_edges_per_program"] = [cut_edge_count(e.dag, e.placement) for e in exs]
                row["launches_per_program"] = [len(e.program.launches) for e in exs]
                row["cut_edges_per_layer"] = [per_layer_cuts(cut_edges_per_layer(e.dag, e.placement)) for e in exs]
                row["must_show"] = must_show(row, NEW)
                res["must_show"][name] = row["must_show"]
            res["runs"][name] = row
            print(name, row, flush=True)
            if rec is not None:
                print(must_show_summary(name, row), flush=True)
        except Exception:  # noqa: BLE001 - report and continue
            res["errors"][name] = traceback.format_exc()
            if name == "inductor" and not args.only:
                (out / "reference.failed").write_text(res["errors"][name])  # children stop waiting for it
            print(name, "FAILED\n", res["errors"][name][-3000:], file=sys.stderr, flush=True)
        _write(res, args, out)  # after every case, so a time limit keeps what finished
    for name, child in children.items():
        res["runs"][name] = _finish_child(child, name, out)
        res["must_show"][name] = res["runs"][name].get("must_show")
        print(name, res["runs"][name], flush=True)
        print(must_show_summary(name, res["runs"][name]), flush=True)
        _write(res, args, out)
    _write(res, args, out)
    return 0 if not res["errors"] else 1


def _write(res: dict, args, out: Path) -> None:
    name = "generate.json" if not args.only else f"generate_{_slug(args.only)}.json"
    (out / name).write_text(json.dumps(res, indent=1))


def _compare(seq, logits, ref_seq, ref_logits, prompt: int) -> dict:
    """Per-step logits cosine (per sequence, minimum over the batch) for the steps before the first differing token,
    and the reference's top-1 / top-2 margin at the first differing position of each differing sequence."""
    gen, ref_gen = seq[:, prompt:], ref_seq[:, prompt:]
    diff = gen != ref_gen
    first = [int(d.nonzero()[0, 0]) if d.any() else None for d in diff]
    cos_steps, margins, maxabs = [], [], 0.0
    for step in range(logits.shape[0]):
        ok = [b for b, f in enumerate(first) if f is None or step <= f]  # same prefix up to this step
        if not ok:
            break
        a, b = logits[step, ok], ref_logits[step, ok]
        cos_steps.append(round(torch.nn.functional.cosine_similarity(a, b, dim=-1).min().item(), 6))
        maxabs = max(maxabs, (a - b).abs().max().item())
    for b, f in enumerate(first):
        if f is not None:
            top = ref_logits[f, b].topk(2).values
            ours = logits[f, b]
            margins.append({"sequence": b, "step": f, "ref_top1_minus_top2": round((top[0] - top[1]).item(), 5),
                            "ours_at_ref_token_minus_ours_max": round(
                                (ours[ref_gen[b, f]] - ours.max()).item(), 5)})
    return {"first_difference_step": min((f for f in first if f is not None), default=None),
            "sequences_differing": sum(f is not None for f in first),
            "cosine_per_step_before_difference": cos_steps,
            "cosine_min_before_difference": min(cos_steps) if cos_steps else None,
            "cosine_min_decode_before_difference": min(cos_steps[1:]) if len(cos_steps) > 1 else None,
            "max_abs_logit_diff_before_difference": round(maxabs, 5),
            "margins_at_first_difference": margins}


#: seconds a child case may take (compile, capture, two generates), and that it waits for the parent's reference
CHILD_TIMEOUT_S = 900


def _wait_reference(out: Path, timeout_s: float = CHILD_TIMEOUT_S) -> tuple:
    """The parent's Inductor ``(sequences, logits)``, once its ``reference.pt`` is written (polled).

    Raises:
        RuntimeError: the parent's reference failed, or did not appear within ``timeout_s``.
    """
    t0 = time.perf_counter()
    while not (out / "reference.pt").exists():
        if (out / "reference.failed").exists():
            raise RuntimeError("the parent's Inductor reference failed: nothing to compare with")
        if time.perf_counter() - t0 > timeout_s:
            raise RuntimeError(f"no Inductor reference in {out} after {timeout_s:.0f} s")
        time.sleep(0.5)
    return torch.load(out / "reference.pt")


def _start_child(args, name: str, out: Path) -> tuple:
    """Start one case in a child process with blocking launches (a device-side assert there ends only it); its
    output goes to ``child_<case>.log`` under ``out``."""
    import subprocess

    cmd = [sys.executable, __file__, "--out", str(out), "--layers", str(args.layers), "--batch", str(args.batch),
           "--prompt", str(args.prompt), "--devices", args.devices, "--policy", args.policy, "--only", name, "--graphs",
           "--graph-copies", args.graph_copies, "--device", args.device, "--size", args.size]
    if args.deterministic:
        cmd.append("--deterministic")
    cmd += ["--sdpa", args.sdpa]
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    log = out / f"child_{_slug(name)}.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)
    return proc, log, time.perf_counter()


def _finish_child(child: tuple, name: str, out: Path) -> dict:
    """Wait for a child case; its row, or its error and the tail of its log."""
    import subprocess

    proc, log, t0 = child
    try:
        rc = proc.wait(timeout=max(1.0, CHILD_TIMEOUT_S - (time.perf_counter() - t0)))
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = f"killed after {CHILD_TIMEOUT_S} s"
    f = out / f"generate_{_slug(name)}.json"
    if f.exists():
        child_res = json.loads(f.read_text())
        if name in child_res["runs"]:
            return child_res["runs"][name]
        return {"error": child_res["errors"].get(name, "")[-4000:]}
    return {"error": f"child exited {rc}", "log_tail": log.read_text()[-4000:] if log.exists() else ""}


def _slug(name: str) -> str:
    return name.replace(" ", "_").replace("+", "")


if __name__ == "__main__":
    sys.exit(main())
