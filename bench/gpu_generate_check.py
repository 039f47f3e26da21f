"""Greedy generation of a Llama-3.1-8B-sized model (random bf16 weights, static KV cache) on two devices (CUDA).

Compares, for 32 new tokens: eager, single-GPU Inductor, and tessera with ``--policy`` on ``--devices`` (default: the
attention kernels on a 72-SM green context of GPU 1, the rest on the whole GPU 0: cuts in every layer), with and
without CUDA graphs. Reports token equality with Inductor, the logits cosine of every step before the first differing
token (steps after it see different prefixes), the reference's top-1 / top-2 logit margin where tokens first differ
(a near-tie there means numerics, not a bug), and time per decode step. Writes generate.json under --out.

``--deterministic`` sets Inductor's deterministic mode (``torch._inductor.config.deterministic``: no on-device
benchmarking, so the reference compile and ours pick the same kernel configurations) for every compile.
CUDA-graph cases run in a child process (``--only``), so a device-side assert there cannot end the other cases.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from torch_tessera.backend.recording import RecordingBackend  # noqa: E402

NEW = 32


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--devices", default="cuda:0,cuda:1@72sm")
    ap.add_argument("--policy", default="af")
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--graphs", action="store_true", help="also run each policy with CUDA graphs (child process)")
    ap.add_argument("--skip", default="", help="comma-separated case names not to run (e.g. 'tessera af,eager')")
    ap.add_argument("--only", default=None, help="run this one case (and the Inductor reference) only")
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
    from transformers import LlamaForCausalLM

    from torch_tessera.models import llama_config
    from torch_tessera.runtime.schedule import cut_edge_count

    cfg = llama_config("full")
    cfg.num_hidden_layers = args.layers
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.prompt), device="cuda")
    kw = dict(max_new_tokens=NEW, do_sample=False, cache_implementation="static", disable_compile=True,
              return_dict_in_generate=True, output_logits=True)
    res: dict = {"args": vars(args), "torch": torch.__version__, "runs": {}, "errors": {}}
    orig_forward = model.forward

    def run(name, forward):
        model.forward = forward
        with torch.no_grad():
            out = model.generate(ids, **kw)  # compiles
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model.generate(ids, **kw)
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
        model.forward = orig_forward
        logits = torch.stack([x.float() for x in out.logits])
        return out.sequences, logits, wall

    ref_seq = ref_logits = None
    cases = [("inductor", "inductor"), ("eager", None)]
    for pol in args.policy.split(","):  # graphs first: the case a time limit should not cut off
        if args.graphs:
            cases += [(f"tessera {pol} +graphs", {"devices": args.devices, "policy": pol, "cuda_graphs": True})]
        cases += [(f"tessera {pol}", {"devices": args.devices, "policy": pol})]
    skip = {c.strip() for c in args.skip.split(",") if c.strip()}
    cases = [c for c in cases if c[0] not in skip or c[0] == "inductor"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.only:
        cases = [c for c in cases if c[0] == args.only]
        ref_seq, ref_logits = torch.load(out / "reference.pt")  # the parent's Inductor run
    for name, how in cases:
        if isinstance(how, dict) and how.get("cuda_graphs") and not args.only:
            res["runs"][name] = _child(args, name, out)
            print(name, res["runs"][name], flush=True)
            _write(res, args, out)
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
                torch.save((seq.cpu(), logits.cpu()), out / "reference.pt")
            if ref_seq is not None and name != "inductor":
                ref_seq, ref_logits = ref_seq.to(seq.device), ref_logits.to(logits.device)
                row["tokens_equal_inductor"] = bool(torch.equal(seq, ref_seq))
                row["first_difference"] = (int((seq != ref_seq).nonzero()[0, 1]) if not torch.equal(seq, ref_seq)
                                           else None)
                row.update(_compare(seq, logits, ref_seq, ref_logits, args.prompt))
            if rec is not None:
                exs = rec.executors
                row["graphs"] = len(exs)
                row["cut_edges_per_program"] = [cut_edge_count(e.dag, e.placement) for e in exs]
                row["launches_per_program"] = [len(e.program.launches) for e in exs]
            res["runs"][name] = row
            print(name, row, flush=True)
        except Exception:  # noqa: BLE001 - report and continue
            res["errors"][name] = traceback.format_exc()
            print(name, "FAILED\n", res["errors"][name][-3000:], file=sys.stderr, flush=True)
        _write(res, args, out)  # after every case, so a time limit keeps what finished
    _write(res, args, out)
    return 0 if not res["errors"] else 1


def _write(res: dict, args, out: Path) -> None:
    name = "generate.json" if not args.only else f"generate_{args.only.replace(' ', '_').replace('+', '')}.json"
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
            "max_abs_logit_diff_before_difference": round(maxabs, 5),
            "margins_at_first_difference": margins}


def _child(args, name: str, out: Path) -> dict:
    """Run one case in a child process with blocking launches; return its row or its error tail."""
    import os
    import subprocess

    cmd = [sys.executable, __file__, "--out", str(out), "--layers", str(args.layers), "--batch", str(args.batch),
           "--prompt", str(args.prompt), "--devices", args.devices, "--policy", args.policy, "--only", name, "--graphs"]
    if args.deterministic:
        cmd.append("--deterministic")
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    f = out / f"generate_{name.replace(' ', '_').replace('+', '')}.json"
    if f.exists():
        child = json.loads(f.read_text())
        if name in child["runs"]:
            return child["runs"][name]
        return {"error": child["errors"].get(name, "")[-4000:]}
    return {"error": f"child exited {p.returncode}", "stderr_tail": p.stderr[-4000:]}


if __name__ == "__main__":
    sys.exit(main())
