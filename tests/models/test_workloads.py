"""The offline workload generator: the trace's medians, reproducible, every request in a bucket."""

from __future__ import annotations

import statistics

import pytest

from torch_tessera.workloads import Request, Workload, conversation_workload

# Splitwise conversation trace, as the Tessera artifact reports it (paper digest sec. 9.2).
TARGET_INPUT, TARGET_OUTPUT = 1020, 129


def test_medians_within_ten_percent_of_the_trace():
    w = conversation_workload(2000, seed=0)
    assert len(w.requests) == 2000 and [r.id for r in w.requests] == list(range(2000))
    assert statistics.median(r.input_tokens for r in w.requests) == pytest.approx(TARGET_INPUT, rel=0.10)
    assert statistics.median(r.output_tokens for r in w.requests) == pytest.approx(TARGET_OUTPUT, rel=0.10)
    inputs = sorted(r.input_tokens for r in w.requests)
    assert inputs[199] < TARGET_INPUT / 2 and inputs[1799] > 2 * TARGET_INPUT  # a spread, not a constant


def test_buckets_cover_every_request():
    w = conversation_workload(2000, seed=0)
    for r in w.requests:
        b = w.bucket_of(r)
        assert b in w.seq_buckets and b >= r.total_len
        smaller = [s for s in w.seq_buckets if s < b]
        assert not smaller or smaller[-1] < r.total_len  # the smallest bucket that fits
        assert w.prefill_bucket_of(r) <= b and w.prefill_bucket_of(r) >= r.input_tokens
    batches = w.batches(64)
    served = sorted(r.id for b in batches for r in b.requests)
    assert served == list(range(2000))
    assert all(len(b.requests) <= b.batch_bucket <= 64 and b.batch_bucket in w.batch_buckets for b in batches)
    assert all(r.total_len <= b.seq_bucket for b in batches for r in b.requests)
    shapes = {(b.batch_bucket, b.seq_bucket) for b in batches}
    assert len(shapes) <= len(w.seq_buckets) * len(w.batch_buckets)


def test_seeded_and_scalable():
    assert conversation_workload(50, seed=3) == conversation_workload(50, seed=3)
    assert conversation_workload(50, seed=3) != conversation_workload(50, seed=4)
    tiny = conversation_workload(500, seed=0, length_scale=1 / 16, seq_buckets=(16, 32, 64, 128, 256))
    assert max(r.total_len for r in tiny.requests) <= 256
    assert statistics.median(r.input_tokens for r in tiny.requests) == pytest.approx(TARGET_INPUT / 16, rel=0.15)


def test_bad_buckets_and_lengths_are_rejected():
    with pytest.raises(ValueError, match="largest sequence bucket"):
        Workload((Request(0, 0.0, 100, 100),), seq_buckets=(16, 128))
    with pytest.raises(ValueError, match="ascending"):
        Workload((), seq_buckets=(64, 32))
    with pytest.raises(ValueError, match=">= 1"):
        Request(0, 0.0, 0, 5)
