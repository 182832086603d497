"""Where a cold `--compile` start spends its time, per family, per compiled unit and per phase.

Each family's torchcompile script runs with `--compile` at a tiny budget, in a fresh process with an empty Inductor
cache (a new `TORCHINDUCTOR_CACHE_DIR`) and a new temp dir (where Inductor keeps its precompiled headers), as a user's
first run on a new machine. In that process `torch.compile` is
patched to time each unit's first call (its compilation) and to read, around it, torch's own compile-time counters
(`torch._dynamo.utils.compilation_time_metrics`). Phases of a unit's compilation:

- `dynamo`: tracing the Python bytecode into a graph, building guards;
- `aot`: AOTAutograd (the joint forward/backward graph, functionalization, partitioning);
- `lowering`: Inductor lowering the graph to kernels, max_autotune's benchmarking of GEMM candidates included (each
  candidate is C++ compiled and run: with max_autotune on, most of a cold start on a CPU);
- `codegen`: Inductor writing the module's code;
- `build`: loading the module, the C++ compiler's run for its kernels (and, with cpp_wrapper, its wrapper) included;
- `c++`: every C++ compiler run of the unit (the candidates' and the module's), also counted in the phases above.

`--options` tries other Inductor options in place of the scripts' own: `script` (the default) runs each script as it
is; `none`, `cpp_wrapper`, `max_autotune` and `both` replace the options of every `torch.compile` call the script
makes. Each family and option set is its own cold start, one after the other. `--eager` leaves the units it names
uncompiled (named as the table names them): what compiling fewer units saves at the start and costs in fps.

`--steady` follows each cold start with a warm one at the family's sweep budget (run.sh's default sweep), from the
cache the cold start filled and with the same options: what a second run pays to compile (`warm`, from the units'
first calls) and its steady-state fps (summary.json's), so that an option set's cold cost and what it buys warm are
measured side by side.

    python leanrl/tools/bench_cold_compile.py --families classic mujoco --options script none --steady --out runs/cold
"""

import ast
import functools
import json
import os
import runpy
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import tyro

LEANRL = Path(__file__).resolve().parents[1]
# family: the torchcompile script and a budget just past its first compiled iteration (off-policy: past
# learning_starts, so that the update units compile)
FAMILIES = {
    "classic": ("ppo_torchcompile", ["--total-timesteps", "1024"]),
    "atari": ("ppo_atari_envpool_torchcompile", ["--total-timesteps", "2048"]),
    "mujoco": ("ppo_continuous_action_torchcompile", ["--total-timesteps", "4096"]),
    "sac": ("sac_continuous_action_torchcompile", ["--total-timesteps", "1200", "--learning-starts", "1000"]),
    "td3": ("td3_continuous_action_torchcompile", ["--total-timesteps", "1200", "--learning-starts", "1000"]),
    "dqn": ("dqn_torchcompile", ["--total-timesteps", "2000", "--learning-starts", "1000"]),
    "dqn_atari": (
        "dqn_atari_envpool_torchcompile",
        ["--total-timesteps", "1200", "--learning-starts", "1000", "--buffer-size", "2000"],
    ),
}
# run.sh's default sweep budgets, for --steady's warm runs
STEADY = {
    "classic": ["--total-timesteps", "200000"],
    "atari": ["--total-timesteps", "10240"],
    "mujoco": ["--total-timesteps", "20480"],
    "sac": ["--total-timesteps", "8000", "--learning-starts", "5000"],
    "td3": ["--total-timesteps", "8000", "--learning-starts", "5000"],
    "dqn": ["--total-timesteps", "30000"],
    "dqn_atari": [
        "--total-timesteps",
        "6000",
        "--learning-starts",
        "2000",
        "--measure-burnin",
        "500",
        "--log-every",
        "500",
        "--buffer-size",
        "100000",
    ],
}
PHASES = ("dynamo", "aot", "lowering", "codegen", "build", "c++")
OPTIONS = {
    "none": {},
    "cpp_wrapper": dict(cpp_wrapper=True),
    "max_autotune": dict(max_autotune=True),
    "both": dict(cpp_wrapper=True, max_autotune=True),
}


@dataclass
class Args:
    families: list[str] = field(default_factory=lambda: list(FAMILIES))
    """the families to measure (classic, atari, mujoco, sac, td3, dqn, dqn_atari)"""
    options: list[str] = field(default_factory=lambda: ["script"])
    """Inductor options per cold start: script (the script's own), none, cpp_wrapper, max_autotune, both, or Inductor
    options written key=value,key=value (values as Python literals: cpp.simdlen=1)"""
    out: str = "runs/cold"
    """where the runs and table.md go"""
    steady: bool = False
    """after each cold start, a warm one at the family's sweep budget: its compile and its steady-state fps"""
    eager: list[str] = field(default_factory=list)
    """units left uncompiled, named as the table names them (`Agent.get_value`): what compiling fewer units saves"""
    timeout: float = 900
    """seconds one cold start may take before it is stopped"""


def metrics() -> dict:
    return {k: sum(v) for k, v in torch._dynamo.utils.compilation_time_metrics.items()}


def phases(before: dict, after: dict) -> dict:
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    inner = d.get("_compile.compile_inner", 0.0)
    backend = d.get("OutputGraph.call_user_compiler", 0.0)
    inductor = d.get("fx_codegen_and_compile", 0.0)
    return {
        "dynamo": inner - backend,
        "aot": backend - inductor,
        "lowering": d.get("GraphLowering.run", 0.0),
        "codegen": d.get("GraphLowering.codegen", 0.0),
        "build": d.get("GraphLowering.compile_to_module", 0.0),
        "c++": d.get("compile_file", 0.0),
    }


def options_of(option_set: str) -> dict:
    """A named option set, or Inductor options written `key=value,key=value` (values as Python literals)."""
    if option_set in OPTIONS:
        return dict(OPTIONS[option_set])
    pairs = [item.split("=", 1) for item in option_set.split(",")]
    return {key: ast.literal_eval(value) for key, value in pairs}


def valid_options(option_set: str) -> bool:
    if option_set == "script" or option_set in OPTIONS:
        return True
    try:
        options = options_of(option_set)
    except (ValueError, SyntaxError):
        return False
    return set(options) <= set(torch._inductor.config.get_config_copy())


def name_of(fn) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def timed_compile(compile_, option_set: str, eager: list[str], units: dict):
    """torch.compile as the child process sees it: with `option_set`'s options in place of the script's, each unit's
    first call timed into `units`, and a unit named in `eager` returned as it is, uncompiled (marked so in `units`)."""

    def patched(fn=None, **kwargs):
        if fn is None:
            return functools.partial(patched, **kwargs)
        name = name_of(fn)
        if name in eager:
            units[name] = dict(eager=True)
            return fn
        if option_set != "script":
            kwargs["options"] = options_of(option_set)
        compiled = compile_(fn, **kwargs)

        def first_call_timed(*args, **kw):
            if name in units:
                return compiled(*args, **kw)
            before = metrics()
            t0 = time.perf_counter()
            result = compiled(*args, **kw)
            units[name] = dict(wall=time.perf_counter() - t0, **phases(before, metrics()))
            return result

        return first_call_timed

    return patched


def child(script: str, option_set: str, eager: list[str], flags: list[str], out: Path):
    """Runs in the fresh process: the script with its units' first calls timed, the table rows into out."""
    units = {}
    torch.compile = timed_compile(torch.compile, option_set, eager, units)
    sys.path.insert(0, str(LEANRL))
    sys.argv = [f"{script}.py", "--compile", *flags]
    t0 = time.perf_counter()
    try:
        runpy.run_path(str(LEANRL / f"{script}.py"), run_name="__main__")
    except SystemExit as e:
        if e.code:
            raise
    out.write_text(json.dumps(dict(units=units, run_wall=time.perf_counter() - t0)))


def cold_start(family: str, option_set: str, eager: list[str], out: Path, timeout: float, steady: bool) -> dict:
    """The family's cold start with these options, and with `steady` a warm one after it from the same cache."""
    script, flags = FAMILIES[family]
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as cache:
        # Inductor keeps its precompiled headers in the temp dir, not in its cache dir: both fresh, as on a new machine
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, TMPDIR=cache)
        data = start(script, option_set, eager, flags, out / "cold", env, timeout)
        if steady:
            warm = start(script, option_set, eager, STEADY[family], out / "warm", env, timeout)
            summary = json.loads((out / "warm" / "run" / "summary.json").read_text())
            data.update(warm=sum(u.get("wall", 0.0) for u in warm["units"].values()), fps=summary["fps"])
    return data


def start(
    script: str, option_set: str, eager: list[str], flags: list[str], out: Path, env: dict, timeout: float
) -> dict:
    """One run of the script in a fresh process: its units' first calls, timed."""
    out.mkdir(parents=True, exist_ok=True)
    result = out / "units.json"
    child = [script, option_set, ",".join(eager), str(result)]
    cmd = [sys.executable, __file__, "--child", *child, *flags, "--log-dir", str(out / "run")]
    with open(out / "stderr.log", "w") as err:
        subprocess.run(cmd, env=env, timeout=timeout, check=True, stdout=subprocess.DEVNULL, stderr=err)
    return json.loads(result.read_text())


def table(rows: dict) -> str:
    head = "| family | options | unit | cold compile (s) | " + " | ".join(PHASES) + " | warm compile (s) | steady fps |"
    lines = [head, "|---|---|---|---:|" + "---:|" * len(PHASES) + "---:|---:|"]
    for (family, option_set), data in rows.items():
        total = sum(u.get("wall", 0.0) for u in data["units"].values())
        for name, u in data["units"].items():
            if u.get("eager"):
                lines.append(f"| {family} | {option_set} | `{name}` | eager |" + " |" * len(PHASES) + " | |")
                continue
            cells = " | ".join(f"{u[p]:.1f}" for p in PHASES)
            lines.append(f"| {family} | {option_set} | `{name}` | {u['wall']:.1f} | {cells} | | |")
        fps = "-" if data.get("fps") is None else f"{data['fps']:.0f}"
        warm = f"{data['warm']:.1f} | {fps}" if "warm" in data else " |"
        lines.append(f"| {family} | {option_set} | all units | **{total:.1f}** |" + " |" * len(PHASES) + f" {warm} |")
    return "\n".join(lines) + "\n"


def main(args: Args):
    choices = (
        (args.families, [x for x in args.families if x not in FAMILIES], list(FAMILIES)),
        (args.options, [x for x in args.options if not valid_options(x)], ["script", *OPTIONS, "key=value,..."]),
    )
    for given, unknown, known in choices:
        if unknown or not given:
            print(f"unknown {unknown or 'nothing'}: choose among {', '.join(known)}", file=sys.stderr)
            sys.exit(2)
    out = Path(args.out)
    rows = {}
    for family in args.families:
        for option_set in args.options:
            folder = "-".join([family, option_set, *args.eager])
            rows[family, option_set] = cold_start(
                family, option_set, args.eager, out / folder, args.timeout, args.steady
            )
            print(table({(family, option_set): rows[family, option_set]}), flush=True)
    (out / "table.md").write_text(table(rows))
    print(table(rows))
    missed = unmatched(args.eager, rows)
    if missed:
        print(f"--eager: no unit named {', '.join(missed)} was compiled: name units as the table does", file=sys.stderr)
        sys.exit(2)


def unmatched(eager: list[str], rows: dict) -> list[str]:
    """The names given to --eager that no cold start met (a unit's name is known only once its script runs)."""
    met = {name for data in rows.values() for name, u in data["units"].items() if u.get("eager")}
    return [name for name in eager if name not in met]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], sys.argv[3], [x for x in sys.argv[4].split(",") if x], sys.argv[6:], Path(sys.argv[5]))
    else:
        main(tyro.cli(Args))
