"""The profiler with a fake timer: medians, reuse of identical launches, rotation, and the disk cache."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from torch_tessera.errors import DeviceUnavailableError
from torch_tessera.lowering.program import (
    Buffer, BufferKind, ExternLaunch, KernelProgram, KernelSource, Provenance, ScalarArg, TensorArg, TritonLaunch,
)
from torch_tessera.target.devices import parse_device
from torch_tessera.target.profiler import (
    ProfileCache, PerfCounterTimer, cache_dir, launch_key, profile_program, to_cost_table,
)


def t(buf, n, dtype=torch.float32):
    return TensorArg(buf, 0, (n,), (1,), dtype)


def add(index, n, kernel="triton_poi_add_0", buf="x"):
    return TritonLaunch(index, kernel, ("in_ptr0", "out_ptr0", "xnumel"), (t(buf, n), t("y", n), ScalarArg(n)),
                        (1, 1, 1), {"XBLOCK": 1024}, (), Provenance(("aten.add",)))


def mm(index):
    a = TensorArg("a", 0, (8, 8), (8, 1), torch.float32)
    return ExternLaunch(index, "aten::mm.default", (a, a), {}, (), (TensorArg("c", 0, (8, 8), (8, 1), torch.float32),))


def make_program(sources=None, launches=None):
    launches = launches or (add(0, 1024), mm(1), add(2, 1024, buf="z"), add(3, 4096))
    sources = sources or {"triton_poi_add_0": "def triton_poi_add_0(): pass"}
    bufs = {n: Buffer(n, BufferKind.TEMP, torch.float32, 1 << 20, "cpu") for n in "acxyz"}
    kernels = {k: KernelSource(k, src, {}) for k, src in sources.items()}
    return KernelProgram(bufs, (), tuple(launches), (), kernels, "cpu")


class FakeTimer:
    """Returns scripted durations and records how often it timed (without real time passing)."""

    def __init__(self, durations):
        self.durations = list(durations)
        self.calls = 0

    def time(self, fn):
        fn()
        self.calls += 1
        return self.durations[(self.calls - 1) % len(self.durations)]


class Runner:
    def __init__(self):
        self.runs = []

    def __call__(self, launch):
        self.runs.append(launch.index)


@pytest.fixture
def cpu0():
    return parse_device("cpu:0")


def test_median_and_reuse_of_identical_launches(tmp_path, cpu0):
    prog = make_program()
    runner, timer = Runner(), FakeTimer([5e-6, 1e-6, 3e-6])
    col = profile_program(prog, cpu0, runner, warmup=2, repeats=3, timer=timer, cache=ProfileCache(tmp_path),
                          progress=False)
    # launches 0 and 2 differ only in the buffer they read: one measurement serves both
    assert col.measured == 3 and col.cache_hits == 0
    assert timer.calls == 3 * 3
    assert runner.runs.count(0) == 2 + 3 and 2 not in runner.runs
    assert col.kernels == (0, 1, 2, 3)
    np.testing.assert_allclose(col.seconds, [3e-6, 3e-6, 3e-6, 3e-6])  # median of 5, 1, 3 us


def test_rotation_runs_before_every_run_outside_the_timer(tmp_path, cpu0):
    events = []

    class Timer:
        def time(self, fn):
            events.append("start")
            fn()
            events.append("stop")
            return 1.0

    prog = make_program(launches=(add(0, 1024),))
    profile_program(prog, cpu0, lambda l: events.append("run"), warmup=1, repeats=2, timer=Timer(),
                    rotate=lambda l, i: events.append(f"rotate{i}"), cache=ProfileCache(tmp_path), progress=False)
    assert events == ["rotate0", "run", "rotate1", "start", "run", "stop", "rotate2", "start", "run", "stop"]


def test_cache_hit_skips_running(tmp_path, cpu0):
    prog = make_program()
    first = profile_program(prog, cpu0, Runner(), repeats=3, timer=FakeTimer([2e-6]), cache=ProfileCache(tmp_path),
                            progress=False)
    runner = Runner()
    again = profile_program(prog, cpu0, runner, repeats=3, timer=FakeTimer([9.0]), cache=ProfileCache(tmp_path),
                            progress=False)
    assert again.measured == 0 and again.cache_hits == 3 and runner.runs == []
    np.testing.assert_array_equal(again.seconds, first.seconds)
    fresh = profile_program(prog, cpu0, Runner(), repeats=1, timer=FakeTimer([9.0]), cache=ProfileCache(tmp_path),
                            use_cache=False, progress=False)
    assert fresh.measured == 3 and np.all(fresh.seconds == 9.0)


def test_changed_kernel_source_invalidates_only_that_kernel(tmp_path, cpu0):
    profile_program(make_program(), cpu0, Runner(), repeats=1, timer=FakeTimer([1.0]), cache=ProfileCache(tmp_path),
                    progress=False)
    edited = make_program(sources={"triton_poi_add_0": "def triton_poi_add_0(): return 1"})
    runner = Runner()
    col = profile_program(edited, cpu0, runner, repeats=1, timer=FakeTimer([2.0]), cache=ProfileCache(tmp_path),
                          progress=False)
    assert col.cache_hits == 1 and col.measured == 2  # the extern mm is unchanged
    assert list(col.seconds) == [2.0, 1.0, 2.0, 2.0]


def test_other_device_or_shape_misses(tmp_path, cpu0):
    prog = make_program()
    profile_program(prog, cpu0, Runner(), repeats=1, timer=FakeTimer([1.0]), cache=ProfileCache(tmp_path),
                    progress=False)
    h200 = parse_device("cuda:0", assume_gpu="h200")
    part = parse_device("cuda:0@24sm", assume_gpu="h200")
    throttled = parse_device("cuda:0@24sm+throttle36", assume_gpu="h200")
    keys = {launch_key(prog, prog.launches[0], d) for d in (cpu0, h200, part, throttled)}
    assert len(keys) == 4
    col = profile_program(prog, h200, Runner(), repeats=1, timer=FakeTimer([5.0]), cache=ProfileCache(tmp_path),
                          progress=False)
    assert col.cache_hits == 0 and col.measured == 3
    # a CPU virtual device with another index is the same hardware: it hits
    col = profile_program(prog, parse_device("cpu:1"), Runner(), repeats=1, timer=FakeTimer([5.0]),
                          cache=ProfileCache(tmp_path), progress=False)
    assert col.cache_hits == 3
    assert launch_key(prog, add(0, 1024), cpu0) != launch_key(prog, add(0, 2048), cpu0)


def test_cache_dir_from_environment(tmp_path, monkeypatch, cpu0):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path / "envcache"))
    assert cache_dir() == tmp_path / "envcache" / "profiles"
    profile_program(make_program(), cpu0, Runner(), repeats=1, timer=FakeTimer([1.0]), progress=False)
    assert len(list((tmp_path / "envcache" / "profiles").glob("*.json"))) == 3


def test_corrupt_cache_entry_is_remeasured(tmp_path, cpu0):
    prog = make_program(launches=(add(0, 1024),))
    key = launch_key(prog, prog.launches[0], cpu0)
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / f"{key}.json").write_text("{not json")
    col = profile_program(prog, cpu0, Runner(), repeats=1, timer=FakeTimer([4.0]), cache=ProfileCache(tmp_path),
                          progress=False)
    assert col.measured == 1 and col.seconds[0] == 4.0


def test_real_cpu_timing_and_cost_table(tmp_path, cpu0):
    prog = make_program()
    x = torch.randn(1 << 16)

    def run(launch):
        (x * 2).sum()

    col0 = profile_program(prog, cpu0, run, warmup=1, repeats=3, cache=ProfileCache(tmp_path), progress=False)
    assert np.all(col0.seconds > 0) and "measured on cpu:0" in col0.source
    col1 = dataclasses.replace(col0, device="cpu:1", seconds=col0.seconds * 2)
    table = to_cost_table([col0, col1])
    assert table.devices == ("cpu:0", "cpu:1") and table.seconds.shape == (4, 2)
    np.testing.assert_allclose(table.row(3), [col0.seconds[3], 2 * col0.seconds[3]])
    with pytest.raises(ValueError, match="other launches"):
        to_cost_table([col0, dataclasses.replace(col1, kernels=(0, 1, 2))])


def test_gpu_spec_without_device_needs_a_timer_and_sims_are_refused(cpu0):
    with pytest.raises(ValueError, match="open Device"):
        profile_program(make_program(), parse_device("cuda:0", assume_gpu="h200"), Runner(), progress=False)
    with pytest.raises(DeviceUnavailableError, match="simulated"):
        profile_program(make_program(), parse_device("sim:h200"), Runner(), timer=FakeTimer([1.0]), progress=False)
    assert isinstance(PerfCounterTimer().time(lambda: None), float)


def test_calibrate_to_total_removes_a_constant_per_launch_overhead():
    import numpy as np

    from torch_tessera.target.profiler import ProfileColumn, calibrate_to_total

    gpu = np.array([2e-6, 5e-6, 40e-6, 300e-6, 3e-6])
    overhead = 25e-6  # what timing each launch alone adds (host launch latency while the GPU waits)
    col = ProfileColumn("cuda:0", (0, 1, 2, 3, 4), gpu + overhead, "measured")
    cal = calibrate_to_total(col, float(gpu.sum()))
    np.testing.assert_allclose(cal.seconds, gpu, rtol=1e-9)
    assert "calibrated" in cal.source and cal.kernels == col.kernels


def test_calibrate_to_total_keeps_the_floor_and_the_total():
    import numpy as np
    import pytest

    from torch_tessera.target.profiler import ProfileColumn, calibrate_to_total

    col = ProfileColumn("cuda:0", (0, 1, 2), np.array([10e-6, 11e-6, 500e-6]), "measured")
    cal = calibrate_to_total(col, 200e-6, floor_s=2e-6)
    assert cal.seconds.min() >= 2e-6 - 1e-15
    assert abs(cal.seconds.sum() - 200e-6) < 1e-12
    assert cal.seconds[2] > cal.seconds[1] >= cal.seconds[0]
    up = calibrate_to_total(col, 1e-3)  # launches summing to less than the whole: scaled up
    np.testing.assert_allclose(up.seconds / col.seconds, 1e-3 / col.seconds.sum())
    with pytest.raises(ValueError):
        calibrate_to_total(col, 1e-7, floor_s=1e-6)


def test_key_covers_torch_and_triton_versions(cpu0, monkeypatch):
    import triton

    prog = make_program()
    triton_key, extern_key = (launch_key(prog, prog.launches[i], cpu0) for i in (0, 1))
    monkeypatch.setattr(torch, "__version__", "0.0.1")
    assert launch_key(prog, prog.launches[0], cpu0) != triton_key
    assert launch_key(prog, prog.launches[1], cpu0) != extern_key
    monkeypatch.undo()
    monkeypatch.setattr(triton, "__version__", "0.0.1")
    assert launch_key(prog, prog.launches[0], cpu0) != triton_key
    assert launch_key(prog, prog.launches[1], cpu0) != extern_key


def test_program_key_and_uncached_launches(tmp_path, cpu0):
    from torch_tessera.target.profiler import program_key, uncached_launches

    prog = make_program()
    cache = ProfileCache(tmp_path)
    assert uncached_launches(prog, cpu0, cache) == [0, 1, 3]  # launch 2 is launch 0 again (same key)
    profile_program(prog, cpu0, Runner(), repeats=1, timer=FakeTimer([1.0]), cache=cache, progress=False)
    assert uncached_launches(prog, cpu0, ProfileCache(tmp_path)) == []
    assert program_key(prog, cpu0) != program_key(prog, cpu0, kernels=[0, 1])
    assert program_key(prog, cpu0) != program_key(prog, parse_device("cuda:0", assume_gpu="h200"))


def test_invalid_cache_values_are_misses(tmp_path, cpu0, caplog):
    cache = ProfileCache(tmp_path)
    (tmp_path / "profiles").mkdir()
    for key, text in {"list": '{"seconds": [1.0]}', "negative": '{"seconds": -1}', "nan": '{"seconds": NaN}',
                      "nokey": '{"s": 1}'}.items():
        (tmp_path / "profiles" / f"{key}.json").write_text(text)
        assert cache.get(key) is None, key
    assert caplog.text.count("profile cache entry") == 4


def test_unwritable_cache_warns_once_and_keeps_times_in_memory(tmp_path, cpu0):
    from torch_tessera.errors import TesseraCacheWarning

    (tmp_path / "file").write_text("")
    cache = ProfileCache(tmp_path / "file")
    with pytest.warns(TesseraCacheWarning, match="cannot be written.*TESSERA_CACHE_DIR") as got:
        col = profile_program(make_program(), cpu0, Runner(), repeats=1, timer=FakeTimer([3.0]), cache=cache,
                              progress=False)
    assert len([w for w in got if issubclass(w.category, TesseraCacheWarning)]) == 1
    assert col.measured == 3 and cache.write_error is not None
    again = profile_program(make_program(), cpu0, Runner(), repeats=1, timer=FakeTimer([9.0]), cache=cache,
                            progress=False)
    assert again.cache_hits == 3 and list(again.seconds) == [3.0] * 4
