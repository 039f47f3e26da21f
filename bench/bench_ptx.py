"""Analysis time per kernel on the validation corpus (PTX already compiled; Triton compile time excluded).

Run: ``PYTHONPATH=$PWD python -m pytest bench/bench_ptx.py -q -s`` (pytest-benchmark). Target: median <= 2 ms per
kernel on the 2-core CI machine (issue 3).
"""

import os
import statistics
import time

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from torch_tessera.ptx import access_from_ptx  # noqa: E402
from torch_tessera.ptx.compile import compile_many  # noqa: E402


@pytest.fixture(scope="module")
def corpus():
    """CompiledPTX of every Triton kernel of the model zoo, for sm_80 and sm_90."""
    from tests.ptx.zoo import lower_fn, zoo

    jobs = {}
    for name, fn, inputs in zoo():
        try:
            programs = lower_fn(fn, *inputs)
        except Exception as e:  # noqa: BLE001 - a model the lowering cannot take is reported, not benchmarked
            print(f"skipping {name}: {type(e).__name__}")
            continue
        for p in programs:
            for launch in p.triton_launches:
                for target in (80, 90):
                    jobs[(launch.kernel, target)] = (p.kernels[launch.kernel], launch.config, target)
    return compile_many(jobs.values())


def _analyse(c):
    return access_from_ptx(c.ptx, c.param_names, c.kernel, c.target)


def test_analysis_time_per_kernel(benchmark, corpus):
    per_kernel = []
    for c in corpus:
        times = []
        for _ in range(15):
            t0 = time.perf_counter()
            _analyse(c)
            times.append(time.perf_counter() - t0)
        per_kernel.append((statistics.median(times), c))
    per_kernel.sort(key=lambda x: x[0])
    med = statistics.median(t for t, _ in per_kernel)
    worst, c = per_kernel[-1]
    print(f"\n{len(corpus)} kernel/target PTX files; analysis time per kernel: median {med * 1e3:.2f} ms, "
          f"max {worst * 1e3:.2f} ms ({c.kernel} sm_{c.target}, {c.ptx.count(chr(10))} lines)")
    benchmark(lambda: [_analyse(c) for c in corpus])
