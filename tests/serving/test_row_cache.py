"""RowCacheLM alone (eager and Dynamo-traced, tiny Llama): rows at their own positions decode the same greedy tokens as
recomputing each sequence, under whichever ``transformers`` is installed (5.24 and 5.17 checked: they take the cache
by different keywords, ``cache=`` and ``past_key_values=``)."""

from __future__ import annotations

import pytest
import torch

from torch_tessera.errors import UnsupportedModelError
from torch_tessera.models import build_module
from torch_tessera.serving.row_cache import RowCacheLM

PROMPT, CONTEXT, OUTPUT = 6, 10, 4


@pytest.fixture(scope="module")
def lm():
    lm = build_module("llama", "tiny", device="cpu", dtype=torch.float32).model.eval()
    lm.model.layers = lm.model.layers[:2]
    lm.config.num_hidden_layers = 2
    return lm


def recomputed(lm, ids: list[int], n: int) -> list[int]:
    """Greedy tokens of ``ids`` recomputing the whole sequence each step (no cache)."""
    out = []
    for _ in range(n):
        t = int(lm(input_ids=torch.tensor([ids + out]), use_cache=False).logits[0, -1].argmax())
        out.append(t)
    return out


def row_cache_tokens(step, prompts: list[list[int]], n: int) -> list[list[int]]:
    """Greedy tokens of each prompt, one row each: one prefill of the right-padded prompts, then batched decode steps
    with the rows at different positions (prompts of different lengths)."""
    ids = torch.zeros(len(prompts), PROMPT, dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, :len(p)] = torch.tensor(p)
    logits = step(ids, torch.arange(PROMPT).expand(len(prompts), PROMPT).contiguous())
    outs = [[int(logits[row, len(p) - 1].argmax())] for row, p in enumerate(prompts)]
    while len(outs[0]) < n:
        ids = torch.tensor([[o[-1]] for o in outs])
        pos = torch.tensor([[len(p) + len(o) - 1] for p, o in zip(prompts, outs)])
        for o, t in zip(outs, step(ids, pos)[:, 0].argmax(-1).tolist()):
            o.append(t)
    return outs


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "dynamo"])
def test_rows_decode_like_recomputation(lm, traced):
    torch.manual_seed(0)
    prompts = [torch.randint(0, lm.config.vocab_size, (k,)).tolist() for k in (3, PROMPT)]
    module = RowCacheLM(lm, rows=len(prompts), context=CONTEXT).eval()
    step = torch.compile(module, backend="eager", fullgraph=True, dynamic=False) if traced else module
    if traced:
        torch._dynamo.reset()
    with torch.no_grad():
        got = row_cache_tokens(step, prompts, OUTPUT)
        want = [recomputed(lm, p, OUTPUT) for p in prompts]
    assert got == want


def test_cache_not_taken_raises(lm):
    """A model that ignores the cache object (here: passed by a keyword it does not take) is an error, not a silent
    attention over the new tokens only (prompt == context, so the mask's shape still matches)."""
    module = RowCacheLM(lm, rows=1, context=PROMPT).eval()
    module._cache_kwarg = "not_a_cache_keyword"
    ids = torch.zeros(1, PROMPT, dtype=torch.long)
    pos = torch.arange(PROMPT)[None]
    with torch.no_grad(), pytest.raises(UnsupportedModelError, match="0 of 2 layers"):
        module(ids, pos)
