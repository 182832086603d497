"""A trick copied as a user copies it, timed side by side: doc/copying/ppo_update.patch pastes ppo_torchcompile.py's
one-graph update (`ppo_loss`, `update`, `make_optimizer`, `adam_step`, `Agent.forward`) and its compile block into
the eager ppo.py, CleanRL's file, and changes nothing else (the rollout still acts through a Categorical). Four
configurations run in turn, per seed, on this machine: ppo.py, ppo.py --compile (its naive compile of the agent),
the copy with --compile, and ppo_torchcompile.py --compile. The table (steady-state fps, median over the seeds, and
the speed-up over ppo.py) goes to stdout and <out>/table.md.

    python leanrl/tools/bench_copy.py --seeds 1 2 3 --total-timesteps 100000 --out runs/copy
"""

import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch
import tyro

LEANRL = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(LEANRL))  # plumbing.py, for the machine's name as the training scripts record it
import plumbing  # noqa: E402

PATCH = LEANRL.parent / "doc" / "copying" / "ppo_update.patch"


@dataclass
class Args:
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])
    """the seeds; each seed runs all four configurations in turn"""
    total_timesteps: int = 100000
    """each run's steps (CartPole-v1)"""
    out: str = "runs/copy"
    """where the copied script, the runs and table.md go"""
    timeout: Optional[float] = 1800
    """seconds a run may take before it is stopped"""


def copy_script(out: Path) -> Path:
    """ppo.py with the patch applied, as <out>/leanrl/ppo_copied.py. `git apply` outside a repository works as `patch`
    does, and git is wherever this checkout is."""
    target = out / "leanrl"
    target.mkdir(parents=True, exist_ok=True)
    (target / "ppo.py").write_text((LEANRL / "ppo.py").read_text())
    subprocess.run(["git", "apply", "-p1", str(PATCH)], cwd=out, check=True, timeout=60)
    copied = target / "ppo_copied.py"
    (target / "ppo.py").rename(copied)
    return copied


def fps(script: Path, log_dir: Path, args: Args, seed: int, *flags: str) -> float:
    cmd = [sys.executable, str(script), "--seed", str(seed), "--total-timesteps", str(args.total_timesteps)]
    cmd += ["--log-dir", str(log_dir), *flags]
    # the copy imports plumbing.py as ppo.py does, from leanrl/
    env = dict(os.environ, PYTHONPATH=str(LEANRL))
    subprocess.run(cmd, check=True, timeout=args.timeout, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads((log_dir / "summary.json").read_text())["fps"]


def main():
    args = tyro.cli(Args)
    out = Path(args.out)
    copied = copy_script(out)
    configs = {
        "ppo.py": (LEANRL / "ppo.py", ()),
        "ppo.py --compile": (LEANRL / "ppo.py", ("--compile",)),
        "ppo.py + copied update and block, --compile": (copied, ("--compile",)),
        "ppo_torchcompile.py --compile": (LEANRL / "ppo_torchcompile.py", ("--compile",)),
    }
    found = {name: [] for name in configs}
    for seed in args.seeds:
        for k, (name, (script, flags)) in enumerate(configs.items()):
            found[name].append(fps(script, out / f"{k}" / str(seed), args, seed, *flags))
            print(f"seed {seed}: {name}: {found[name][-1]:.0f} fps", file=sys.stderr)
    base = statistics.median(found["ppo.py"])
    cpu = plumbing.machine_info(torch.device("cpu"))["cpu"]
    lines = [
        f"CartPole-v1, {args.total_timesteps:,} steps a run, seeds {', '.join(map(str, args.seeds))}; "
        f"{cpu}, torch {torch.__version__}; each run's steady-state fps (summary.json).",
        "",
        "| configuration | fps (median) | each seed | vs ppo.py |",
        "|---|---:|---|---:|",
    ]
    for name, values in found.items():
        median = statistics.median(values)
        each = ", ".join(f"{v:,.0f}" for v in values)
        lines.append(f"| {name} | {median:,.0f} | {each} | {median / base:.2f}x |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
