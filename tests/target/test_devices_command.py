"""``tessera devices`` output on a machine without (or with) GPUs."""

from __future__ import annotations

import argparse

import torch

from torch_tessera.commands import devices as command
from torch_tessera.target import catalog


def run(capsys, *argv):
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    code = command.run(parser.parse_args(list(argv)))
    return code, capsys.readouterr().out


def test_lists_catalog_profiles_and_requested_devices(capsys):
    code, out = run(capsys, "--devices", "cuda:1@66sm+throttle36,mem=40GB,sim:l40s", "--assume-gpu", "h200")
    assert code == 0
    assert "Detected GPUs" in out and "Simulated catalog" in out and "Emulation profiles" in out
    for key in catalog.CATALOG:
        assert f"sim:{key} " in out
    row = next(l for l in out.splitlines() if l.startswith("cuda:1@66sm"))
    assert "72/132 (+36 streaming)" in row and " 40 " in row  # granted SMs; 40 GB budget
    l40s = next(l for l in out.splitlines() if l.startswith("sim:l40s "))
    assert "362" in l40s and "864" in l40s and "48" in l40s  # TFLOP/s, GB/s, GB
    if not torch.cuda.is_available():
        assert "none (no CUDA GPU visible)" in out


def test_measures_links_between_cpu_virtual_devices(capsys):
    code, out = run(capsys, "--devices", "cpu:0,cpu:1", "--measure-links", "--link-sizes", "4KiB,64KiB")
    assert code == 0
    lines = [l.split() for l in out.split("Measured links")[1].splitlines() if l.startswith("cpu:")]
    assert {(l[0], l[1], l[2], l[3]) for l in lines} == {
        ("cpu:0", "cpu:1", "host", "4096"), ("cpu:0", "cpu:1", "host", "65536"),
        ("cpu:1", "cpu:0", "host", "4096"), ("cpu:1", "cpu:0", "host", "65536")}
    assert all(float(l[4]) > 0 and float(l[5]) > 0 for l in lines)


def test_sources_cover_every_figure(capsys):
    code, out = run(capsys, "--sources")
    assert code == 0
    section, hops = out.split("Catalog figures and their sources")[1].split("Per-hop charge of a cut edge")
    rows = [l for l in section.splitlines()[3:] if l.strip()]
    assert len(rows) == 5 * len(catalog.CATALOG)
    from torch_tessera.target.links import HOP_FIGURES

    assert len([l for l in hops.splitlines()[3:] if l.strip()]) == len(HOP_FIGURES)


def test_bad_device_string_exits_2_with_the_forms(capsys):
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    assert command.run(parser.parse_args(["--devices", "cuda:1@24smx"])) == 2
    err = capsys.readouterr().err  # on stderr, as every command's errors
    assert err.startswith("tessera devices: error: ") and "accepted device strings" in err and "cuda:N@Ksm" in err


def test_partitions_of_one_gpu_show_their_shared_memory(capsys):
    code, out = run(capsys, "--devices", "cuda:0@104sm,cuda:0@24sm,cuda:1", "--assume-gpu", "h200")
    assert code == 0
    shared = [l for l in out.splitlines() if l.startswith("shared memory")]
    assert shared == ["shared memory of GPU cuda:0: the 141.00 GB of one NVIDIA H200, shared by cuda:0@104sm, "
                      "cuda:0@24sm; plans keep them within 141.00 GB together"]
