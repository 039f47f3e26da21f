"""tessera pairs (table labelled SIMULATED, the paper's Fig. 6 beside) and tessera calibrate (the fit)."""

import dataclasses

import pytest

from torch_tessera.commands.calibrate import FREE, Sample, _errors, _sim_name, fit
from torch_tessera.commands.pairs import FIG6, PAIRS, PAPER_PLANS, PAPER_ROW, PLANS, format_pair
from torch_tessera.lowering.op_class import OpClass
from torch_tessera.target.costmodel import LaunchFeatures
from torch_tessera.target.devices import parse_device
from torch_tessera.target.kernelmodel import KernelModel


def test_fig6_has_every_pair_model_and_plan():
    for pair in PAIRS:
        assert set(FIG6[pair]) == set(PAPER_ROW.values())
        for row in FIG6[pair].values():
            assert len(row) == len(PAPER_PLANS) and row[-1] == max(v for v in row if v is not None)  # tessera best
    assert FIG6[("a100", "l40s")]["LM"][-1] == 2525.38
    # every baseline is a row, layer too (no Fig. 6 column), tessera last
    assert set(PAPER_PLANS) < set(PLANS) and "layer" in PLANS and PLANS[-1] == "tessera"


def test_pair_table_is_labelled_and_gives_ratios():
    res = {"model": "llama", "pair": ["a100", "l40s"], "unit": "tok/s", "note": "",
           "plans": [{"plan": "homo-L", "predicted": 1000.0, "paper": 1288.3, "price_per_hour": 1.5,
                      "per_price": 666.7, "reason": ""},
                     {"plan": "tessera", "predicted": 2000.0, "paper": 2525.38, "price_per_hour": 2.5,
                      "per_price": 800.0, "reason": ""},
                     {"plan": "af", "predicted": None, "paper": None, "price_per_hour": None, "per_price": None,
                      "reason": "af needs attention kernels"}]}
    text = format_pair(res)
    assert text.startswith("SIMULATED llama on a100 + l40s")
    assert "0.776" in text and "0.792" in text  # predicted / paper
    assert "tessera / best baseline: 2.00x SIMULATED" in text and "n/a: af needs" in text


def test_device_names_of_measured_runs():
    assert _sim_name("cuda:1@24sm", "h200") == "sim:h200@24sm" and _sim_name("cuda:0", "h200") == "sim:h200"


def test_fit_recovers_known_constants_from_synthetic_launches():
    truth = KernelModel(eta_tensor=0.6, eta_cuda=0.2, eta_memory=0.7, l2_bytes_per_clock_per_sm=64.0,
                        latency_cycles=6000.0, floor_s=2e-6)
    specs = {d: parse_device(d) for d in ("sim:h200", "sim:h200@24sm")}
    samples = []
    for d in specs:
        for k in range(14):
            gemm = LaunchFeatures(k, OpClass.GEMM, 2.0 * (256 << k) ** 3 / 64, 1e6 * 2**k, True, "mm", 0.0,
                                  64 << k, 256, "bf16")
            stream = LaunchFeatures(k, OpClass.ELEMENTWISE, 1e5 * 2**k, 1e5 * 2**k, False, "add", 1e5 * 2**k,
                                    128 << k, 128, "bf16")
            for f in (gemm, stream):
                samples.append(Sample("m", "p", d, f, truth.predict(f, specs[d])))
        for m_, k_, n_ in ((64, 4096, 4096), (1, 1536, 1536), (384, 4096, 1536), (64, 14336, 4096)):
            lib = LaunchFeatures(0, OpClass.GEMM, 2.0 * m_ * k_ * n_, 2.0 * (m_ * k_ + k_ * n_ + m_ * n_), True, "mm",
                                 2.0 * k_ * n_, -(-m_ // 128) * -(-n_ // 128), 256, "bf16", depth=k_, rows=m_, cols=n_)
            samples.append(Sample("m", "p", d, lib, truth.predict(lib, specs[d])))  # library grids: wave constants
    start = dataclasses.replace(truth, **{n: getattr(truth, n) * 1.6 for n in FREE})
    m = fit(samples, specs, start=start)
    assert abs(_errors(m, samples, specs)).max() < 0.05
    assert abs(_errors(start, samples, specs)).max() > 0.2


def test_a_model_that_cannot_be_lowered_costs_only_its_own_rows(monkeypatch, tmp_path, capsys):
    import argparse
    import json

    from torch_tessera.commands import pairs
    from torch_tessera.errors import LoweringError

    def fake_rows(model, pair, prefill_tokens=1024):
        if model == "qwen2-vl":
            raise LoweringError("torch.export failed on the fake model: GuardOnDataDependentSymNode: Eq(u3, 0)\nmore")
        return {"model": model, "pair": list(pair), "unit": "tok/s", "note": "", "plans": []}

    monkeypatch.setattr(pairs, "pair_rows", fake_rows)
    args = argparse.Namespace(models="llama,qwen2-vl", pairs="a100+l40s", out=str(tmp_path), prefill_tokens=1024)
    assert pairs.run(args) == 1
    out, err = capsys.readouterr()
    assert "SIMULATED llama on a100 + l40s" in out
    assert ("qwen2-vl on a100+l40s: not planned: torch.export failed on the fake model: "
            "GuardOnDataDependentSymNode") in err
    assert "1 of 2 rows not planned (qwen2-vl" in err
    saved = json.loads((tmp_path / "pairs.json").read_text())["results"]
    assert [r["model"] for r in saved] == ["llama", "qwen2-vl"] and "error" in saved[1]


def test_export_errors_drop_the_printed_graph():
    from torch_tessera.lowering.fake import _readable

    graph = "def forward(self, " + ", ".join(f'arg{i}_1: "bf16[1280]"' for i in range(100)) + "):\n    x = 1\n\n"
    text = _readable(RuntimeError(graph + "GuardOnDataDependentSymNode: Could not guard\n  File m.py, line 3\n"))
    assert text == "GuardOnDataDependentSymNode: Could not guard\n  File m.py, line 3"


def test_an_ssm_in_the_models_is_announced_with_the_option_that_leaves_it_out(monkeypatch, tmp_path, capsys):
    import argparse

    from torch_tessera.commands import pairs

    seen = []

    def fake_rows(model, pair, prefill_tokens=1024):
        seen.append((model, prefill_tokens))
        return {"model": model, "pair": list(pair), "unit": "tok/s", "note": "", "plans": [],
                "prefill_tokens": prefill_tokens}

    monkeypatch.setattr(pairs, "pair_rows", fake_rows)

    def ns(models, tokens=1024):
        return argparse.Namespace(models=models, pairs="a100+l40s", out=str(tmp_path), prefill_tokens=tokens)

    assert pairs.run(ns("llama,mamba,dit")) == 0
    err = capsys.readouterr().err
    assert err.startswith("note: mamba (SSM): the full-size prefill unrolls its scan"), err
    assert "To leave it out: --models llama,dit" in err and "--models mamba --prefill-tokens 32" in err
    assert pairs.run(ns("llama,dit")) == 0
    assert "note:" not in capsys.readouterr().err
    # a short prompt: no note, the prompt reaches every row and its header says the workload differs from the paper's
    assert pairs.run(ns("mamba", 32)) == 0
    out, err = capsys.readouterr()
    assert "note:" not in err and seen[-1] == ("mamba", 32)
    assert "SIMULATED mamba on a100 + l40s (tok/s, 32-token prefill (the paper's workload differs" in out
    with pytest.raises(Exception, match="--prefill-tokens must be at least 1"):
        pairs.run(ns("mamba", 0))


def test_two_of_a_gpu_that_cannot_hold_the_model_is_a_row_that_says_why(monkeypatch):
    from types import SimpleNamespace

    import torch_tessera.benchmark as benchmark
    from torch_tessera.commands.pairs import pair_rows

    def row(plan, tok_s, price, reason=""):
        return SimpleNamespace(plan=plan, applies=not reason, output_per_s=tok_s, price_per_hour=price,
                               output_per_s_per_price=tok_s / price if price else 0.0, reason=reason)

    rows = [row("homo-L", 100.0, 1.5), row("homo-R", 0.0, 0.0, "does not fit: GPU 2 needs 103.67 GB, has 48.00 GB"),
            row("tessera", 150.0, 2.5)]
    monkeypatch.setattr(benchmark, "simulate_plans", lambda model, specs, **kw: (rows, {"tessera_choice": ""}))
    plans = {p["plan"]: p for p in pair_rows("llama", ("a100", "l40s"))["plans"]}
    assert plans["2x a100 (request-dist)"]["predicted"] == 200.0 and plans["2x a100 (request-dist)"]["reason"] == ""
    cheap = plans["2x l40s (request-dist)"]
    assert cheap["predicted"] is None and cheap["reason"] == "as homo-R: does not fit: GPU 2 needs 103.67 GB, has 48.00 GB"


def test_a_prompt_too_short_for_the_vlms_image_is_a_row_not_planned(tmp_path, capsys):
    import argparse

    from torch_tessera.commands import pairs

    args = argparse.Namespace(models="qwen2-vl", pairs="a100+l40s", out=str(tmp_path), prefill_tokens=32)
    assert pairs.run(args) == 1
    err = capsys.readouterr().err
    assert "qwen2-vl on a100+l40s: not planned: qwen2-vl (full) needs prompts of at least 327 tokens" in err
    assert "1 of 1 rows not planned (qwen2-vl" in err
