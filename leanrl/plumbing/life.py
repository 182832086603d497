"""A run's life, from its last check to its last write.

- `check_run`: the flags every script shares, checked after its own; the log dir resolved and claimed for the run.
- `Run`: metrics.jsonl, summary.json, wandb (`--track`), the progress bar, steady-state fps; a diverged run (a loss
  not finite) stopped before it saves; the checkpoint written with `--save-model` (`Run.save`).
- `StopFlag`: Ctrl-C, SIGTERM or SIGHUP stops the loop at its next log line, with a checkpoint; a second one stops at
  once; a signal during the final writes waits for them.
"""

import contextlib
import importlib.util
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from typing import Optional

import torch
import tqdm

from . import logdir
from .checkpoint import check_changed, load_checkpoint, save_checkpoint, state_of
from .flags import fail, positive, require
from .logdir import (
    check_compile_cache,
    check_log_dir,
    check_track,
    claim,
    cores,
    default_log_dir,
    git_commit,
    keep_rows_until,
    machine_info,
    new_folder,
    non_finite,
    strict_json,
    write_atomically,
)
from .members import Members, check_diverged


def check_run(
    args, script: str, same: tuple = ("env_id",), video: bool = False, lead: bool = True, step: int = 1
) -> Optional[dict]:
    """The flags every script shares, after its own: seed, threads and burn-in ranges, `--capture-video` (`video`:
    whether the script can record), `--resume` (a checkpoint of this script, trained with the same seed and `same`
    flags, with at least `step` steps, the steps of one iteration, left to train), `--track` and, last so that a bad
    flag never leaves a folder behind, `--log-dir` (default resolved into args and created under a name no other run
    has; a given one must hold no other run unless `--resume` points into it; only by the process that writes there:
    `lead`). Returns the checkpoint to resume from, if any. A warning (more threads than cores, wandb offline) comes
    last, once every check has passed, so that a refused run says one line."""
    require(args, lambda v: 0 <= v < 2**31, "in [0, 2**31)", "seed")
    positive(args, "num_threads")
    require(args, lambda v: v >= 0, "non-negative", "measure_burnin")
    if args.capture_video and not video:
        fail("--capture-video is not supported here: envpool renders no frames")
    if args.capture_video and not all(importlib.util.find_spec(m) for m in ("moviepy", "pygame")):
        fail("--capture-video needs pygame and moviepy: pip install pygame moviepy")
    # a checkpoint goes on with its own random state: another --seed would only relabel the run
    ckpt = load_checkpoint(args, script, ("seed", *same)) if args.resume else None
    if ckpt is not None and args.total_timesteps - ckpt["global_step"] < step:
        fail(
            f"--resume {args.resume} is already at step {ckpt['global_step']:,} of --total-timesteps "
            f"{args.total_timesteps:,}: nothing left to train; pass a larger --total-timesteps to go on (its schedules "
            "are then planned over the new total: said in one line)"
        )
    if getattr(args, "compile", False):
        check_compile_cache()
    warnings = [check_diverged(args, ckpt), check_changed(args, ckpt)] if ckpt is not None else []
    warnings += [check_track(args)] if args.track and lead else []
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # torchrun's ranks on this machine share its cores
    if args.num_threads and args.num_threads * ranks > cores():
        threads = f"--num-threads {args.num_threads}" + (f" x {ranks} ranks" if ranks > 1 else "")
        warnings.append(
            f"warning: {threads} is more than the {cores()} cores this process may use: the threads will wait on each "
            f"other, often many times slower; use at most {max(1, cores() // ranks)}"
        )
    if not lead:  # a rank that writes nothing: rank 0 names and creates the folder
        args.log_dir = args.log_dir or default_log_dir(args, script)
        return ckpt
    try:
        args.log_dir = args.log_dir or new_folder(default_log_dir(args, script))
        os.makedirs(args.log_dir, exist_ok=True)
        tempfile.TemporaryFile(dir=args.log_dir).close()
    except OSError as e:
        fail(f"--log-dir {args.log_dir or default_log_dir(args, script)}: cannot write there ({e.strerror or e})")
    claim(args.log_dir)
    check_log_dir(args)  # after the claim: a run that claimed the folder first and has since written there counts
    for line in filter(None, warnings):
        print(line, file=sys.stderr)
    return ckpt


class StopFlag:
    """Ctrl-C, SIGTERM or SIGHUP asks the loop to stop at its next log line, where the state is consistent and a
    checkpoint can be saved. A second one stops at once (no checkpoint), and so does the first before anything was
    logged. Once the loop is over (`finishing`), signals wait for the final writes: a checkpoint cut in half is a
    traceback, a stale temporary file and no summary; exit code 130 after them."""

    def __init__(self):
        self.set = False
        self.logged = False
        self.finishing = False
        self.deferred = False
        signal.signal(signal.SIGINT, self.handle)
        signal.signal(signal.SIGTERM, self.handle)
        signal.signal(signal.SIGHUP, self.handle)  # the terminal closed: a stop like any other, the files kept

    def handle(self, signum, frame):
        if self.finishing:
            if not self.deferred:
                print(
                    "\nwriting the checkpoint and summary first; the run stops after them", file=sys.stderr, flush=True
                )
            self.deferred = True
            return
        if not self.logged:
            print("\nstopped before the first log line: nothing to save", file=sys.stderr, flush=True)
            os._exit(130)
        if self.set:
            raise KeyboardInterrupt
        self.set = True
        print("\nstopping at the next log line (Ctrl-C again: stop now, no checkpoint)", file=sys.stderr, flush=True)


class Run(Members):
    """A run's outputs: a metrics.jsonl row per `log`, wandb with `--track`, the progress bar, the steady-state fps,
    and summary.json from `finish`. Used as a context: Ctrl-C (or SIGTERM) sets `stopping`, a second one ends the
    block at once and clears `consistent`, so no checkpoint of a half-done step is saved. A logged loss that is not
    finite (or a policy torch.distributions refuses) stops the run as diverged, `consistent` cleared too. In a seeds
    run (a row with `members`) a member whose numbers are not finite is reported and left out of the top-level means,
    the others train on; the run stops so once no member is left.

        run = Run(args, SCRIPT, device, total_steps=args.total_timesteps, start_step=global_step)
        with run:
            for ...:
                ...
                run.log(global_step, steady=..., **row)
                if run.stopping:
                    break
        run.save(global_step=global_step, agent=agent, ...)  # with --save-model, a consistent state only
        run.finish(global_step, final_return=episodes.mean())

    `lead=False` (a DDP rank other than 0) writes nothing and shows no bar; Ctrl-C still stops it. `compiling`
    (default: `--compile`) says that the first calls compile, on stderr and in the bar, until `compiled()`."""

    def __init__(
        self,
        args,
        script: str,
        device: torch.device,
        total_steps: int,
        start_step: int = 0,
        lead: bool = True,
        compiling: Optional[bool] = None,
    ):
        self.args = args
        self.script = script
        self.device = device
        self.lead = lead
        self.start_step = start_step
        self.stop = StopFlag()
        self.consistent = True
        self.diverged = None  # the step and the losses that were not finite, once they were not (and which members)
        super().__init__()
        self.fps = None
        self.mark = None  # (time, step) where steady state began
        self.untimed = 0.0  # seconds since the mark that were not training (`log(untimed=...)`)
        self.first_interval = None
        self.steady_intervals = []
        self.wandb = None
        self.metrics = None  # opened at the first row: a run stopped before it leaves no empty file in its folder
        self.metrics_path = os.path.join(args.log_dir, "metrics.jsonl") if lead else None
        self.logged_step = start_step  # the step of the last row: what a run stopped mid-iteration has done
        self.commit = git_commit()
        self.start = self.last = time.perf_counter()
        if lead:
            if start_step and os.path.exists(self.metrics_path):
                keep_rows_until(self.metrics_path, start_step)
            if args.track:
                import wandb

                self.wandb = wandb.init(
                    project=args.wandb_project_name,
                    entity=args.wandb_entity,
                    config=vars(args),
                    name=os.path.basename(args.log_dir),
                    dir=args.log_dir,
                    save_code=True,
                )
        self.bar = tqdm.tqdm(
            total=total_steps,
            initial=start_step,
            unit="step",
            dynamic_ncols=True,
            disable=not lead,
        )
        if args.compile if compiling is None else compiling:  # the first calls compile: say so, or a run looks stuck
            self.say(
                "compiling the units on their first call (a minute or more on a cold cache; later runs load "
                "them from Inductor's on-disk cache)"
            )
            self.compiling()

    def say(self, line: str):
        """One line on stderr that does not break the progress bar."""
        if self.lead:
            self.bar.write(line, file=sys.stderr)

    def compiling(self):
        """The units compile again (new shapes): the bar says so until `compiled()`."""
        self.bar.set_description("compiling")

    def compiled(self):
        """Every unit has compiled: the bar drops its "compiling" label."""
        self.bar.set_description("")

    @property
    def stopping(self) -> bool:
        return self.stop.set or not self.consistent

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        self.stop.finishing = True
        self.bar.close()
        if self.metrics:
            self.metrics.close()
        if kind is KeyboardInterrupt:  # the second Ctrl-C: stopped mid-step, with no consistent state to save
            self.stop.set = True
            self.consistent = False
            return True
        # torch.distributions refuses non-finite parameters (the eager scripts' policies): the weights diverged within
        # an iteration, before its log line could see the losses
        if kind is ValueError and "found invalid values" in str(exc):
            name = str(exc).split()[2]  # "Expected parameter logits (...)"
            self.diverge(self.bar.n, [name], f"after step {self.bar.n:,}", f"the policy's {name}")
            return True
        return False

    def diverge(self, global_step: int, names: list, when: str, what: str):
        """Training went non-finite: one line, the run stops, and nothing of it is saved over the last checkpoint."""
        if self.diverged is None:  # a seeds run's members have recorded theirs
            self.diverged = dict(global_step=global_step, losses=names)
        self.consistent = False
        self.say(
            f"error: training diverged {when}: {what} not finite; the run stops without saving a checkpoint (the last "
            "one is kept): resume from it with a lower learning rate"
        )

    def log(self, global_step: int, steady: bool, untimed: float = 0.0, **row) -> dict:
        """One metrics.jsonl row (and a wandb point), with the time so far and the steady-state fps: env steps per
        second since the first log at which `steady` held (compiling and warming up come before). `untimed`: seconds
        of this interval spent on something other than training (an evaluation), left out of the fps."""
        now = time.perf_counter()
        interval = now - self.last - untimed
        if self.first_interval is None:
            self.first_interval = interval
        elif self.mark is not None:
            self.steady_intervals.append(interval)
            self.untimed += untimed
        self.last = now
        if steady and self.mark is None:
            self.mark = (now, global_step)
        if self.mark is not None and global_step > self.mark[1]:
            self.fps = (global_step - self.mark[1]) / (now - self.mark[0] - self.untimed)
        members = row.pop("members", None)
        row = dict(global_step=global_step, time=now - self.start, fps=self.fps, **row)
        # the loop's host sync has already brought the losses here: checking them costs no other
        if members is not None:
            self.check_members(global_step, members)
            row.update({key: self.live_mean([m[key] for m in members]) for key in members[0] if key != "seed"})
        broken = non_finite(row)
        if broken and self.consistent:
            said = ", ".join(f"{name} {value}" for name, value in broken.items())
            self.diverge(global_step, list(broken), f"at step {global_step:,}", said)
        if members is not None:
            row["members"] = members
        if self.metrics_path:
            try:
                self.metrics = self.metrics or open(self.metrics_path, "a", buffering=1)
                self.metrics.write(json.dumps(strict_json(row)) + "\n")
            except OSError as e:
                self.cannot_log(e)
        self.logged_step = global_step
        if self.wandb:
            self.wandb.log(row, step=global_step)
        self.bar.update(global_step - self.bar.n)
        # what the row says: "-" where it has no number yet (no steady state, no finished episode), not a 0
        ret = row.get("episodic_return")
        fps = "-" if self.fps is None else f"{self.fps:.0f}"
        self.bar.set_postfix(fps=fps, ret="-" if ret is None else f"{ret:.1f}", refresh=False)
        self.stop.logged = True
        return row

    def cannot_log(self, error: OSError):
        """metrics.jsonl can take no more rows (a full disk): the run stops here as Ctrl-C stops it, its checkpoint and
        summary still tried, and exits 1."""
        path = self.metrics_path
        with contextlib.suppress(OSError, AttributeError):  # the row it holds back fails again (None: the open failed)
            self.metrics.close()
        self.metrics = None
        self.metrics_path = None
        logdir.UNWRITTEN.append(path)
        self.stop.set = True
        self.say(f"error: could not write {path} ({error.strerror or error}); the run stops at this step")

    def save(self, earlier: Optional[dict] = None, members: Optional[dict] = None, **parts):
        """The run's checkpoint with --save-model, `{log_dir}/agent.pt`: `parts` as `save_checkpoint` holds them,
        written once the run has trained past the step it began at (`parts["global_step"]`) and holds a consistent
        state (not after a second Ctrl-C or a divergence), by the lead process only. A seeds run gives its per-member
        parts as `members` and the checkpoint it resumed from as `earlier` (`finite_members`)."""
        if not (self.lead and self.args.save_model and self.consistent and parts["global_step"] > self.start_step):
            return
        if members is not None:
            parts.update(self.finite_members(earlier, **state_of(members)))
        save_checkpoint(os.path.join(self.args.log_dir, "agent.pt"), self.script, self.args, **parts)

    def compile_time(self) -> Optional[float]:
        """What compiling added to the first interval between log lines (the one that compiled), against a steady
        one (the median); None before steady state."""
        if not self.steady_intervals:
            return None
        return self.first_interval - statistics.median(self.steady_intervals)

    def finish(self, global_step: int, final_return: Optional[float], compile_time: Optional[float] = None, **extra):
        """summary.json (and wandb's summary), one closing line on stderr; exit code 1 if a final write failed, 130 if
        the run was stopped. A run stopped mid-iteration (a second Ctrl-C, a divergence) counts the steps of its last
        row, which its metrics and checkpoint hold, not those of the half-done iteration."""
        if not self.consistent:
            global_step = self.logged_step
        if self.lead:
            summary = dict(
                script=self.script,
                commit=self.commit,
                env_id=self.args.env_id,
                seed=self.args.seed,
                flags=asdict(self.args),
                **machine_info(self.device),
                num_threads=torch.get_num_threads(),
                total_timesteps=self.args.total_timesteps,
                global_step=global_step,
                wall_time=time.perf_counter() - self.start,
                fps=self.fps,
                final_return=final_return,
                compile_time=compile_time,
                interrupted=self.stop.set,
                diverged=self.diverged,
                **extra,
            )
            if self.members_diverged and "members" in summary:  # a seeds run's: each diverged member's record
                summary["members"] = [
                    dict(member, diverged=self.members_diverged[k]) if k in self.members_diverged else member
                    for k, member in enumerate(summary["members"])
                ]
            summary = strict_json(summary)  # a diverged member's final return may be NaN
            write_atomically(os.path.join(self.args.log_dir, "summary.json"), json.dumps(summary, indent=2).encode())
            if self.wandb:
                self.wandb.summary.update(summary)
                self.wandb.finish()
            print(
                f"{global_step} steps, {summary['wall_time']:.1f}s, fps {self.fps or 0:.0f}, return {final_return}, "
                f"logs in {self.args.log_dir}",
                file=sys.stderr,
            )
        if self.exit_code:
            sys.exit(self.exit_code)

    @property
    def exit_code(self) -> int:
        """1 if the run diverged or a final write failed, 130 if a signal stopped the run or came during its final
        writes, else 0."""
        if logdir.UNWRITTEN or self.diverged is not None:
            return 1
        return 130 if self.stop.set or self.stop.deferred else 0
