"""The compile-time tools in leanrl/tools/: bench_guards.py (what skipping guard checks buys per unit) and
bench_cold_compile.py (where a cold --compile start spends its time). Their arithmetic and bad input only: the
timings themselves belong in doc/, not in a test."""

import functools
import sys

import torch

from conftest import ROOT, assert_user_error, run_command
from test_report import dry_run

sys.path.insert(0, str(ROOT / "leanrl" / "tools"))
import bench_cold_compile  # noqa: E402
import bench_guards  # noqa: E402


def test_guards_alternate_after_warmup_and_each_call_runs():
    """After its warm-up calls a unit alternates checked and skipped calls, every call still returning the compiled
    function's result, so that a run under the tool trains as it would without it."""
    seen = []

    def compiled(x):
        seen.append(x)
        return x * 2

    unit = bench_guards.Timed(compiled, "unit")
    out = [unit(i) for i in range(bench_guards.WARMUP + 6)]
    assert out == [2 * i for i in range(bench_guards.WARMUP + 6)]
    assert seen == list(range(bench_guards.WARMUP + 6))
    assert len(unit.times[True]) == len(unit.times[False]) == 3


def test_guards_tool_names_a_partial_by_its_function():
    def update(a, b):
        return a + b

    partial = functools.partial(update, 1)
    assert bench_guards.name_of(partial) == "test_guards_tool_names_a_partial_by_its_function.<locals>.update"
    assert bench_guards.name_of(torch.nn.Linear(2, 2).forward) == "Linear.forward"


def test_cold_compile_phases_split_torchs_counters():
    """Dynamo's time is its compile less the backend's; AOTAutograd's the backend less Inductor's, computed here by
    hand from made-up counters, before and after a unit's first call."""
    before = {"_compile.compile_inner": 1.0, "compile_file": 0.5}
    after = {
        "_compile.compile_inner": 11.0,
        "OutputGraph.call_user_compiler": 8.0,
        "fx_codegen_and_compile": 6.5,
        "GraphLowering.run": 2.0,
        "GraphLowering.codegen": 1.0,
        "GraphLowering.compile_to_module": 3.0,
        "compile_file": 4.0,
    }
    phases = bench_cold_compile.phases(before, after)
    assert phases == {"dynamo": 2.0, "aot": 1.5, "lowering": 2.0, "codegen": 1.0, "build": 3.0, "c++": 3.5}


def test_cold_compile_takes_inductor_options_written_out():
    """Beside the named sets, any Inductor options as key=value pairs, values read as Python literals."""
    options = bench_cold_compile.options_of("cpp.simdlen=1,max_autotune=True")
    assert options == {"cpp.simdlen": 1, "max_autotune": True}
    assert bench_cold_compile.options_of("both") == {"cpp_wrapper": True, "max_autotune": True}
    assert bench_cold_compile.valid_options("cpp_cache_precompile_headers=False")
    assert not bench_cold_compile.valid_options("cpp.no_such_option=1")
    assert not bench_cold_compile.valid_options("max_autotune=")


def test_cold_compile_leaves_the_units_named_eager_uncompiled():
    """A unit named in --eager is the script's own function, uncompiled and marked so; the others go through
    torch.compile with the option set's options, and their first call is timed."""
    compiled_with = {}

    def fake_compile(fn, options=None):
        compiled_with[bench_cold_compile.name_of(fn)] = options
        return lambda *a: ("compiled", fn(*a))

    def update(x):
        return x + 1

    value = torch.nn.Linear(2, 2).forward
    units = {}
    patched = bench_cold_compile.timed_compile(fake_compile, "none", ["Linear.forward"], units)
    assert patched(value) is value
    unit = patched(update)
    assert unit(1) == ("compiled", 2)
    assert unit(2) == ("compiled", 3)
    assert compiled_with == {"test_cold_compile_leaves_the_units_named_eager_uncompiled.<locals>.update": {}}
    assert units["Linear.forward"] == {"eager": True}
    assert set(units) == {"Linear.forward", "test_cold_compile_leaves_the_units_named_eager_uncompiled.<locals>.update"}
    table = bench_cold_compile.table({("classic", "none"): dict(units=units)})
    assert "| classic | none | `Linear.forward` | eager |" in table
    # a misspelt name meets no unit: the tool says so instead of a table of everything compiled
    rows = {("classic", "none"): dict(units=units)}
    assert bench_cold_compile.unmatched(["Linear.forward", "Agent.get_valeu"], rows) == ["Agent.get_valeu"]


def test_cold_compile_steady_runs_take_the_sweeps_budgets(tmp_path):
    """--steady's warm run of a family is the default sweep's `compile` run (run.sh, DRY=1), budget and all: TD3's
    own learning_starts (25,000) would leave the sweep's 8,000 steps no update, and the run would refuse to start."""
    runs, _ = dry_run(tmp_path, *bench_cold_compile.FAMILIES)
    for family, steady in bench_cold_compile.STEADY.items():
        command = runs[f"{family}/03-compile"][0]
        budget = command.split(" --log-dir ")[1].split()[1:]
        assert steady == budget, family


def test_cold_compile_refuses_an_unknown_family_or_option_set(tmp_path):
    tool = ROOT / "leanrl" / "tools" / "bench_cold_compile.py"
    for flags, word in (
        (["--families", "nope"], "nope"),
        (["--options", "fast"], "fast"),
        (["--options", "cpp.no_such_option=1"], "no_such_option"),
    ):
        proc = run_command([sys.executable, tool, *flags, "--out", tmp_path], timeout=120)
        assert_user_error(proc, word)
