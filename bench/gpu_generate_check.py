"""Greedy generation of a Llama-3.1-8B-sized model (random bf16 weights, static KV cache) on two devices (CUDA).

Compares, for 32 new tokens: eager, single-GPU Inductor, and tessera with ``--policy`` on ``--devices`` (default: the
attention kernels on a 72-SM green context of the same GPU, the rest on the whole GPU: cuts in every layer), with
and without CUDA graphs. Reports token equality with Inductor, the decode-step logits cosine, and time per decode
step. Writes generate.json / generate.md under --out.
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
    ap.add_argument("--devices", default="cuda:0,cuda:0@72sm")
    ap.add_argument("--policy", default="af")
    args = ap.parse_args()
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
    cases = [("eager", None), ("inductor", "inductor")]
    for pol in args.policy.split(","):
        cases += [(f"tessera {pol}", {"devices": args.devices, "policy": pol}),
                  (f"tessera {pol} +graphs", {"devices": args.devices, "policy": pol, "cuda_graphs": True})]
    for name, how in cases:
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
            if ref_seq is not None and name != "inductor":
                row["tokens_equal_inductor"] = bool(torch.equal(seq, ref_seq))
                row["first_difference"] = (int((seq != ref_seq).nonzero()[0, 1]) if not torch.equal(seq, ref_seq)
                                           else None)
                row["logits_cosine_min_over_steps"] = min(
                    torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0).item()
                    for a, b in zip(logits, ref_logits))
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
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "generate.json").write_text(json.dumps(res, indent=1))
    return 0 if not res["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
