"""A dumped program loads back equal (``dump_dir`` -> ``load_program``), and bad files fail with one clear line."""

from __future__ import annotations

import json

import pytest
import torch

from torch_tessera.backend import tessera_backend
from torch_tessera.lowering import ProgramFileError, load_program, program_to_json
from torch_tessera.lowering.program import ExternLaunch, ScalarArg, TensorArg
from torch_tessera.models import build_model


def _compile_with_dump(model_name: str, dump_dir) -> list:
    """Compile the tiny registry model with ``dump_dir`` set; the programs the executors run, in dump order."""
    model, inputs = build_model(model_name, "tiny")
    fns: list = []

    def backend(gm, example_inputs):
        fn = tessera_backend(gm, example_inputs, options={"fallback": "raise", "dump_dir": str(dump_dir)})
        fns.append(fn)
        return fn

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=backend, dynamic=False)(*inputs)
    return [e.program for fn in fns for e in fn.tessera_executors]


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    """``dumps(name) -> (dump dir, programs)``: each tiny registry model compiled once with ``dump_dir`` set."""
    done: dict = {}

    def get(name: str):
        if name not in done:
            d = tmp_path_factory.mktemp(f"dump-{name}")
            done[name] = d, _compile_with_dump(name, d)
        return done[name]

    return get


@pytest.mark.parametrize("name", ["llama", "mamba"])
def test_dump_loads_back_equal(dumps, name):
    d, programs = dumps(name)
    files = sorted(d.glob("program_*.json"))
    assert len(files) == len(programs) >= 1, (name, files)
    for i, program in enumerate(programs):
        back = load_program(d / f"program_{i}.json")
        # field by field first, so a failure names the part that differs
        assert back.buffers == program.buffers and back.kernels == program.kernels
        assert back.inputs == program.inputs and back.outputs == program.outputs
        assert back.launches == program.launches and back.static_inputs == program.static_inputs
        assert back == program and back.fingerprint == program.fingerprint
        assert program_to_json(back) == json.loads((d / f"program_{i}.json").read_text())  # and dumps the same file


def test_llama_dump_exercises_the_value_tags(dumps):
    p = dumps("llama")[1][0]
    assert any(isinstance(a, ScalarArg) for l in p.triton_launches for a in l.args)
    assert any(isinstance(l, ExternLaunch) and any(isinstance(a, TensorArg) for a in l.args) for l in p.launches)


def test_every_value_tag_round_trips():
    from torch_tessera.lowering.serialize import _Decoder, _value

    t = TensorArg("b", 2, (2, 3), (3, 1), torch.bfloat16)
    v = {"none": None, "t": t, "nested": (1, [2.5, float("inf")], ("x", True)), "dtype": torch.float16,
         "device": torch.device("cuda", 1), "layout": torch.strided, "fmt": torch.channels_last,
         "scalar": ScalarArg(3), 7: "int key"}
    back = _Decoder("test").value(json.loads(json.dumps(_value(v))), "v")
    assert back == v and isinstance(back["nested"], tuple) and isinstance(back["nested"][1], list)
    nan = _Decoder("test").value(json.loads(json.dumps(_value(float("nan")))), "v")
    assert nan != nan


def _one_line_error(path, match: str):
    with pytest.raises(ProgramFileError, match=match) as info:
        load_program(path)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(str(path))
    return msg


def test_missing_file(tmp_path):
    _one_line_error(tmp_path / "program_9.json", "cannot read the program file")


def test_not_json(tmp_path):
    p = tmp_path / "program_0.json"
    p.write_text("{ not json")
    _one_line_error(p, "not JSON")


def test_old_or_foreign_format(tmp_path):
    p = tmp_path / "program_0.json"
    p.write_text(json.dumps({"buffers": {}, "launches": []}))
    _one_line_error(p, "not a torch_tessera program dump")
    p.write_text(json.dumps({"format": "torch_tessera.KernelProgram", "version": 99}))
    _one_line_error(p, "format version 99")


def test_malformed_fields_name_where(tmp_path, dumps):
    d, _ = dumps("llama")
    data = json.loads((d / "program_0.json").read_text())
    p = tmp_path / "program_0.json"
    broken = json.loads(json.dumps(data))
    del broken["launches"][3]["index"]
    p.write_text(json.dumps(broken))
    _one_line_error(p, "missing field 'index'")
    broken = json.loads(json.dumps(data))
    broken["buffers"][0]["dtype"] = "float33"
    p.write_text(json.dumps(broken))
    _one_line_error(p, "unknown dtype 'float33'")
    broken = json.loads(json.dumps(data))
    broken["launches"][0]["kind"] = "cuda"
    p.write_text(json.dumps(broken))
    _one_line_error(p, "launch 0: kind 'cuda'")
    broken = json.loads(json.dumps(data))
    broken["inputs"][0] = {"$": "repr", "type": "Generator", "text": "<torch.Generator>"}
    p.write_text(json.dumps(broken))
    _one_line_error(p, "input 0: holds a Generator value .* cannot be replayed")


def test_plan_a_dumped_program_without_lowering(dumps, capsys, monkeypatch):
    import torch_tessera.lowering as lowering
    from torch_tessera.cli import main

    d, programs = dumps("llama")

    def no_lowering(*a, **k):
        raise AssertionError("tessera plan --program must not lower")

    monkeypatch.setattr(lowering, "lower", no_lowering)
    rc = main(["plan", "--program", str(d / "program_0.json"), "--devices", "sim:a100,sim:l40s", "--no-cache",
               "--gantt", "", "--time-limit", "5"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert f"{len(programs[0].launches)} launches" in out and "Plan 'throughput'" in out and "homo-L" in out


def test_plan_of_a_bad_file_exits_2_with_one_line(tmp_path, capsys):
    from torch_tessera.cli import main

    p = tmp_path / "program_0.json"
    p.write_text("[]")
    assert main(["plan", "--program", str(p), "--devices", "sim:a100,sim:l40s"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(p) in err and "not a torch_tessera program dump" in err
    assert main(["plan", "--program", str(tmp_path / "nope.json"), "--devices", "sim:a100,sim:l40s"]) == 2
    assert "nope.json: cannot read the program file" in capsys.readouterr().err
