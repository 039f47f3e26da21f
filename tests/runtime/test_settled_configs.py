"""One Triton configuration per kernel per process: the first device to run a kernel settles it (benchmarking its
candidates), every other device's kernel object of the same source launches with it.

The autotuner here is a stand-in with the attributes :mod:`torch_tessera.compat.torch_inductor` reads
(``configs`` before compiling, ``launchers`` after); real ``triton.Config`` objects carry the choices."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import triton

from torch_tessera.compat.torch_inductor import config_key, pin_config, settled_config
from torch_tessera.lowering.program import Buffer, BufferKind, KernelProgram, KernelSource, ScalarArg, TritonLaunch
from torch_tessera.runtime import executor
from torch_tessera.runtime.executor import BufferPool, KernelLauncher

CONFIGS = [triton.Config({"XBLOCK": 1, "R0_BLOCK": r}, num_warps=w) for r, w in ((1024, 8), (2048, 16), (4096, 16))]

SCALED = triton.Config({"XBLOCK": 1, "R0_BLOCK": 512}, num_warps=16)


class StandInAutotuner:
    """Compiles its candidates on the first run and, with several, "benchmarks" them: the one at ``fastest``."""

    def __init__(self, fastest: int, precompiled: bool = False, scaled: bool = False) -> None:
        self.configs = list(CONFIGS)
        self.scaled = scaled  # compiling adds a smaller-block candidate, as Inductor's _dynamic_scale_rblock does
        self.launchers: list = []
        self.fastest = fastest
        self.benchmarks = 0
        self.launched_with: list = []
        if precompiled:
            self.precompile()

    def precompile(self) -> None:
        self.launchers = [SimpleNamespace(config=c) for c in self.configs + ([SCALED] if self.scaled else [])]
        self.configs = None

    def run(self, *args, stream=None) -> None:
        if not self.launchers:
            self.precompile()
        if len(self.launchers) > 1:
            self.benchmarks += 1
            self.launchers = [self.launchers[self.fastest]]
        self.launched_with.append(self.launchers[0].config)


def _program(source: str = "# kernel source A") -> KernelProgram:
    bufs = {"x": Buffer("x", BufferKind.TEMP, torch.float32, 16, "cpu")}
    launch = TritonLaunch(0, "k", ("xnumel",), (ScalarArg(4),), (1, 1, 1), {})
    return KernelProgram(bufs, (), (launch,), (), {"k": KernelSource("k", source, {"xnumel": "i32"})}, "cpu")


@pytest.fixture(autouse=True)
def _fresh_registry(monkeypatch):
    monkeypatch.setattr(executor, "SETTLED_CONFIGS", {})
    monkeypatch.setattr(executor, "_WARNED", set())


def _launch(program: KernelProgram, kernel: StandInAutotuner) -> None:
    KernelLauncher(program, {"k": kernel}).launch(program.launches[0], BufferPool(torch.device("cpu")))


def test_second_device_launches_the_first_devices_choice_without_benchmarking():
    program = _program()
    home, other = StandInAutotuner(fastest=1), StandInAutotuner(fastest=2)  # the other would choose differently
    _launch(program, home)
    _launch(program, other)
    assert home.benchmarks == 1 and other.benchmarks == 0
    assert config_key(other.launched_with[0]) == config_key(CONFIGS[1]) == config_key(home.launched_with[0])


def test_pinning_works_on_an_already_compiled_autotuner():
    program = _program()
    home, other = StandInAutotuner(fastest=0), StandInAutotuner(fastest=2, precompiled=True)
    _launch(program, home)
    _launch(program, other)
    assert other.benchmarks == 0 and config_key(other.launched_with[0]) == config_key(CONFIGS[0])


def test_a_candidate_that_only_compiling_adds_is_found_by_compiling_first():
    program = _program()
    home, other = StandInAutotuner(fastest=3, scaled=True), StandInAutotuner(fastest=0, scaled=True)
    _launch(program, home)  # settles on the smaller-block candidate its compile added
    _launch(program, other)
    assert other.benchmarks == 0 and config_key(other.launched_with[0]) == config_key(SCALED)


def test_candidates_added_by_compiling_do_not_undo_the_pinning():
    """Compiling adds a smaller-block candidate on every device (Inductor's ``_dynamic_scale_rblock``): a pinned
    object must still launch the settled configuration, without benchmarking it against the added one."""
    program = _program()
    home, other = StandInAutotuner(fastest=1, scaled=True), StandInAutotuner(fastest=3, scaled=True)
    _launch(program, home)  # settles on CONFIGS[1], an original candidate
    _launch(program, other)  # would pick the added SCALED one if it benchmarked
    assert other.benchmarks == 0 and config_key(other.launched_with[0]) == config_key(CONFIGS[1])


def test_interpreted_kernels_are_left_alone(monkeypatch):
    program = _program()
    home, other = StandInAutotuner(fastest=1), StandInAutotuner(fastest=2)
    other.triton_interpret = True  # the Triton interpreter launches the first candidate: nothing to pin
    _launch(program, home)
    _launch(program, other)
    assert other.benchmarks == 1  # not pinned: it ran as it would have without us


def test_different_sources_settle_separately():
    a, b = StandInAutotuner(fastest=1), StandInAutotuner(fastest=2)
    _launch(_program("# source A"), a)
    _launch(_program("# source B"), b)
    assert b.benchmarks == 1 and config_key(b.launched_with[0]) == config_key(CONFIGS[2])


def test_a_kernel_already_settled_otherwise_is_left_alone_with_a_warning(caplog):
    program = _program()
    home, other = StandInAutotuner(fastest=1), StandInAutotuner(fastest=2)
    other.run()  # settled on its own before this process's launchers saw it
    _launch(program, home)
    with caplog.at_level("WARNING", logger="torch_tessera"):
        _launch(program, other)
        _launch(program, other)  # another launcher over the same kernel object: said once
    assert config_key(other.launched_with[-1]) == config_key(CONFIGS[2])
    assert caplog.text.count("may differ in the last bits") == 1


def test_settled_config_and_pin_config_on_their_own():
    t = StandInAutotuner(fastest=0)
    assert settled_config(t) is None  # three candidates, not compiled
    assert pin_config(t, CONFIGS[2]) and settled_config(t) is CONFIGS[2]
    u = StandInAutotuner(fastest=0)
    assert not pin_config(u, triton.Config({"XBLOCK": 2, "R0_BLOCK": 64}, num_warps=4))  # no such candidate
    assert [x.config for x in u.launchers] == CONFIGS  # compiled, all candidates left: its run benchmarks them
