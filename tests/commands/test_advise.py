"""tessera advise: bad input is refused with the fix; a GPU too small marks its option "does not fit"."""

import json
import math

import pytest

from torch_tessera.backend.workload import model_workload
from torch_tessera.commands.advise import Option, evaluate, pair_specs, pareto, parse_gpus
from torch_tessera.errors import DeviceUnavailableError
from torch_tessera.target.catalog import CATALOG


def test_unknown_gpu_lists_the_catalog():
    with pytest.raises(DeviceUnavailableError) as e:
        parse_gpus("a100,l40z")
    assert "l40z" in str(e.value) and all(k in str(e.value) for k in CATALOG)
    assert "l40s" in str(e.value)  # the close match
    assert parse_gpus("A100,l40s,a100") == ["a100", "l40s"]


def test_a_gpu_too_small_marks_the_option_does_not_fit():
    specs = pair_specs(("a100", "a100"))
    assert specs[1].name == "sim:a100#2"
    mw = model_workload("mlp", specs, size="tiny")
    small = pair_specs(("a100", "a100"), ",mem=1KB")
    o = evaluate(mw, ("a100", "a100"), 1.0, specs=small)
    assert not o.fits and o.plan.startswith("does not fit") and math.isnan(o.output_per_s)
    ok = evaluate(mw, ("a100", "a100"), 1.0, specs=specs)
    assert ok.fits and ok.output_per_s > 0 and ok.plan.startswith("tessera") and not ok.reason


@pytest.fixture(scope="module")
def tiny_llama():
    return model_workload("llama", pair_specs(("a100", "a100")), size="tiny")


def test_identical_and_mixed_pairs_are_judged_on_the_same_placements(tiny_llama):
    # 60 MB each: a whole copy of tiny Llama (72 MB with its KV cache and activations) fits neither GPU, the weights
    # spread over both fit. Two identical GPUs fit exactly when a mixed pair of the same memory fits.
    same = evaluate(tiny_llama, ("a100", "a100"), 1.0, specs=pair_specs(("a100", "a100"), ",mem=60MB"))
    mixed = evaluate(tiny_llama, ("a100", "h100"), 1.0, specs=pair_specs(("a100", "h100"), ",mem=60MB"))
    assert mixed.fits and mixed.plan.startswith("tessera")
    assert same.fits and same.plan.startswith("tessera"), same.reason


def test_does_not_fit_is_one_full_sentence_with_gpu_gb_placement_and_fix(tiny_llama):
    o = evaluate(tiny_llama, ("a100", "h100"), 1.0, specs=pair_specs(("a100", "h100"), ",mem=40MB"),
                 model="llama (tiny)", decode_batch=64)
    assert not o.fits and o.plan == "does not fit" and math.isnan(o.output_per_s)
    r = o.reason
    assert r.startswith("llama (tiny) does not fit in this pair's memory (GPU 1 (NVIDIA A100 80GB SXM) 40.00 MB and "
                        "GPU 2 (NVIDIA H100 SXM) 40.00 MB): the placement that comes closest, tessera"), r
    assert "needs" in r and "and has 40.00 MB (short by" in r  # which GPU needs how much against what it has
    assert "request-dist, homo-L, homo-R, pd, af, layer" in r  # every placement tried is named
    assert r.endswith("Fix: choose GPUs with more memory, or fewer sequences per decode step (--decode-batch below 64:"
                      " the KV cache shrinks with it).")
    assert len(r) > 200 and "memory_budgets" not in r and "sim:" not in r and "\n" not in r


def test_budget_no_option_fits_says_so(capsys):
    from torch_tessera.cli import main

    assert main(["advise", "--model", "mlp", "--size", "tiny", "--gpus", "a100,l40s", "--budget", "0.01"]) == 2
    err = capsys.readouterr().err
    assert "no GPU pair for mlp fits --budget 0.01/h" in err and "cheapest option that fits" in err


def test_pareto_front():
    a = Option(("a", "a"), True, "x", 10.0, 1.0, 10.0)
    b = Option(("b", "b"), True, "x", 20.0, 2.0, 10.0)
    c = Option(("c", "c"), True, "x", 15.0, 3.0, 5.0)  # dearer and slower than b
    d = Option(("d", "d"), False, "does not fit", math.nan, 0.5, math.nan)
    assert pareto([a, b, c, d]) == [a, b]


def _strict(text: str):
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_advise_json_is_strict_and_prints_the_whole_reason(tmp_path, monkeypatch, capsys):
    from torch_tessera.cli import main
    from torch_tessera.commands import advise

    small = lambda pair, options="": pair_specs(pair, ",mem=1KB")  # noqa: E731  (every GPU too small)
    monkeypatch.setattr(advise, "pair_specs", small)
    assert main(["advise", "--model", "mlp", "--size", "tiny", "--gpus", "a100", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    data = _strict((tmp_path / "advise_mlp.json").read_text())
    (o,) = data["options"]
    assert o["fits"] is False and o["output_per_s"] is None and o["per_price"] is None
    assert o["reason"].startswith("mlp (tiny) does not fit") and o["reason"].endswith("more memory.")
    assert f"a100+a100: {o['reason']}\n" in out  # printed in full, as written


def test_bench_and_pairs_say_whole_why_a_plan_does_not_fit():
    """The predicted bench (and pairs, which prints its rows) gives each plan that does not fit one whole sentence:
    the short GPU, the GB it needs and has, the fix; no internal names, not cut short."""
    from torch_tessera.benchmark import simulate_plans

    rows, meta = simulate_plans("llama", pair_specs(("a100", "h100"), ",mem=60MB"), size="tiny")
    why = {r.plan: r.reason for r in rows if not r.applies}
    assert why["request-dist"] == ("does not fit: GPU 1 (NVIDIA A100 80GB SXM) needs 72.09 MB and has 60.00 MB (short by "
                                   "12.09 MB). Fix: GPUs with more memory, or a plan that spreads the weights over "
                                   "both GPUs (layer, tessera)"), why
    assert all("memory_budgets" not in w for w in why.values())
    assert "memory_budgets" not in meta["tessera_choice"]


def test_a_plan_that_leaves_one_gpu_idle_says_so_and_prices_the_one_it_uses(monkeypatch):
    from types import SimpleNamespace

    import torch_tessera.benchmark as benchmark

    specs = pair_specs(("b200", "l4"))
    mw = model_workload("mlp", specs, size="tiny")
    # the best of tessera's space is homo-L's placement: everything on the B200
    monkeypatch.setattr(benchmark, "choose_tessera", lambda plans, workload, topology, time_limit=None: SimpleNamespace(
        plans={**plans, "tessera": plans["homo-L"]}, chosen="tessera"))
    o = evaluate(mw, ("b200", "l4"), 1.0, specs=specs)
    assert o.fits and o.plan == "tessera (b200 only; l4 idle, not priced)"
    assert o.price_per_hour == specs[0].price_per_hour
