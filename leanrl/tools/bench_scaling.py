"""Scaling of the data-parallel PPO scripts over world sizes 1, 2, ... on this machine, launched with torchrun.

    python leanrl/tools/bench_scaling.py --scaling weak     # same batch per rank: the global batch grows with the ranks
    python leanrl/tools/bench_scaling.py --scaling strong   # same global batch, shared out among the ranks

For each world size it runs the script (all ranks on this machine, one intra-op thread each), reads rank 0's logs
and reports the steady-state global fps, the speedup and efficiency against world size 1 (ideal: speedup = world
size), and the t_sync share: the fraction of the steady-state wall time a rank spent in the loop's collectives (the
per-iteration one, where a rank waits for the slowest; the gradient all-reduce runs inside the update). It writes
`scaling_<mode>.json` (with the machine and the load average around each run), `scaling_<mode>.csv` and
`scaling_<mode>.png` into --out-dir. doc/distributed.md reads the numbers.
"""

import csv
import json
import math
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from typing import Literal, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # plumbing/ is in leanrl/, one up
import plumbing

LEANRL = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the training scripts' folder


@dataclass
class Args:
    """Scaling of the data-parallel PPO scripts over world sizes 1, 2, ... on this machine, launched with torchrun."""

    scaling: Literal["weak", "strong"] = "weak"
    """weak: --num-envs envs on every rank (the global batch grows); strong: --num-envs envs in all, shared out"""
    script: str = "ppo_ddp_torchcompile.py"
    """the data-parallel script to run (a file in leanrl/)"""
    max_world_size: Optional[int] = None
    """the largest world size to run (default: the CPU cores of this machine)"""
    num_envs: int = 4
    """envs per rank (weak) or in all (strong: every world size must divide it)"""
    num_steps: int = 128
    """steps per env per rollout"""
    total_timesteps: int = 100000
    """steps of the world-size-1 run; weak scaling gives world size N N times as many (the same iterations)"""
    compile: bool = True
    """pass --compile to the script (its fast path; compilation happens in the burn-in)"""
    measure_burnin: int = 3
    """iterations left out of the steady-state fps"""
    repeats: int = 1
    """runs per world size; the median fps is reported"""
    out_dir: str = os.path.join(os.path.dirname(LEANRL), "doc")
    """where scaling_<mode>.json, .csv and .png go"""


def check_args(args: Args) -> list:
    """Validates the flags; returns the world sizes to run."""
    if not os.path.isfile(os.path.join(LEANRL, args.script)):
        plumbing.fail(f"--script {args.script}: no such script in leanrl/ (e.g. ppo_ddp_torchcompile.py)")
    for name in ("num_envs", "num_steps", "total_timesteps", "repeats"):
        if getattr(args, name) <= 0:
            plumbing.fail(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.measure_burnin < 0:
        plumbing.fail(f"--measure-burnin must be at least 0, got {args.measure_burnin}")
    top = args.max_world_size if args.max_world_size is not None else plumbing.cores()
    if top <= 0:
        plumbing.fail(f"--max-world-size must be positive, got {top}")
    sizes = list(range(1, top + 1))
    if args.scaling == "strong" and any(args.num_envs % n for n in sizes):
        plumbing.fail(
            f"--scaling strong shares --num-envs {args.num_envs} out among 1..{top} ranks: pick a multiple of "
            f"{math.lcm(*sizes)}"
        )
    if args.compile:
        plumbing.check_compile_cache()
    try:  # made now: the numbers of a sweep that ran for an hour are not lost to a folder that cannot be written
        os.makedirs(args.out_dir, exist_ok=True)
        tempfile.TemporaryFile(dir=args.out_dir).close()
    except OSError as e:
        plumbing.fail(f"--out-dir {args.out_dir}: cannot write there ({e.strerror or e})")
    if args.total_timesteps < args.num_envs * args.num_steps * (args.measure_burnin + 1):
        plumbing.fail(
            f"--total-timesteps {args.total_timesteps} leaves no iteration after the {args.measure_burnin} of "
            f"burn-in; give at least {args.num_envs * args.num_steps * (args.measure_burnin + 1)}"
        )
    return sizes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_once(args: Args, world_size: int, log_dir: str) -> dict:
    """One torchrun job; returns fps and the t_sync share from rank 0's logs."""
    num_envs = args.num_envs if args.scaling == "weak" else args.num_envs // world_size
    total = args.total_timesteps * (world_size if args.scaling == "weak" else 1)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(world_size),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        os.path.join(LEANRL, args.script),
        "--num-envs",
        str(num_envs),
        "--num-steps",
        str(args.num_steps),
        "--total-timesteps",
        str(total),
        "--measure-burnin",
        str(args.measure_burnin),
        "--num-threads",
        "1",
        "--log-dir",
        log_dir,
    ]
    load_before = os.getloadavg()[0]
    proc = subprocess.run(cmd + (["--compile"] if args.compile else []), capture_output=True, text=True, check=False)
    if proc.returncode:
        sys.exit(f"world size {world_size} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    with open(os.path.join(log_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    with open(os.path.join(log_dir, "summary.json")) as f:
        summary = json.load(f)
    steady = rows[args.measure_burnin :]
    wall = steady[-1]["time"] - (rows[args.measure_burnin - 1]["time"] if args.measure_burnin else 0.0)
    return dict(
        num_envs=num_envs,
        global_batch=num_envs * args.num_steps * world_size,
        fps=summary["fps"],
        t_sync_share=sum(r["t_sync"] for r in steady) / wall,
        t_sync_per_iteration=statistics.median(r["t_sync"] for r in steady),
        final_return=summary["final_return"],
        load_before=load_before,
        load_after=os.getloadavg()[0],
        cpu=summary["cpu"],
        torch=summary["torch"],
    )


def plot(rows: list, mode: str, path: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [r["world_size"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.6))
    ax1.plot(sizes, [r["speedup"] for r in rows], "o-", label="measured")
    ax1.plot(sizes, sizes, "k--", lw=1, label="ideal")
    ax1.set(xlabel="world size (ranks)", ylabel="speedup over 1 rank", title=f"{mode} scaling: speedup")
    ax1.legend()
    ax2.bar(sizes, [r["efficiency"] for r in rows], width=0.4, label="efficiency")
    ax2.bar(sizes, [r["t_sync_share"] for r in rows], width=0.2, label="t_sync share")
    ax2.set(xlabel="world size (ranks)", ylim=(0, 1.1), title="efficiency and time in collectives")
    ax2.legend()
    for ax in (ax1, ax2):
        ax.set_xticks(sizes)
    fig.suptitle(f"{rows[0]['cpu']}, torch {rows[0]['torch']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(args: Args):
    sizes = check_args(args)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_scaling_") as tmp:
        for world_size in sizes:
            runs = [run_once(args, world_size, os.path.join(tmp, f"ws{world_size}_{i}")) for i in range(args.repeats)]
            row = sorted(runs, key=lambda r: r["fps"])[len(runs) // 2]  # the median run
            rows.append(dict(world_size=world_size, **row, fps_runs=[r["fps"] for r in runs]))
            print(
                f"world size {world_size}: {row['fps']:.0f} fps, t_sync {row['t_sync_share']:.1%} "
                f"(load {row['load_before']:.1f})",
                file=sys.stderr,
            )
    for r in rows:
        r["speedup"] = r["fps"] / rows[0]["fps"]
        r["efficiency"] = r["speedup"] / r["world_size"]
    os.makedirs(args.out_dir, exist_ok=True)
    stem = os.path.join(args.out_dir, f"scaling_{args.scaling}")
    with open(stem + ".json", "w") as f:
        json.dump(dict(args=asdict(args), machine=platform.node(), rows=rows), f, indent=2)
    columns = [
        "world_size",
        "num_envs",
        "global_batch",
        "fps",
        "speedup",
        "efficiency",
        "t_sync_share",
        "t_sync_per_iteration",
        "final_return",
        "load_before",
        "load_after",
    ]
    with open(stem + ".csv", "w", newline="") as f:
        writer = csv.DictWriter(f, columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, args.scaling, stem + ".png")
    print(f"wrote {stem}.json, .csv and .png", file=sys.stderr)


if __name__ == "__main__":
    main(plumbing.parse_args(Args))
