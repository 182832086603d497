"""What skipping torch.compile's guard checks buys, per compiled unit, inside a real run.

A compiled function checks its guards at every call: that the tensors it reads keep their shapes and dtypes, and
that the Python numbers it read when it was traced (a float lr, `args.ent_coef`) keep their values. The check runs in
C++, but a unit that reads a module, its optimizer's state and a dataclass of settings has hundreds of guards.
`torch.compiler.set_stance(skip_guard_eval_unsafe=True)` skips them, and so also skips noticing a changed number.

This tool runs a training script in this process with `torch.compile` patched so that each compiled unit, after its
first calls (compilation and warm-up), alternates calls with the guards checked and skipped, and times each call.
Per unit: the calls, the median time of a call each way, and what skipping every check would save, as a share of the
whole run's wall time (compilation included). The training itself is the script's own (its numbers do not change:
the same compiled code runs either way).

    python leanrl/tools/bench_guards.py --script ppo_torchcompile -- --total-timesteps 100000
"""

import functools
import runpy
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import tyro

LEANRL = Path(__file__).resolve().parents[1]
WARMUP = 4  # calls left out per unit: compilation, recompilation on a second input, warm-up


@dataclass
class Args:
    script: str = "ppo_torchcompile"
    """the training script, a name in leanrl/ (its flags follow `--`; `--compile` is added)"""


def name_of(fn) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__qualname__", None) or type(fn).__name__


class Timed:
    """A compiled unit whose calls alternate between guards checked and skipped, each call timed."""

    def __init__(self, compiled, name: str):
        self.compiled = compiled
        self.name = name
        self.calls = 0
        self.times = {False: [], True: []}

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls <= WARMUP:
            with torch.compiler.set_stance("default"):
                return self.compiled(*args, **kwargs)
        skip = self.calls % 2 == 0
        with torch.compiler.set_stance("default", skip_guard_eval_unsafe=skip):
            t0 = time.perf_counter()
            out = self.compiled(*args, **kwargs)
            self.times[skip].append(time.perf_counter() - t0)
        return out


def main(args: Args, script_flags: list[str]) -> list[dict]:
    units = []
    compile_ = torch.compile

    def patched(fn=None, **kwargs):
        if fn is None:
            return functools.partial(patched, **kwargs)
        unit = Timed(compile_(fn, **kwargs), name_of(fn))
        units.append(unit)
        return unit

    torch.compile = patched
    sys.path.insert(0, str(LEANRL))
    sys.argv = [f"{args.script}.py", "--compile", *script_flags]
    t0 = time.perf_counter()
    try:
        runpy.run_path(str(LEANRL / f"{args.script}.py"), run_name="__main__")
    except SystemExit as e:
        if e.code:
            raise
    finally:
        torch.compile = compile_
    wall = time.perf_counter() - t0
    rows = []
    for unit in units:
        if not unit.times[True] or not unit.times[False]:
            continue
        checked = statistics.median(unit.times[False])
        skipped = statistics.median(unit.times[True])
        rows.append(
            dict(
                unit=unit.name,
                calls=unit.calls,
                checked_us=checked * 1e6,
                skipped_us=skipped * 1e6,
                saving_s=(checked - skipped) * unit.calls,
                wall_s=wall,
            )
        )
    return rows


if __name__ == "__main__":
    argv = sys.argv[1:]
    script_flags = argv[argv.index("--") + 1 :] if "--" in argv else []
    tool_argv = argv[: argv.index("--")] if "--" in argv else argv
    rows = main(tyro.cli(Args, args=tool_argv), script_flags)
    print("| unit | calls | a call, guards checked (us) | skipped (us) | skipping saves (s, % of the run) |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        share = 100 * r["saving_s"] / r["wall_s"]
        print(
            f"| `{r['unit']}` | {r['calls']:,} | {r['checked_us']:.0f} | {r['skipped_us']:.0f} "
            f"| {r['saving_s']:.2f} ({share:.1f}%) |"
        )
