"""A small model zoo lowered with torch_tessera.lowering on CPU: the validation corpus of the PTX analysis."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from torch_tessera.lowering import lower


class _Stop(Exception):
    """Raised instead of running the program: the corpus only needs the captured kernels."""


def lower_fn(fn, *inputs):
    """Kernel programs Inductor makes for ``fn(*inputs)`` (one per graph), without executing them."""
    programs = []

    def on_captured(captured):
        programs.append(captured.program)

        def stop(args):
            raise _Stop

        return stop

    torch._dynamo.reset()
    try:
        torch.compile(fn, backend=lambda gm, ex: lower(gm, ex, on_captured), dynamic=False)(*inputs)
    except _Stop:
        pass
    return programs


class Decoder(nn.Module):
    """A Llama-style decoder layer with a static KV cache updated in place."""

    def __init__(self, d=64, heads=4, slots=32):
        super().__init__()
        self.h, self.hd = heads, d // heads
        self.norm1, self.norm2 = nn.RMSNorm(d), nn.RMSNorm(d)
        self.qkv, self.o = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.gate_up, self.down = nn.Linear(d, 4 * d, bias=False), nn.Linear(2 * d, d, bias=False)
        self.register_buffer("k_cache", torch.zeros(1, heads, slots, d // heads))
        self.register_buffer("v_cache", torch.zeros(1, heads, slots, d // heads))

    def forward(self, x, pos):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.h, self.hd).permute(2, 0, 3, 1, 4)
        self.k_cache.index_copy_(2, pos, k)
        self.v_cache.index_copy_(2, pos, v)
        a = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        g, u = self.gate_up(self.norm2(x)).chunk(2, -1)
        return x + self.down(F.silu(g) * u)


def moe(x, router, w1, w2, k=2):
    """Mixture of experts with static shapes: router softmax, top-k, every expert computed densely, the chosen ones
    gathered, and per-expert token counts scattered (the load-balancing statistic)."""
    weights, experts = torch.topk(torch.softmax(x @ router, -1), k)
    h = F.silu(torch.einsum("td,edf->tef", x, w1))
    y = torch.einsum("tef,efd->ted", h, w2)
    chosen = torch.gather(y, 1, experts[:, :, None].expand(-1, -1, x.shape[-1]))
    counts = torch.zeros(router.shape[1]).scatter_add(0, experts.flatten(), torch.ones(experts.numel()))
    return (chosen * weights[..., None]).sum(1), counts


def selective_scan(x, a, b, c):
    """Mamba-style scan: h_t = exp(a) * h_{t-1} + b_t x_t, y_t = c_t . h_t, as a log-space cumulative sum."""
    da = torch.cumsum(a.unsqueeze(0).expand(x.shape[0], -1), 0)
    h = torch.exp(da) * torch.cumsum(torch.exp(-da) * b * x, 0)
    return (h * c).sum(-1)


def explicit_attention(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, -1) @ v


def conv_block(x, w, gn_w, gn_b):
    return F.silu(F.group_norm(F.conv2d(x, w, padding=1), 4, gn_w, gn_b)) + x


def zoo():
    """(name, fn, inputs) of every corpus model."""
    r = torch.randn
    dec = Decoder().eval()
    mlp = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32), nn.LayerNorm(32)).eval()
    return [
        ("mlp", mlp, (r(8, 32),)),
        ("sdpa", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), (r(1, 2, 16, 8),) * 3),
        ("explicit_attention", explicit_attention, (r(2, 16, 8), r(2, 16, 8), r(2, 16, 8))),
        ("decoder_kv_cache", dec, (r(1, 2, 64), torch.tensor([3, 4]))),
        ("moe", moe, (r(16, 32), r(32, 4), r(4, 32, 64), r(4, 64, 32))),
        ("selective_scan", selective_scan, (r(16, 8), -r(8).abs(), r(16, 8), r(16, 8))),
        ("conv_block", conv_block, (r(1, 8, 8, 8), r(8, 8, 3, 3), r(8), r(8))),
        ("embedding", lambda ids, w: F.embedding(ids, w) * 2, (torch.randint(0, 50, (12,)), r(50, 16))),
        ("index_add_scatter", lambda x, i, s: x.index_add(0, i, s).scatter(1, i[:, None].expand(-1, 4) % 4, s[:, :4]),
         (r(10, 6), torch.randint(0, 10, (10,)), r(10, 6))),
        ("cumsum_argmax", lambda x: (x.cumsum(-1), x.argmax(0)), (r(16, 32),)),
        ("split_k_reduction", lambda x: x.sum(), (r(1 << 16),)),
    ]
