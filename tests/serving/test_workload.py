"""Arrival processes and trace files."""

from __future__ import annotations

import numpy as np
import pytest

from torch_tessera.errors import ConfigError
from torch_tessera.serving.workload import Request, load_trace, poisson_arrivals, poisson_workload, save_trace, \
    with_poisson_arrivals


def test_poisson_arrivals_have_the_asked_mean_rate_and_poisson_counts():
    rate, n = 7.0, 20_000
    t = poisson_arrivals(rate, n, seed=11)
    assert np.all(np.diff(t) >= 0) and t[0] > 0
    gaps = np.diff(np.concatenate([[0.0], t]))
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.02)  # std error of the mean gap: 1/sqrt(n) = 0.7 %
    counts = np.bincount(t.astype(int))[:-1]  # arrivals per whole second, last partial second dropped
    assert counts.mean() == pytest.approx(rate, rel=0.02)
    assert counts.var() / counts.mean() == pytest.approx(1.0, abs=0.1)  # Poisson: variance equals mean
    # exponential gaps: P(gap > mean) = 1/e
    assert np.mean(gaps > 1 / rate) == pytest.approx(np.exp(-1), abs=0.015)


def test_poisson_arrivals_are_seeded_and_share_random_numbers_across_rates():
    a = poisson_arrivals(2.0, 100, seed=3)
    assert np.array_equal(a, poisson_arrivals(2.0, 100, seed=3))
    assert not np.array_equal(a, poisson_arrivals(2.0, 100, seed=4))
    np.testing.assert_allclose(poisson_arrivals(8.0, 100, seed=3) * 4, a)


@pytest.mark.parametrize("rate", [0.0, -1.0, float("inf"), float("nan")])
def test_poisson_rejects_bad_rates(rate):
    with pytest.raises(ConfigError, match="rate"):
        poisson_arrivals(rate, 10)


def test_poisson_workload_and_retiming_keep_ids_and_lengths():
    reqs = poisson_workload(5.0, 6, input_tokens=[10, 20], output_tokens=3, seed=1)
    assert [r.id for r in reqs] == list(range(6))
    assert [r.input_tokens for r in reqs] == [10, 20] * 3 and {r.output_tokens for r in reqs} == {3}
    retimed = with_poisson_arrivals(reqs, 10.0, seed=1)
    assert [(r.id, r.input_tokens) for r in retimed] == [(r.id, r.input_tokens) for r in reqs]
    assert [r.arrival_s * 2 for r in retimed] == pytest.approx([r.arrival_s for r in reqs])


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_trace_round_trips(tmp_path, suffix):
    reqs = (Request(0, 0.0, 12, 3), Request(1, 0.25, 7, 1), Request(2, 1.5, 300, 40))
    path = tmp_path / f"trace{suffix}"
    save_trace(path, reqs)
    assert load_trace(path) == reqs


def test_trace_reads_splitwise_columns_with_iso_timestamps_sorted_by_arrival(tmp_path):
    path = tmp_path / "conv.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:15:46.500000,374,44\n"
                    "2023-11-16 18:15:46.000000,396,109\n"
                    "2023-11-16 18:15:48.250000,879,19\n")
    reqs = load_trace(path)
    assert [(r.id, r.arrival_s, r.input_tokens, r.output_tokens) for r in reqs] == [
        (1, 0.0, 396, 109), (0, 0.5, 374, 44), (2, 2.25, 879, 19)]


def test_trace_without_arrivals_is_all_at_once(tmp_path):
    path = tmp_path / "offline.jsonl"
    path.write_text('{"input_len": 5, "output_len": 2}\n\n{"input_len": 6, "output_len": 3}\n')
    assert [r.arrival_s for r in load_trace(path)] == [0.0, 0.0]


def test_trace_errors_name_the_line_and_the_fix(tmp_path):
    missing = tmp_path / "a.csv"
    missing.write_text("arrival_s,input_tokens\n0.0,5\n")
    with pytest.raises(ConfigError, match=r"a.csv:2: no output length column; name it one of"):
        load_trace(missing)
    bad = tmp_path / "b.jsonl"
    bad.write_text('{"arrival_s": 0, "input_tokens": 5, "output_tokens": 2}\n{"arrival_s": "soon", '
                   '"input_tokens": 5, "output_tokens": 2}\n')
    with pytest.raises(ConfigError, match=r"b.jsonl:2: a value is not a number"):
        load_trace(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_trace(tmp_path / "nope.csv")
    with pytest.raises(ConfigError, match="must both be >= 1"):
        Request(0, 0.0, 0, 1)
