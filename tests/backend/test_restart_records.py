"""A Dynamo restart of one compile (the backend is called twice for compile id 0/0) leaves one record in explain,
issues the fallback warning once, and leaves nothing behind after ``torch._dynamo.reset()``."""

from __future__ import annotations

import warnings

import torch

import torch_tessera
from torch_tessera.errors import TesseraFallbackWarning


class _Block(torch.nn.Module):
    """Pre-norm transformer block (MultiheadAttention + MLP): its first Dynamo attempt with dynamic=True restarts."""

    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.attn = torch.nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln1(x)
        x = x + self.attn(y, y, y, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


def _compile_and_run(m: torch.nn.Module, x: torch.Tensor) -> tuple[torch.nn.Module, list[str]]:
    f = torch.compile(m, backend="tessera", dynamic=True, options={"devices": "cpu:0,cpu:1"})
    with warnings.catch_warnings(record=True) as got, torch.no_grad():
        warnings.simplefilter("always")
        torch.testing.assert_close(f(x), m(x))
    return f, [str(w.message) for w in got if issubclass(w.category, TesseraFallbackWarning)]


def test_restarted_compile_is_one_record_one_warning_and_gone_after_reset():
    torch._dynamo.reset()
    torch.manual_seed(0)
    m, x = torch.nn.Sequential(_Block(), _Block()).eval(), torch.randn(2, 8, 32)
    f, msgs = _compile_and_run(m, x)
    assert len(msgs) == 1 and "could not compile graph 0/0" in msgs[0], msgs
    text = str(torch_tessera.explain(f))
    assert text.count("graph 0/0") == 1 and "fallback to Inductor" in text, text
    torch._dynamo.reset()
    assert str(torch_tessera.explain()) == "no graph compiled by tessera"
    f, msgs = _compile_and_run(m, x)
    assert len(msgs) == 1, msgs  # a new compile after reset warns again, once
    assert [g.graph for g in torch_tessera.explain()] == ["0/0"]
