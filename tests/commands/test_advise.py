"""tessera advise: bad input is refused with the fix; a GPU too small marks its option "does not fit"."""

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
    assert ok.fits and ok.output_per_s > 0 and ok.plan in ("request-dist", "homo-L", "homo-R")


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
