"""The logic of the GPU check tools in bench/ that runs, and is tested, on CPU: the must-show verdict of
``bench/gpu_generate_check.py`` and the fresh-input replay of our graph in ``bench/gpu_home_gap.py``.
"""

from __future__ import annotations

import torch


def fresh_ours_replay(state, args: list):
    """Replay of our one graph after copying this call's INPUT-kind inputs into its static storages (the
    executor's ``copy_list``), as a call does."""
    for k, view in state.copy_list:
        view.copy_(args[k])
    if not all(torch.equal(view, args[k]) for k, view in state.copy_list):
        raise RuntimeError("our static input storages do not hold the copied inputs; not replaying")

    def replay():
        for k, view in state.copy_list:
            view.copy_(args[k])
        state.whole.replay()

    return replay


def per_layer_cuts(counts: dict) -> dict:
    """``cut_edges_per_layer``'s counts as JSON: decoder layers in order (``"0"``...), then ``"outside"`` (the
    embedding, final norm and head), ``min`` / ``max`` over the layers, and how many layers have none."""
    layers = {k: v for k, v in counts.items() if k is not None}
    out = {str(k): layers[k] for k in sorted(layers)}
    out["outside"] = counts.get(None, 0)
    out["min"] = min(layers.values()) if layers else 0
    out["max"] = max(layers.values()) if layers else 0
    out["layers_without_cut"] = sum(v == 0 for v in layers.values())
    out["layers"] = len(layers)
    return out


def must_show(row: dict, new_tokens: int, min_cosine: float = 0.999) -> dict:
    """The generation check's conditions for one tessera row: every program has at least one cut edge in every decoder
    layer, the decode steps' logits cosine to Inductor >= ``min_cosine`` (minimum over sequences and the steps before
    each one's first differing token), and all ``new_tokens`` greedy tokens identical to Inductor's."""
    per_layer = row.get("cut_edges_per_layer") or []
    cos = row.get("cosine_min_decode_before_difference")
    out = {"cut_in_every_layer": bool(per_layer) and all(p["layers"] > 0 and p["layers_without_cut"] == 0
                                                          for p in per_layer),
           "min_cut_edges_per_layer": [p["min"] for p in per_layer],
           "decode_cosine_min": cos, "decode_cosine_ok": cos is not None and cos >= min_cosine,
           "new_tokens": new_tokens, "tokens_identical": row.get("tokens_equal_inductor") is True}
    out["all"] = out["cut_in_every_layer"] and out["decode_cosine_ok"] and out["tokens_identical"]
    return out


def must_show_summary(name: str, row: dict) -> str:
    """One line per tessera case: cut edges per layer, decode cosine, token equality, and the verdict."""
    m = row.get("must_show")
    if not m:
        return f"MUST-SHOW {name}: no result ({str(row.get('error', ''))[-300:]})"
    layers = ", ".join(f"{p['min']}-{p['max']}" for p in row.get("cut_edges_per_layer", []))
    return (f"MUST-SHOW {name}: cut edges per layer (min-max; prefill, decode) {layers} -> every layer cut: "
            f"{m['cut_in_every_layer']}; decode logits cosine min {m['decode_cosine_min']} (>= 0.999: "
            f"{m['decode_cosine_ok']}); {m['new_tokens']} greedy tokens identical to Inductor: {m['tokens_identical']}"
            f" ({row.get('sequences_differing')} sequences differ, first at step {row.get('first_difference_step')})"
            f" => {'MET' if m['all'] else 'NOT MET'}")
