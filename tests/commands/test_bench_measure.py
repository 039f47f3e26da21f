"""``tessera bench --measure`` on two CPU virtual devices: every plan compiled once, profiled, planned, run, checked,
for an LLM (llama), an SSM (mamba, with its state) and a diffusion transformer (dit); and ``tessera report table``
over its output.

Timings under the Triton interpreter mean nothing; these tests check the plumbing: a row per plan, every executed
plan equal to eager (serially and with micro-batches), not-applicable baselines marked, the bound from measured costs
above every plan, JSON written.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
from pathlib import Path

import pytest
import torch

from torch_tessera.benchmark import plan_names
from torch_tessera.cli import main
from torch_tessera.measure.execute import concurrent_counts


def test_measure_on_cpu_virtual_devices(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path / "cache"))  # profile every launch afresh
    rc = main(["bench", "--measure", "--model", "llama", "--size", "tiny", "--devices", "cpu:0,cpu:1",
               "--layers", "1", "--repeats", "1", "--warmup", "0", "--profile-repeats", "1", "--micro-batches", "2",
               "--concurrent-steps", "2", "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert rc == 0, out
    # said up front (stderr): what runs and how many calls; then the estimate once planned, and after each plan
    assert err.startswith("tessera bench --measure: llama (tiny, 1 layer(s)) on cpu:0,cpu:1\n"), err[:300]
    assert re.search(r"\n  about [\d,]+ calls of the compiled programs in step 4", err), err[:2000]
    planned = re.search(r"planned: 7 plans to run and time \(homo-L, .*\); about [\d.]+ (s|min) left: ([\d,]+) calls",
                        err)
    assert planned, err
    ran = {m.group(1): int(m.group(2)) for m in re.finditer(r"ran (\S+): (\d+) calls in \d+ s", err)}
    assert sum(ran.values()) == int(planned.group(2).replace(",", "")), (ran, planned.group(0))
    assert ran["homo-L"] == 2 * (1 + 0 + 1)  # per program: 1 checked + 0 warm-up + 1 timed, at home: no pipelining
    result = _load(tmp_path / "bench.json")["measured"]
    rows = {r["plan"]: r for r in result["rows"]}
    assert [n for n in rows if n != "tessera-single"] == list(plan_names(2))
    meta = result["meta"]
    assert meta["layers"] == 1 and meta["timings_meaningful"] is False
    assert all(len(v) == 2 and all(x > 0 for x in v) for v in meta["measured_kernel_seconds"].values())
    ran = [r for r in rows.values() if r["how"].startswith("run")]
    assert {r["plan"] for r in ran} >= {"homo-L", "homo-R", "tessera"}
    assert all(r["equal"] is True and r["seconds"]["prefill"] > 0 and r["seconds"]["decode"] > 0 for r in ran)
    assert any(r["cut_edges"] > 0 and r["pipelined_seconds"].get("decode", 0) > 0 for r in ran)  # a split plan pipelined
    split = [r for r in ran if r["cut_edges"] > 0]
    assert split and all(0 < r["concurrent_output_per_s"] < math.inf for r in split)  # prefill || decode timed
    for name in (r["plan"] for r in split):  # each thread's calls and its time from the common start
        threads, step = meta["runs"][name]["concurrent_threads"], meta["runs"][name]["concurrent_step_seconds"]
        freq = meta["plans"][name]["frequencies"]
        if not any("@" in n for n in freq):
            freq = {n: v["frequency"] for n, v in meta["programs"].items()}
        assert set(threads) == set(freq) and all(t["seconds"] > 0 for t in threads.values())
        # each thread made the calls the concurrent timing asked of it (--concurrent-steps 2; CPU: >= 1 call each)
        assert {n: t["calls"] for n, t in threads.items()} == concurrent_counts(freq, 2, 1), (name, threads)
        assert step > 0
    assert all(math.isnan(r["concurrent_output_per_s"]) for r in ran if r["plan"].startswith("homo"))
    bound = meta["zero_communication_bound_output_per_s"]
    for r in rows.values():
        if r["applies"]:
            assert 0 < r["output_per_s"] < math.inf, r  # CPU timings: positive, not compared (noise under load)
    for r in ran:
        # each executed plan's model over the same measured costs cannot beat the free-transfer plan on them by more
        # than that plan's MILP stopping gap (plan()'s default mip_gap, 0.5 %)
        assert 0 < r["predicted_output_per_s"] <= bound * 1.005, r
    _check_request_dist(rows, meta, ["prefill", "decode"])
    assert rows["pd"]["how"].startswith("derived")
    # the KV cache is kept on the device that writes it: homo-R copies in only the token ids and positions and
    # gathers only the logits (with the cache at home it moved the whole cache each way every call)
    logits = {"prefill": 1 * 16 * 256 * 4, "decode": 4 * 1 * 256 * 4}  # fp32 logits of one call (tiny: vocab 256)
    for name, moved in meta["runs"]["homo-R"]["bytes_per_call"].items():
        assert moved.get("input", 0) <= 512 and 0 < moved.get("gather", 0) <= logits[name], (name, moved)
    assert "MEASURED" in out and (tmp_path / "bench.png").stat().st_size > 0
    # stream priorities are opt-in (--priorities): every program ran "normal", recorded per run
    assert meta["settings"]["priorities"] is False
    assert meta["runs"]["layer"]["priority_classes"] == {"prefill": "normal", "decode": "normal"}
    _check_tessera_space(rows, meta, out)
    # on two equal CPU devices one request stream per device (each stream its own weights copy, KV cache and
    # executors) or request-dist's placement wins; whichever it is, tessera ran as streams and was checked
    if meta["tessera_from"] in ("streams", "request-dist"):
        assert set(meta["plans"]["tessera"]["placements"]) == {"prefill", "decode", "prefill@1", "decode@1"}
        assert 0 < rows["tessera"]["concurrent_output_per_s"] < math.inf and rows["tessera"]["equal"] is True
        assert set(meta["runs"]["tessera"]["seconds"]) == {"prefill", "decode", "prefill@1", "decode@1"}


def _check_tessera_space(rows: dict, meta: dict, out: str) -> None:
    """tessera was chosen over a space holding one request stream per device and every applicable baseline's
    placement, by the measured bench's score (cycle + fill/drain, recorded per candidate): its plan is the chosen
    candidate's, no baseline scores better, and the planner's own single placement stays as tessera-single exactly
    when another candidate won."""
    space, chosen = meta["tessera_space"], meta["tessera_from"]
    baselines = {n for n, r in rows.items() if r["applies"] and n not in ("tessera", "tessera-single")}
    assert set(space) == {"tessera", "streams"} | baselines, (space, baselines)
    assert all(space[chosen] <= space[b] * (1 + 1e-9) for b in space)  # ties within 1e-9: the planner's, streams
    placed = meta["plans"]["tessera"]["placements"]
    if chosen in baselines:  # the baseline's placement, run (or derived, for pd) as tessera
        assert placed == meta["plans"][chosen]["placements"]
    elif chosen == "streams":
        assert any("@" in n for n in placed)
    assert ("tessera-single" in rows) == (chosen != "tessera")
    if chosen != "tessera":
        assert not any("@" in n for n in meta["plans"]["tessera-single"]["placements"])
    assert meta["tessera_choice"].startswith("tessera = ") and meta["tessera_choice"] in out
    assert meta["settings"]["streams"] is True  # the default


#: Small and quick: one Mamba layer, 8-token prompts, 4 sequences, 2 micro-batches; the tiny dit's two blocks (one
#: dual-attention) without micro-batches (a call takes ~1.3 s in the interpreter; llama and mamba test pipelining).
#: The concurrent timing over 2 workload steps, as the llama test's (the default 8 made Mamba's decode threads 129
#: calls each, two thirds of its run; its plumbing is the same at 2).
OTHER_FAMILIES = {"mamba": ["--layers", "1", "--micro-batches", "2", "--concurrent-steps", "2"],
                  "dit": ["--micro-batches", "0", "--concurrent-steps", "2"]}


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """``bench --measure`` of the tiny mamba and dit on two CPU devices, once: model -> (rc, stdout, out dir)."""
    runs = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TESSERA_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        for model, extra in OTHER_FAMILIES.items():
            out = tmp_path_factory.mktemp(model)
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                rc = main(["bench", "--measure", "--model", model, "--size", "tiny", "--devices", "cpu:0,cpu:1",
                           "--repeats", "1", "--warmup", "0", "--profile-repeats", "1", "--out", str(out), *extra])
            runs[model] = (rc, buf.getvalue(), out)
    return runs


def _load(path) -> dict:
    """bench.json read with a strict parser (no NaN/Infinity tokens: the CLI writes them as null), then as the reports
    read it (the rows' nulls NaN again)."""
    from torch_tessera.measure.report import with_nan

    def refuse(constant):
        raise ValueError(f"bench.json holds {constant}, which is not JSON")
    return with_nan(json.loads(path.read_text(), parse_constant=refuse))


def _rows(out_dir) -> tuple[dict, dict]:
    result = _load(out_dir / "bench.json")["measured"]
    return {r["plan"]: r for r in result["rows"]}, result["meta"]


def _check_executed(rows: dict, programs: list[str], pipelined: bool, split: bool = True) -> list[dict]:
    """Every executed row equals eager and timed each program; with ``split``, some executed plan has cut edges."""
    ran = [r for r in rows.values() if r["how"].startswith("run")]
    assert {r["plan"] for r in ran} >= {"homo-L", "homo-R", "layer", "tessera"}
    for r in ran:
        assert r["equal"] is True, r
        streams = {n.rsplit("@", 1)[1] for n in r["seconds"] if "@" in n}  # a streams plan: <name>@<r> as well
        assert sorted(r["seconds"]) == sorted(programs + [f"{p}@{k}" for k in streams for p in programs]), r
        assert all(t > 0 for t in r["seconds"].values()), r
    assert any(r["cut_edges"] > 0 for r in ran) or not split
    assert any(r["pipelined_seconds"] for r in ran) == pipelined  # a split plan ran micro-batches
    return ran


def _check_request_dist(rows: dict, meta: dict, programs: list[str]) -> None:
    """request-dist ran as one request stream per device (stream r wholly on device r, checked against eager), with
    the sum of the homo-* runs beside it."""
    rd = rows["request-dist"]
    assert rd["how"].startswith("run") and rd["equal"] is True and rd["cut_edges"] == 0, rd
    assert sorted(rd["seconds"]) == sorted(programs + [f"{p}@1" for p in programs]), rd
    placed = meta["plans"]["request-dist"]["placements"]
    assert all(set(placed[p]) == {0} and set(placed[f"{p}@1"]) == {1} for p in programs), placed
    homos = rows["homo-L"]["output_per_s"] + rows["homo-R"]["output_per_s"]
    assert rd["derived_output_per_s"] == pytest.approx(homos)
    assert "sum of the homo-* runs alone" in rd["how"]


def test_measure_mamba_with_its_state_as_program_state(measured):
    rc, out, out_dir = measured["mamba"]
    assert rc == 0, out
    rows, meta = _rows(out_dir)
    assert [n for n in rows if n != "tessera-single"] == list(plan_names(2))
    assert meta["family"] == "ssm" and meta["unit"] == "tokens" and meta["layers"] == 1
    assert list(meta["programs"]) == ["prefill", "decode"] and meta["prefill_tokens"] == 8 and meta["batch"] == 4
    assert meta["programs"]["decode"]["frequency"] == pytest.approx(129 / 4)
    # one Mamba layer: layer and af have nothing to cut, and whether tessera splits depends on the CPU's measured
    # timings; the cross-device runs are checked on Llama's af row (test_measure_on_cpu_virtual_devices)
    ran = _check_executed(rows, ["prefill", "decode"], pipelined=True, split=False)
    _check_tessera_space(rows, meta, out)
    _check_request_dist(rows, meta, ["prefill", "decode"])
    # calls in flight for every program that leaves its home device (homo-R: wholly on the other), none at home
    assert set(rows["homo-R"]["pipelined_seconds"]) == {"prefill", "decode"} and not rows["homo-L"]["pipelined_seconds"]
    # TTFT / TPOT: the slowest stream's call (a streams plan runs prefill@1 / decode@1 too)
    assert all(r["ttft_s"] == max(t for n, t in r["seconds"].items() if n.split("@")[0] == "prefill") for r in ran)
    assert all(r["tpot_s"] == max(t for n, t in r["seconds"].items() if n.split("@")[0] == "decode") for r in ran)
    assert any("prefill@1" in r["seconds"] for r in ran)  # request-dist at least: the max is over streams
    assert not rows["af"]["applies"] and "attention" in rows["af"]["how"]  # Mamba has no attention kernels
    assert rows["pd"]["how"].startswith("derived") and "state copy" in rows["pd"]["how"]
    assert "conv/SSM state" in out and "tok/s" in out


def test_measure_diffusion_counts_images_and_marks_pd_not_applicable(measured):
    rc, out, out_dir = measured["dit"]
    assert rc == 0, out
    rows, meta = _rows(out_dir)
    assert meta["family"] == "diffusion" and meta["unit"] == "images" and meta["display_unit"] == "images/min"
    assert list(meta["programs"]) == ["denoise"] and meta["batch"] == 1
    assert meta["output_per_step"] == pytest.approx(1 / 28)  # the registry's 28 denoising steps per image
    ran = _check_executed(rows, ["denoise"], pipelined=False)
    _check_tessera_space(rows, meta, out)
    _check_request_dist(rows, meta, ["denoise"])
    for r in ran:  # images/s = images per step / the step's time (a streams plan: its streams' calls in turn)
        freq = meta["plans"][r["plan"]]["frequencies"]
        assert sum(freq.values()) == pytest.approx(1.0)
        assert r["output_per_s_serial"] == pytest.approx(1 / 28 / sum(f * r["seconds"][n] for n, f in freq.items()))
        assert math.isnan(r["ttft_s"])
    assert not rows["pd"]["applies"] and "pd does not apply" in rows["pd"]["how"]
    assert rows["af"]["applies"]  # joint attention on one device, the rest on the other
    assert "images/min" in out


def test_readme_table_from_measured_json(measured, capsys):
    from torch_tessera.measure.report import table as readme_table

    assert main(["report", "table", *[str(measured[m][2]) for m in OTHER_FAMILIES]]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("| model | profile | unit | homo-L | homo-R | request-dist | pd | af | layer | tessera")
    assert "target met?" in lines[0] and len(lines) == 2 + len(OTHER_FAMILIES)
    mamba, dit = lines[2:]
    assert mamba.startswith("| mamba (tiny, 1 layers) | cpu:0,cpu:1 (CPU: plumbing only) | tok/s |")
    assert dit.startswith("| dit (tiny) | cpu:0,cpu:1 (CPU: plumbing only) | images/min |")
    cells = [c.strip() for c in mamba.split("|")[1:-1]]
    assert cells[7] == "n/a" and cells[6].endswith("(derived)")  # af n/a, pd derived
    assert [c.strip() for c in dit.split("|")[1:-1]][6] == "n/a"  # pd
    # the targets, on made-up rows: met; behind a baseline; room not taken
    base = {"homo-L": {"applies": True, "output_per_s": 50.0}, "pd": {"applies": False}}
    assert readme_table.targets({**base, "tessera": {"applies": True, "output_per_s": 98.0}}, 100.0) == "yes"
    assert "behind homo-L" in readme_table.targets({**base, "tessera": {"applies": True, "output_per_s": 49.0}}, 50.0)
    missed = readme_table.targets({**base, "tessera": {"applies": True, "output_per_s": 60.0}}, 62.0)
    assert "homo-L: bound 1.24x" not in missed and missed == "yes"
    missed = readme_table.targets({**base, "tessera": {"applies": True, "output_per_s": 60.0}}, 100.0)
    assert "60.0 % of bound" in missed and "homo-L: bound 2.00x, tessera 1.20x" in missed
    # tessera's own single placement beside a streams plan is not a baseline to beat
    single = {**base, "tessera-single": {"applies": True, "output_per_s": 99.0}}
    assert readme_table.targets({**single, "tessera": {"applies": True, "output_per_s": 98.0}}, 100.0) == "yes"
    # --single: a streams run's single placement reported as tessera (the README's rows)
    run = {"measured": {"meta": {}, "rows": [{"plan": "homo-L", "output_per_s": 50.0},
                                             {"plan": "tessera", "output_per_s": 40.0},
                                             {"plan": "tessera-single", "output_per_s": 60.0}]}}
    rows = readme_table.single_placement(run)["measured"]["rows"]
    assert [(r["plan"], r["output_per_s"]) for r in rows] == [("homo-L", 50.0), ("tessera", 60.0)]
    assert readme_table.single_placement(readme_table.single_placement(run)) == readme_table.single_placement(run)


def test_measure_rejects_a_family_without_measured_programs(capsys):
    assert main(["bench", "--measure", "--model", "qwen2-vl", "--size", "tiny", "--devices", "cpu:0,cpu:1"]) == 2
    err = capsys.readouterr().err
    assert "multimodal" in err and "predicted mode" in err


def test_measure_rejects_simulated_devices(capsys):
    assert main(["bench", "--measure", "--model", "llama", "--size", "tiny", "--devices", "cpu:0,sim:l40s"]) == 2
    err = capsys.readouterr().err
    assert "sim:l40s is simulated" in err and "cuda:N@Ksm" in err


class _Chaotic(torch.nn.Module):
    """A tanh network at gain 3 (chaotic): its bf16 eager output is far from its fp32 output (cosine 0.958), as
    random-weight Mamba-2.8B's is at 8 layers (eager bf16 vs fp32 cosine 0.965 for a 16-token prefill, measured on
    CPU 2026-11-30)."""

    def __init__(self, width: int = 64, depth: int = 18) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.weights = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(width, width) * 3 / width ** 0.5)
                                              for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for w in self.weights:
            x = torch.tanh(x @ w)
        return x.float()


def test_bf16_check_measures_against_fp32_where_eager_bf16_is_itself_far_from_it(caplog):
    """Cosine with eager first; failing that, a compiled output no further from the fp32 reference than eager is
    equal, and one further (a wrong result) is not."""
    from torch_tessera.measure.execute import close_to_eager
    from torch_tessera.measure.programs import Compiled

    module = _Chaotic().to(torch.bfloat16)
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    prog = Compiled("step", module, (x,))
    with torch.no_grad():
        prog.want = module(x)
    ref = prog.fp32_reference()
    cos = torch.nn.functional.cosine_similarity
    assert cos(prog.want.flatten(), ref.flatten(), dim=0) < 0.99  # eager bf16 itself is far from fp32
    assert next(module.parameters()).dtype == torch.bfloat16  # the reference ran on a copy
    assert close_to_eager(prog.want.clone(), prog)[0]  # the cosine path
    near = ref + 1e-3 * torch.randn(ref.shape, generator=torch.Generator().manual_seed(2))
    assert cos(near.flatten(), prog.want.flatten(), dim=0) < 0.999
    assert close_to_eager(near, prog)[0]  # within eager's own bf16 error
    assert "equal within eager's own" in caplog.text
    wrong = torch.roll(ref, 1, dims=0)  # every row another input's answer
    ok, err = close_to_eager(wrong, prog)
    assert not ok and err > 0.1 and "DIFFERENT" in caplog.text


def test_request_dist_row_falls_back_to_the_homo_sum_when_its_streams_did_not_run():
    """An executed request-dist row carries the homo-* rows' sum beside it (their headline throughputs, as the table
    shows them); when its streams ran out of memory at run time the row is that sum, marked derived, with the reason
    (it stays in the comparison instead of dropping out)."""
    from types import SimpleNamespace

    from torch_tessera.measure.rows import _with_homo_sum

    s = SimpleNamespace(composition=SimpleNamespace(display=("images/min", 60.0)))
    rows = {"homo-L": {"applies": True, "output_per_s": 100.0, "ttft_s": math.nan, "tpot_s": math.nan},
            "homo-R": {"applies": True, "output_per_s": 30.0, "ttft_s": math.nan, "tpot_s": math.nan}}
    homo = {0: "homo-L", 1: "homo-R"}
    base = {"plan": "request-dist", "applies": True, "price_per_hour": 2.0}
    ran = _with_homo_sum({**base, "how": "run, programs concurrent", "output_per_s": 120.0}, base, rows, homo, s)
    assert ran["output_per_s"] == 120.0 and ran["derived_output_per_s"] == pytest.approx(130.0)
    assert ran["how"] == "run, programs concurrent (sum of the homo-* runs alone: 7,800 images/min)"
    oom = {"plan": "request-dist", "applies": False, "how": "does not fit (at run time): CUDA out of memory"}
    row = _with_homo_sum(oom, base, rows, homo, s)
    assert row["applies"] and row["output_per_s"] == pytest.approx(130.0)
    assert row["how"].startswith("derived: sum of homo-* replicas (the streams did not run: does not fit")
    failed = {**rows, "homo-R": {"plan": "homo-R", "applies": False, "how": "does not fit (at run time)"}}
    assert _with_homo_sum(oom, base, failed, homo, s) == oom  # a homo-* run failed: no sum to fall back to


def test_tessera_taking_pds_placement_is_derived_as_pds_row(monkeypatch):
    """When pd's placement wins tessera's space in the measured bench, tessera's row is pd's derivation (prefill and
    decode from their homo-* runs, the state hand-over measured), not an execution that would skip the hand-over;
    with another winner it is not derived."""
    from types import SimpleNamespace

    from torch_tessera.benchmark import choose_tessera
    from torch_tessera.measure import rows as rows_mod
    from torch_tessera.measure.settings import MeasureSettings
    from torch_tessera.scheduler import Workload, plan
    from torch_tessera.scheduler.synthetic import nvlink_topology, roofline_costs, transformer_dag

    devs = ("big", "small")
    pre, dec = transformer_dag(layers=2, tokens=64, context=256), transformer_dag(layers=2, tokens=8, context=256)
    wl = Workload.llm(pre, roofline_costs(pre, devs), dec, roofline_costs(dec, devs, seed=1), 4.0)
    topo = nvlink_topology(devs)
    plans = {n: plan(wl, None, topo, policy=n, cache_dir=False) for n in ("homo-L", "homo-R", "pd")}
    plans["tessera"] = plan(wl, None, topo, policy="homo-R", cache_dir=False)  # a planner's placement pd beats
    s = MeasureSettings(model="llama", size="tiny", repeats=1)
    freq = s.composition.frequencies
    score = {"pd": 1.0, "homo-L": 3.0, "homo-R": 4.0}
    choice = choose_tessera(plans, streams=False, score=lambda p: score.get(p.policy, 2.0))
    assert choice.chosen == "pd" and choice.plans["tessera"].placements == plans["pd"].placements
    monkeypatch.setattr(rows_mod, "handover_seconds", lambda prog, a, b, repeats: 0.004)
    spec = SimpleNamespace(name="d", price_per_hour=1.0)
    progs = [SimpleNamespace(name="prefill", runner=SimpleNamespace(devices=[SimpleNamespace(spec=spec)] * 2))]
    run = {"seconds": {"prefill": 0.01, "decode": 0.002}, "pipelined_seconds": {}, "equal": True,
           "max_abs_error": 0.0, "cut_edges": 0}
    runs = {"homo-L": run, "homo-R": dict(run, seconds={"prefill": 0.02, "decode": 0.003}),
            "tessera-single": run}
    out, _ = rows_mod.compose_rows(progs, choice.plans, runs, 0.001, s, tessera_from=choice.chosen)
    by = {r.plan: r for r in out}
    assert by["tessera"].how == by["pd"].how and by["tessera"].how.startswith("derived: prefill")
    assert by["tessera"].output_per_s == by["pd"].output_per_s
    a = next(iter(plans["pd"].placements["prefill"].values()))
    b = next(iter(plans["pd"].placements["decode"].values()))
    seconds = [runs[["homo-L", "homo-R"][d]]["seconds"] for d in (a, b)]
    cycle = max(freq["prefill"] * seconds[0]["prefill"], freq["decode"] * seconds[1]["decode"], 0.004)
    assert by["tessera"].output_per_s == pytest.approx(s.composition.output_per_step / cycle)
    other, _ = rows_mod.compose_rows(progs, {**choice.plans, "tessera": plans["homo-L"]}, runs, 0.001, s)
    assert {r.plan: r for r in other}["tessera"].how == "n/a: not run"  # not derived unless it took pd's placement


def test_plan_calls_follow_run_plan():
    """Calls run_plan makes per plan: per program 1 checked + warm-up + timed; off the home device micro-batches x
    (1 + repeats // 2) pipelined; over several devices the concurrent timing's calls (concurrent_counts)."""
    from torch_tessera.measure import MeasureSettings
    from torch_tessera.measure.estimate import expected_calls, plan_calls

    s = MeasureSettings(model="llama", size="tiny", repeats=10, warmup=2, micro_batches=4, concurrent_steps=8)
    freq = dict(s.composition.frequencies)  # prefill 1, decode 32.25 per workload step
    assert plan_calls(s, {"prefill": (0,), "decode": (0,)}, freq, on_cpu=True) == 2 * 13
    assert plan_calls(s, {"prefill": (1,), "decode": (1,)}, freq, on_cpu=True) == 2 * (13 + 4 * 6)
    both = 2 * (13 + 4 * 6) + sum(concurrent_counts(freq, 8, 1).values())
    assert plan_calls(s, {"prefill": (0, 1), "decode": (0, 1)}, freq, on_cpu=True) == both == 2 * 37 + 8 + 258
    calls = expected_calls(s, plan_names(2), 2, on_cpu=True)
    assert "pd" not in calls and calls["homo-L"] == 26 and calls["homo-R"] == 74 and calls["af"] == both


def test_a_full_size_measure_on_the_cpu_that_would_not_fit_says_so_before_building(capsys, monkeypatch):
    """On the CPU the builders make the whole model before keeping the asked layers: a full-size model larger than the
    host's memory is refused with its size, the memory available and the options that fit, instead of being built
    until the kernel kills the process. A tiny model passes the same check."""
    from torch_tessera.errors import ConfigError
    from torch_tessera.measure import programs
    from torch_tessera.measure.settings import MeasureSettings

    with pytest.raises(ConfigError, match=r"whole full llama \([\d.]+ GB of float32 weights, before keeping 1 "
                                          r"layer\(s\)\).* 8\.0 GB of memory available.*--size tiny"):
        programs.check_host_memory(MeasureSettings(model="llama", size="full", layers=1), torch.float32,
                                   available=8_000_000_000)
    programs.check_host_memory(MeasureSettings(model="llama", size="tiny"), torch.float32, available=8_000_000_000)
    monkeypatch.setattr(programs, "available_host_bytes", lambda: 8_000_000_000)
    code = main(["bench", "--measure", "--model", "llama", "--size", "full", "--layers", "1",
                 "--devices", "cpu:0,cpu:1", "--out", "/tmp/tessera_never_written"])
    err = capsys.readouterr().err
    assert code != 0 and "--size tiny" in err and "Traceback" not in err, err[-2000:]
    assert "calls of the compiled programs" not in err, err[:2000]  # refused before the run is announced
