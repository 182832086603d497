"""Many seeds, two ways, side by side on this machine: the seeds script (the members stacked) against the ordinary
way, one run of the base script per seed, two at a time, each pinned to a core of its own (as doc/learning.md's runs
were made). The seeds way uses the cores alike: `--processes` seeds-script runs side by side, each pinned to a core of
its own, the members shared out among them (seeds seed ... in order). Both with --compile; the wall time counts
everything, compiling included.

Per way: the wall time for all seeds, each seed's final return (a member is its seed's run, so the returns agree up
to float drift), and where one iteration's time goes (the metrics' t_env, t_policy, t_gae, t_update, median over
the iterations after burn-in). `--sizes` adds seeds-script runs of other sizes (e.g. 1 4 8) for the time split.
The table goes to <out>/table.md, the numbers to <out>/results.json.

    python leanrl/tools/bench_seeds.py --num-seeds 8 --total-timesteps 500000 --out runs/seeds
"""

import json
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional

LEANRL = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(LEANRL))  # plumbing/ is in leanrl/, one up
import plumbing  # noqa: E402

FAMILIES = {
    "classic": ("ppo_torchcompile", "ppo_seeds_torchcompile"),
    "mujoco": ("ppo_continuous_action_torchcompile", "ppo_continuous_action_seeds_torchcompile"),
    "atari": ("ppo_atari_envpool_torchcompile", "ppo_atari_envpool_seeds_torchcompile"),
}
SPLIT = ("t_env", "t_policy", "t_gae", "t_update")


@dataclass
class Args:
    family: Literal["classic", "mujoco", "atari"] = "classic"
    """the family: classic (CartPole), mujoco (HalfCheetah) or atari (Breakout)"""
    num_seeds: int = 8
    """seeds per way: seed, seed + 1, ..."""
    seed: int = 1
    """the first seed"""
    total_timesteps: int = 500000
    """each seed's steps"""
    processes: int = 2
    """seeds-script runs side by side, each pinned to a core and given num_seeds / processes members (as the ordinary
    way runs two at a time): one process per core measured fastest (envpool's threads and the loop on one core, no
    cross-core wake-ups)"""
    sizes: list[int] = field(default_factory=list)
    """further seeds-script runs of these sizes, for the time split per iteration (e.g. 1 4 8)"""
    out: str = "runs/seeds"
    """where the runs, table.md and results.json go"""
    timeout: Optional[float] = 3600
    """seconds a run may take before it is stopped"""


def check_args(args: Args):
    """Every flag checked before any run starts: a mistake is one line and exit code 2, not a traceback after the
    ordinary way's runs."""
    plumbing.positive(args, "num_seeds", "total_timesteps", "processes", "sizes", "timeout")
    plumbing.require(args, lambda v: 0 <= v < 2**31, "in [0, 2**31)", "seed")
    if args.num_seeds % args.processes:
        plumbing.fail(
            f"--num-seeds {args.num_seeds} does not share out among --processes {args.processes}: pick a multiple of it"
        )
    plumbing.check_compile_cache()  # every run compiles
    try:
        Path(args.out).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        plumbing.fail(f"--out {args.out}: cannot write there ({e.strerror or e})")


def launch(script: str, log_dir: Path, core: Optional[int], *flags: str) -> subprocess.Popen:
    cmd = [sys.executable, str(LEANRL / f"{script}.py"), "--compile", "--log-dir", str(log_dir), *flags]
    if core is not None:
        cmd = ["taskset", "-c", str(core)] + cmd
    log_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{log_dir}.log", "w") as log:  # the child keeps its own handle
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)


def wait(proc: subprocess.Popen, timeout: Optional[float], what: str):
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)
        raise SystemExit(f"{what} ran past --timeout {timeout} s") from None
    if proc.returncode:
        raise SystemExit(f"{what} failed (exit {proc.returncode}); see its .log beside the run folder")


def split(log_dir: Path) -> dict:
    """Each part of an iteration, the median over the iterations with a steady fps (after burn-in), in ms."""
    rows = [json.loads(line) for line in open(log_dir / "metrics.jsonl")]
    steady = [row for row in rows if row["fps"] is not None] or rows
    return {key: 1000 * statistics.median(row[key] for row in steady) for key in SPLIT}


def ordinary(args: Args, base: str, out: Path) -> dict:
    """One base run per seed, two at a time, on cores 0 and 1."""
    t0 = time.perf_counter()
    seeds = list(range(args.seed, args.seed + args.num_seeds))
    for pair in range(0, len(seeds), 2):
        procs = [
            (launch(base, out / f"seed{s}", core, "--seed", str(s), "--total-timesteps", str(args.total_timesteps)), s)
            for core, s in enumerate(seeds[pair : pair + 2])
        ]
        for proc, s in procs:
            wait(proc, args.timeout, f"{base} --seed {s}")
    wall = time.perf_counter() - t0
    returns = [json.load(open(out / f"seed{s}" / "summary.json"))["final_return"] for s in seeds]
    return dict(wall_s=wall, returns=returns, split_ms=split(out / f"seed{seeds[0]}"))


def stacked(args: Args, script: str, n: int, out: Path, processes: int = 1) -> dict:
    """n members in `processes` runs of the seeds script side by side, each pinned to a core of its own (cores 0, 1,
    ...), run p holding the members seed + p * n / processes onwards; one process alone runs in <out>."""
    t0 = time.perf_counter()
    each = n // processes
    dirs = [out] if processes == 1 else [out / f"part{p}" for p in range(processes)]
    procs = [
        launch(
            script,
            log_dir,
            p,
            *("--seed", str(args.seed + p * each), "--num-seeds", str(each)),
            *("--total-timesteps", str(args.total_timesteps)),
        )
        for p, log_dir in enumerate(dirs)
    ]
    for proc in procs:
        wait(proc, args.timeout, f"{script} --num-seeds {each}")
    wall = time.perf_counter() - t0
    summaries = [json.load(open(log_dir / "summary.json")) for log_dir in dirs]
    return dict(
        wall_s=wall,
        processes=processes,
        returns=[m["final_return"] for s in summaries for m in s["members"]],
        split_ms=split(dirs[0]),
        compile_s=max(s["compile_time"] for s in summaries),
        cpu=re.sub(r", this process on \d+", "", summaries[0]["cpu"]),  # the machine, as the scripts name it
    )


def main(args: Args):
    check_args(args)
    base, script = FAMILIES[args.family]
    out = Path(args.out)
    results = dict(
        family=args.family,
        total_timesteps=args.total_timesteps,
        num_seeds=args.num_seeds,
        commit=subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
        date=time.strftime("%Y-%m-%d"),
    )
    results["ordinary"] = ordinary(args, base, out / "ordinary")
    way = out / f"seeds{args.num_seeds}-in-{args.processes}"
    results["seeds"] = stacked(args, script, args.num_seeds, way, args.processes)
    results["cpu"] = results["seeds"]["cpu"]  # as the scripts name it: the model and the cores this process may use
    results["sizes"] = {n: stacked(args, script, n, out / f"seeds{n}") for n in args.sizes}
    lines = [
        f"{args.family}, {args.num_seeds} seeds x {args.total_timesteps:,} steps, --compile, {results['date']}, "
        f"commit {results['commit']}, {results['cpu']}",
        "",
        f"The seeds way: {args.processes} seeds-script runs side by side, each pinned to a core, "
        f"{args.num_seeds // args.processes} members each. Sizes: one run alone, pinned to core 0.",
        "",
        "| way | wall s | vs ordinary | final returns |",
        "|---|---:|---:|---|",
    ]
    for way in ("ordinary", "seeds"):
        r = results[way]
        ratio = results["ordinary"]["wall_s"] / r["wall_s"]
        rets = ", ".join(f"{x:.1f}" if x is not None else "-" for x in r["returns"])
        lines.append(f"| {way} | {r['wall_s']:.1f} | {ratio:.2f}x | {rets} |")
    lines += ["", "| run | " + " | ".join(f"{k} ms" for k in SPLIT) + " |", "|---|" + "---:|" * len(SPLIT)]
    each = args.num_seeds // args.processes
    rows = [("ordinary (one seed)", results["ordinary"]), (f"seeds way: one of its runs, N={each}", results["seeds"])]
    rows += [(f"seeds N={n} alone", r) for n, r in results["sizes"].items()]
    for name, r in rows:
        lines.append(f"| {name} | " + " | ".join(f"{r['split_ms'][k]:.1f}" for k in SPLIT) + " |")
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text("\n".join(lines) + "\n")
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main(plumbing.parse_args(Args))
