"""CleanRL's own ppo_continuous_action.py as a reference beside ours, run on our machine: `run` trains it for each seed
in turn, `convert` turns the finished seeds' logs into runs that the CleanRL page (report.py --cleanrl) reads as a row
of its own, "CleanRL's file, our run".

CleanRL's file is not part of leanrl: it runs in its own virtual environment, with gymnasium's MuJoCo envs and
tensorboard, from a copy of CleanRL's file (../shared/reference/cleanrl/ beside this checkout by default). The
environment of the runs on learning_cleanrl.md:

    python -m venv /tmp/cleanrl && /tmp/cleanrl/bin/pip install torch==2.13.0 \
        --index-url https://download.pytorch.org/whl/cpu
    /tmp/cleanrl/bin/pip install gymnasium==1.4.0 mujoco==2.3.3 numpy==2.4.6 tyro==1.0.17 tensorboard==2.21.0 \
        imageio==2.38.2

    python leanrl/tools/cleanrl_reference.py run --python /tmp/cleanrl/bin/python --core 0 --seeds 1 2 3 4 5
    python leanrl/tools/cleanrl_reference.py convert runs/cleanrl_ref/mujoco --python /tmp/cleanrl/bin/python
    python leanrl/tools/report.py doc/cleanrl_runs --cleanrl

`run` writes, per seed, <out>/seed_N/stdout.log (CleanRL's lines, each after the seconds since the seed's start),
stderr.log, CleanRL's own runs/ folder, and .done with the day (UTC) it finished. It runs the seeds one after another,
niced, pinned to one core, one thread; a finished seed is not run again, an unfinished one runs again from its start
(CleanRL's file has no checkpoint). Two cores: one `run` per core, each with its own seeds.
"""

import datetime
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Union

import tyro

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # plumbing/ is in leanrl/, one up
import plumbing

ROOT = Path(__file__).resolve().parents[2]
REFERENCE_SCRIPT = "cleanrl/"  # the runs' script names start so: report.py tells CleanRL's file from ours by it
EPISODE = re.compile(r"(\d+\.\d+) global_step=(\d+), episodic_return=(\S+)")
ITERATION = re.compile(r"(\d+\.\d+) SPS: (\d+)")  # CleanRL prints one after each iteration's update
VERSIONS = (
    "import importlib.metadata as m, json\n"
    "def version(name):\n"
    "    try:\n"
    "        return m.version(name)\n"
    "    except m.PackageNotFoundError:\n"
    "        return None\n"
    "print(json.dumps({name: version(name) for name in ('torch', 'gymnasium', 'mujoco')}))"
)


@dataclass
class Reference:
    python: Path
    """the python of the virtual environment that runs CleanRL's file"""
    script: Path = ROOT.parent / "shared/reference/cleanrl/ppo_continuous_action.py"
    """CleanRL's ppo_continuous_action.py"""
    env_id: str = "HalfCheetah-v4"
    """the env CleanRL's file trains on (its --env-id)"""
    total_timesteps: int = 1_000_000
    """env steps per seed (CleanRL's --total-timesteps)"""


@dataclass
class Run(Reference):
    """Train CleanRL's file for each seed in turn into <out>/seed_N/, niced, on one core."""

    out: Path = Path("runs/cleanrl_ref/mujoco")
    """where the seeds' folders go"""
    seeds: tuple[int, ...] = (1, 2, 3, 4, 5)
    """the seeds, run in this order"""
    core: int = 0
    """the core the runs are pinned to"""


@dataclass
class Convert(Reference):
    """Turn the finished seeds under LOGS (seed_N/stdout.log and .done, as `run` writes them) into the runs the CleanRL
    page reads: <out>/<seed>/metrics.jsonl and summary.json."""

    logs: tyro.conf.Positional[Annotated[Path, tyro.conf.arg(metavar="LOGS")]] = Path("runs/cleanrl_ref/mujoco")
    """the folder `run` wrote (its --out)"""
    out: Path = Path("doc/cleanrl_runs/mujoco/00-cleanrl-file")
    """the record's configuration folder for the reference (report.py's record, beside the page)"""
    batch_size: int = 2048
    """env steps per iteration, one `SPS:` line each (CleanRL's num_envs x num_steps)"""


def check_reference(args: Reference):
    if not args.python.is_file() or not os.access(args.python, os.X_OK):
        plumbing.fail(f"--python {args.python}: no such program; give the python of CleanRL's virtual environment")
    plumbing.positive(args, "total_timesteps")


def check_run(args: Run):
    check_reference(args)
    if not args.script.is_file():
        plumbing.fail(f"--script {args.script}: no such file; give the path of CleanRL's ppo_continuous_action.py")
    if not args.seeds:
        plumbing.fail("--seeds: give at least one seed")
    if args.core not in os.sched_getaffinity(0):
        plumbing.fail(f"--core {args.core}: not a core this process may use ({sorted(os.sched_getaffinity(0))})")


def run_seed(args: Run, seed: int) -> bool:
    """One seed of CleanRL's file into <out>/seed_N/; False if it failed."""
    folder = args.out / f"seed_{seed}"
    if (folder / ".done").exists():
        print(f"seed {seed}: finished on {(folder / '.done').read_text().strip()}, not run again")
        return True
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    command = [
        *(str(args.python), "-u", str(args.script.resolve()), "--no-cuda", "--seed", str(seed)),
        *("--env-id", args.env_id, "--total-timesteps", str(args.total_timesteps)),
    ]

    def pinned_and_niced():  # in the child, before CleanRL's file starts
        os.sched_setaffinity(0, {args.core})
        os.nice(19)

    print(f"seed {seed}: {' '.join(command)} in {folder}", flush=True)
    with open(folder / "stdout.log", "w") as log, open(folder / "stderr.log", "w") as err:
        start = time.monotonic()
        child = subprocess.Popen(
            command,
            cwd=folder,  # CleanRL writes its runs/ folder where it starts
            stdout=subprocess.PIPE,
            stderr=err,
            env=dict(os.environ, OMP_NUM_THREADS="1"),
            text=True,
            preexec_fn=pinned_and_niced,
        )
        for line in child.stdout:
            log.write(f"{time.monotonic() - start:.3f} {line}")
            log.flush()
        code = child.wait()
    if code:
        print(f"error: seed {seed}: CleanRL's file exited with {code}: see {folder / 'stderr.log'}", file=sys.stderr)
        return False
    (folder / ".done").write_text(datetime.datetime.now(datetime.timezone.utc).date().isoformat() + "\n")
    return True


def run(args: Run):
    check_run(args)
    try:
        for seed in args.seeds:
            if not run_seed(args, seed):
                sys.exit(1)
    except KeyboardInterrupt:  # it reached CleanRL's file too, in the same process group
        print("\nstopped: the unfinished seed runs again from its start next time", file=sys.stderr)
        sys.exit(130)


def read_log(path: Path, batch_size: int):
    """(rows, returns, last SPS) of one seed's stdout.log: a metrics row per iteration, with the mean of the last 20
    episodes finished by its SPS line, as our scripts log them."""
    rows = []
    returns = []
    sps = None
    for line in path.read_text().splitlines():
        if episode := EPISODE.fullmatch(line):
            returns.append(float(episode[3]))
        elif iteration := ITERATION.fullmatch(line):
            sps = int(iteration[2])
            recent = statistics.mean(returns[-20:]) if returns else None
            rows.append(
                dict(episodic_return=recent, global_step=(len(rows) + 1) * batch_size, time=float(iteration[1]))
            )
    return rows, returns, sps


def versions(python: Path) -> dict:
    """The reference's torch, gymnasium and MuJoCo, as its python has them installed (None: not installed)."""
    try:
        found = subprocess.run([str(python), "-c", VERSIONS], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        plumbing.fail(f"--python {python}: cannot run it ({e})")
    if found.returncode:
        plumbing.fail(f"--python {python}: cannot read its package versions: {found.stderr.strip().splitlines()[-1:]}")
    return json.loads(found.stdout)


def convert(args: Convert):
    check_reference(args)
    folders = sorted((p for p in args.logs.glob("seed_*") if p.name[5:].isdigit()), key=lambda p: int(p.name[5:]))
    if not folders:
        plumbing.fail(f"{args.logs}: no seed_N folders; give the --out of `cleanrl_reference.py run`")
    found = versions(args.python)
    iterations = args.total_timesteps // args.batch_size
    cpu = f"{plumbing.cpu_model()} ({os.cpu_count()} cores, this process on 1)"  # `run` pins each seed to one core
    for folder in folders:
        seed = int(folder.name[5:])
        rows, returns, sps = read_log(folder / "stdout.log", args.batch_size)
        steps = len(rows) * args.batch_size
        if not (folder / ".done").exists():
            print(f"seed {seed}: in progress at step {steps:,} of {args.total_timesteps:,}, not converted yet")
            continue
        if len(rows) != iterations or not returns:
            print(
                f"warning: seed {seed}: finished with {len(rows)} of {iterations} iterations "
                f"(--total-timesteps {args.total_timesteps:,}?), not converted",
                file=sys.stderr,
            )
            continue
        summary = dict(
            script=REFERENCE_SCRIPT + args.script.name,
            env_id=args.env_id,
            seed=seed,
            command=f"python -u {args.script.name} --no-cuda --seed {seed} --env-id {args.env_id} "
            f"--total-timesteps {args.total_timesteps}",
            device="cpu",
            **found,
            cpu=cpu,
            gpu=None,
            num_threads=1,
            total_timesteps=args.total_timesteps,
            global_step=steps,
            wall_time=rows[-1]["time"],
            fps=sps,  # CleanRL's SPS: the steps over the seconds since its start
            final_return=statistics.mean(returns[-20:]),
            compile_time=None,
            interrupted=False,
            finished_on=(folder / ".done").read_text().strip(),
        )
        target = args.out / str(seed)
        target.mkdir(parents=True, exist_ok=True)
        (target / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        (target / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        print(f"seed {seed}: final return {summary['final_return']:.1f} -> {target}")


def main():
    args = plumbing.parse_args(
        Union[Annotated[Run, tyro.conf.subcommand("run")], Annotated[Convert, tyro.conf.subcommand("convert")]]
    )
    if isinstance(args, Run):
        run(args)
    else:
        convert(args)


if __name__ == "__main__":
    main()
