"""A trick copied as a user copies it, timed side by side. A patch in doc/copying/ pastes a torchcompile script's
one-graph update (`ppo_loss`, `update`, `make_optimizer`, `adam_step`, `Agent.forward`) and its compile block into the
eager CleanRL-faithful baseline, and changes nothing else (the rollout still acts through a Categorical or a Normal):
ppo_update.patch into ppo.py (--family ppo, CartPole-v1), ppo_continuous_update.patch into ppo_continuous_action.py
(--family ppo_continuous_action, HalfCheetah-v4). Six configurations run in turn, per seed, on this machine: the
baseline at torch's default threads, and at one (`torch.set_num_threads(1)`, the thread trick alone); the baseline
--compile (its naive compile of the agent); the copy with --compile, at the default threads and at one; the
torchcompile script --compile (its default: one thread). The table (steady-state fps, median over the seeds, and the
speed-up over the baseline) goes to stdout and <out>/table.md.

    python leanrl/tools/bench_copy.py --seeds 1 2 3 --total-timesteps 100000 --out runs/copy
    python leanrl/tools/bench_copy.py --family ppo_continuous_action --total-timesteps 20480 --out runs/copy_mujoco
"""

import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional

import torch
import tyro

LEANRL = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(LEANRL))  # the plumbing package, for the machine's name as the training scripts record it
import plumbing  # noqa: E402

PATCHES = LEANRL.parent / "doc" / "copying"


@dataclass(frozen=True)
class Family:
    baseline: str
    """the eager CleanRL-faithful script the patch applies to"""
    patch: str
    """the patch, in doc/copying/"""
    ours: str
    """the torchcompile script the patch copies from"""
    env_id: str
    """the family's default env, for the table's title"""


FAMILIES = {
    "ppo": Family("ppo.py", "ppo_update.patch", "ppo_torchcompile.py", "CartPole-v1"),
    "ppo_continuous_action": Family(
        "ppo_continuous_action.py",
        "ppo_continuous_update.patch",
        "ppo_continuous_action_torchcompile.py",
        "HalfCheetah-v4",
    ),
}


@dataclass
class Args:
    family: Literal["ppo", "ppo_continuous_action"] = "ppo"
    """which baseline and patch: ppo.py with ppo_update.patch, or ppo_continuous_action.py with
    ppo_continuous_update.patch"""
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])
    """the seeds; each seed runs all six configurations in turn"""
    total_timesteps: int = 100000
    """each run's steps (the family's default env)"""
    out: str = "runs/copy"
    """where the copied script, the runs and table.md go"""
    timeout: Optional[float] = 1800
    """seconds a run may take before it is stopped"""


def copy_script(out: Path, family: str = "ppo") -> Path:
    """The family's baseline with its patch applied, as <out>/leanrl/<baseline>_copied.py. `git apply` outside a
    repository works as `patch` does, and git is wherever this checkout is."""
    spec = FAMILIES[family]
    target = out / "leanrl"
    target.mkdir(parents=True, exist_ok=True)
    (target / spec.baseline).write_text((LEANRL / spec.baseline).read_text())
    subprocess.run(["git", "apply", "-p1", str(PATCHES / spec.patch)], cwd=out, check=True, timeout=60)
    copied = target / spec.baseline.replace(".py", "_copied.py")
    (target / spec.baseline).rename(copied)
    return copied


def fps(script: Path, log_dir: Path, args: Args, seed: int, *flags: str) -> float:
    cmd = [sys.executable, str(script), "--seed", str(seed), "--total-timesteps", str(args.total_timesteps)]
    cmd += ["--log-dir", str(log_dir), *flags]
    # the copy imports the plumbing package as the baseline does, from leanrl/
    env = dict(os.environ, PYTHONPATH=str(LEANRL))
    subprocess.run(cmd, check=True, timeout=args.timeout, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads((log_dir / "summary.json").read_text())["fps"]


def main():
    args = tyro.cli(Args)
    spec = FAMILIES[args.family]
    out = Path(args.out)
    copied = copy_script(out, args.family)
    base = spec.baseline
    one = ("--num-threads", "1")
    configs = {
        base: (LEANRL / base, ()),
        f"{base} --num-threads 1": (LEANRL / base, one),
        f"{base} --compile": (LEANRL / base, ("--compile",)),
        f"{base} + copied update and block, --compile": (copied, ("--compile",)),
        f"{base} + copied update and block, --compile --num-threads 1": (copied, ("--compile", *one)),
        f"{spec.ours} --compile": (LEANRL / spec.ours, ("--compile",)),
    }
    load = os.getloadavg()[0]
    found = {name: [] for name in configs}
    for seed in args.seeds:
        for k, (name, (script, flags)) in enumerate(configs.items()):
            found[name].append(fps(script, out / f"{k}" / str(seed), args, seed, *flags))
            print(f"seed {seed}: {name}: {found[name][-1]:.0f} fps", file=sys.stderr)
    reference = statistics.median(found[base])
    cpu = plumbing.machine_info(torch.device("cpu"))["cpu"]
    lines = [
        f"{spec.env_id}, {args.total_timesteps:,} steps a run, seeds {', '.join(map(str, args.seeds))}; "
        f"{cpu}, torch {torch.__version__}, load average {load:.1f} at the start and {os.getloadavg()[0]:.1f} at the "
        "end; each run's steady-state fps (summary.json).",
        "",
        f"| configuration | fps (median) | each seed | vs {base} |",
        "|---|---:|---|---:|",
    ]
    for name, values in found.items():
        median = statistics.median(values)
        each = ", ".join(f"{v:,.0f}" for v in values)
        lines.append(f"| {name} | {median:,.0f} | {each} | {median / reference:.2f}x |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
