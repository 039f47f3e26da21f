"""The serving loop on a simulated clock: per-request times computed by hand, continuous batching, engine contract."""

from __future__ import annotations

import time

import pytest

from torch_tessera.errors import ConfigError
from torch_tessera.serving import Batch, EngineProtocolError, PlanCost, Request, ServeConfig, SimulatedEngine, \
    StepResult, WallClock, reference_tokens, serve


def engine(prefill_s_per_token=0.0, decode_base_s=0.0, decode_s_per_seq=0.0, by_bucket=None) -> SimulatedEngine:
    cost = PlanCost(prefill_s_per_token=prefill_s_per_token, decode_base_s=decode_base_s,
                    decode_s_per_seq=decode_s_per_seq, decode_s_by_bucket=by_bucket or {})
    return SimulatedEngine({"p": cost})


def test_one_request_times_by_hand():
    # prefill 100 tokens x 1 ms = 0.1 s; each decode step at bucket 1 = 10 ms + 2 ms
    result = serve([Request(7, 0.5, 100, 4)], engine(1e-3, 0.010, 0.002), "p")
    (r,) = result.results
    assert r.id == 7 and r.tokens == reference_tokens(7, 4)
    assert r.ttft_s == pytest.approx(0.1)
    assert r.tpot_s == pytest.approx(0.012)
    assert r.e2e_s == pytest.approx(0.1 + 3 * 0.012)
    assert r.normalized_latency_s == pytest.approx((0.1 + 3 * 0.012) / 4)
    assert r.exec_s == pytest.approx(r.e2e_s)  # alone: never waited
    assert result.steps == {"prefill": 1, "decode": 3} and result.end_s == pytest.approx(0.5 + 0.136)


def test_continuous_batching_pads_to_buckets_and_retires_early_finishers():
    # 3 requests at t=0: one prefill of 30 tokens (0.3 s); decode in bucket 4 (0.4 s) then, once request 0 has
    # its 2 tokens, in bucket 2 (0.2 s) for the other two's 3 remaining tokens.
    reqs = [Request(0, 0.0, 10, 2), Request(1, 0.0, 10, 5), Request(2, 0.0, 10, 5)]
    result = serve(reqs, engine(0.01, by_bucket={1: 0.1, 2: 0.2, 4: 0.4}), "p", ServeConfig(buckets=(1, 2, 4)))
    r0, r1, r2 = result.results
    assert [r.ttft_s for r in result.results] == pytest.approx([0.3, 0.3, 0.3])
    assert r0.finish_s == pytest.approx(0.7) and r0.tpot_s == pytest.approx(0.4)
    assert r1.finish_s == pytest.approx(0.3 + 0.4 + 3 * 0.2) == r2.finish_s
    assert r1.tpot_s == pytest.approx(1.0 / 4)
    assert result.steps == {"prefill": 1, "decode": 4}


def test_requests_wait_for_a_free_slot():
    # two slots: requests 0 and 1 run (prefill 0.2 s, two decode steps of 0.2 s); request 2 waits until 0.6 s
    reqs = [Request(i, 0.0, 10, 3) for i in range(3)]
    result = serve(reqs, engine(0.01, by_bucket={1: 0.1, 2: 0.2}), "p", ServeConfig(buckets=(1, 2)))
    r2 = result.results[2]
    assert [r.finish_s for r in result.results[:2]] == pytest.approx([0.6, 0.6])
    assert r2.first_token_s == pytest.approx(0.7) and r2.finish_s == pytest.approx(0.9)
    assert r2.exec_s == pytest.approx(0.3) and r2.e2e_s == pytest.approx(0.9)


def test_prefill_token_budget_splits_prefills():
    reqs = [Request(i, 0.0, 10, 1) for i in range(3)]
    result = serve(reqs, engine(0.01), "p", ServeConfig(buckets=(4,), max_prefill_tokens=15))
    assert result.steps["prefill"] == 3 and result.steps["decode"] == 0
    assert [r.finish_s for r in result.results] == pytest.approx([0.1, 0.2, 0.3])
    assert all(r.tokens == reference_tokens(r.id, 1) for r in result.results)


def test_idle_engine_waits_for_the_next_arrival():
    reqs = [Request(0, 0.0, 10, 2), Request(1, 5.0, 10, 2)]
    result = serve(reqs, engine(0.01, 0.05), "p")
    assert result.results[1].ttft_s == pytest.approx(0.1) and result.end_s == pytest.approx(5.15)


class _BadEngine(SimulatedEngine):
    def __init__(self, tokens_short: bool) -> None:
        super().__init__({"p": PlanCost(0.0, 0.0, 0.0)})
        self.tokens_short = tokens_short

    def prefill(self, batch: Batch) -> StepResult:
        ok = super().prefill(batch)
        return StepResult(ok.tokens[:-1], 0.0) if self.tokens_short else StepResult(ok.tokens, -1.0)


@pytest.mark.parametrize("tokens_short", [True, False])
def test_engine_that_breaks_the_contract_is_named(tokens_short):
    with pytest.raises(EngineProtocolError, match="one token per request and a time >= 0"):
        serve([Request(0, 0.0, 1, 2)], _BadEngine(tokens_short), "p")


def test_duplicate_ids_and_bad_buckets_are_refused():
    with pytest.raises(ConfigError, match=r"unique; repeated: \[3\]"):
        serve([Request(3, 0.0, 1, 1), Request(3, 1.0, 1, 1)], engine(), "p")
    with pytest.raises(ConfigError, match="ascending"):
        ServeConfig(buckets=(4, 2))


def test_wall_clock_waits_for_arrivals():
    reqs = [Request(0, 0.0, 4, 2), Request(1, 0.05, 4, 2)]
    t0 = time.perf_counter()
    result = serve(reqs, engine(), "p", clock=WallClock())
    assert time.perf_counter() - t0 >= 0.05
    assert result.results[1].first_token_s >= 0.05
    assert [r.tokens for r in result.results] == [reference_tokens(0, 2), reference_tokens(1, 2)]
