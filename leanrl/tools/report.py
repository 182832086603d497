"""Turn run.sh's runs into the fps comparison: doc/fps_table.md, doc/fps.png and doc/returns_<family>.png; or, with
--learning, into the learning evidence of `LEARN=1 bash run.sh`: doc/learning.md and doc/learning_<family>.png; or,
with --cleanrl, into the runs of `CLEANRL=1 bash run.sh` beside CleanRL's published results and our runs of CleanRL's
own file (leanrl/tools/cleanrl_reference.py): doc/learning_cleanrl.md and doc/cleanrl_<family>.png, from the
record doc/cleanrl_runs/ that it keeps of every such run, with rliable's interval estimates.

    python leanrl/tools/report.py runs/bench --out doc
    python leanrl/tools/report.py runs/learn --out doc --learning
    python leanrl/tools/report.py runs/cleanrl --out doc --cleanrl

A run lives in RUNS/<family>/<NN-configuration>/<seed>/ with the summary.json and metrics.jsonl that every
training script writes. The two-digit prefix orders the columns across families (01 is the baseline), so a
configuration has the same column in every family. A configuration folder with a SKIPPED file and no runs is one
the machine could not run; the file says why, and the table says so.
"""

import datetime
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import matplotlib
import numpy as np
import tyro

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # plumbing/ is in leanrl/, one up
from cleanrl_reference import REFERENCE_SCRIPT

import plumbing

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

THRESHOLDS = {"CartPole-v1": 475.0}  # the env's own "solved" return, where it has one
# what the tables and plots read from each run's summary.json and metrics.jsonl rows
SUMMARY_KEYS = {
    "script",
    "env_id",
    "seed",
    "total_timesteps",
    "fps",
    "final_return",
    "cpu",
    "gpu",
    "torch",
    "wall_time",
}
ROW_KEYS = {"global_step", "time", "episodic_return"}


@dataclass(frozen=True)
class Published:
    """CleanRL's published result for one script: its final episodic return (mean ± std over CleanRL's seeds) at its
    budget, and the runtime of one run on CleanRL's machine (None where CleanRL does not publish it)."""

    script: str
    env_id: str
    steps: int
    mean: float
    std: float
    minutes: Optional[float]


# CleanRL's benchmark tables (docs.cleanrl.dev, each algorithm's page), made by openrlbenchmark from the runs tagged
# pr-424; keyed by run.sh's families
CLEANRL = {
    "classic": Published("ppo.py", "CartPole-v1", 500_000, 490.04, 6.12, 10.5),
    "dqn": Published("dqn.py", "CartPole-v1", 500_000, 488.69, 16.11, None),
    "mujoco": Published("ppo_continuous_action.py", "HalfCheetah-v4", 1_000_000, 1442.64, 46.03, 25.4),
    "td3": Published("td3_continuous_action.py", "HalfCheetah-v4", 1_000_000, 9583.22, 126.09, 87.4),
    "sac": Published("sac_continuous_action.py", "HalfCheetah-v4", 1_000_000, 9634.89, 1423.73, 174.8),
    "atari": Published("ppo_atari_envpool.py", "Breakout-v5", 10_000_000, 211.24, 151.84, 151.4),
}
CLEANRL_SEEDS = 3  # the seeds behind each figure of CleanRL's tables, whose per-seed values are not published
MIN_RUNS = 3  # fewer finished runs give no interval: a bootstrap of one or two values estimates nothing
# rliable's default is 50,000 resamples, a minute per page on 2 cores; 10,000 move a CI's ends by about 1% of its width
BOOTSTRAP_REPS = 10_000


@dataclass
class Args:
    """Turn run.sh's runs into the fps comparison (doc/fps_table.md, doc/fps.png, doc/returns_<family>.png) or, with
    --learning, into doc/learning.md and doc/learning_<family>.png, or, with --cleanrl, into doc/learning_cleanrl.md and
    doc/cleanrl_<family>.png."""

    runs: tyro.conf.Positional[Path]
    """the sweep's output folder (run.sh's OUT), holding <family>/<NN-configuration>/<seed>/ runs"""
    out: Path = Path("doc")
    """where the table and the plots go"""
    learning: bool = False
    """write learning.md and learning_<family>.png (the final returns against the baseline's seeds) instead of the fps
    table: for the runs of `LEARN=1 bash run.sh`"""
    cleanrl: bool = False
    """write learning_cleanrl.md and cleanrl_<family>.png (the final returns and the time to reach CleanRL's published
    return) instead of the fps table, and print the README's lines: for the runs of `CLEANRL=1 bash run.sh`"""


@dataclass
class Config:
    """One configuration of one family: its finished runs (summary, metrics rows) or why it was skipped."""

    runs: list
    skipped: str = ""

    @property
    def fps(self) -> list:
        """Each run's fps; a seeds program's counts the steps of all its agents (its `fps` is one member's)."""
        fps = [s.get("fps_all_seeds") if "members" in s else s["fps"] for s, _ in self.runs]
        return [f for f in fps if f]

    @property
    def median_fps(self):
        return statistics.median(self.fps) if self.fps else None

    @property
    def finals(self) -> list:
        return [s["final_return"] for s, _ in self.runs if s["final_return"] is not None]

    @property
    def teacher_finals(self) -> list:
        """ppo_teacher_student's teacher measured acting alone at the end (final_return is the student's)."""
        return [s["teacher_return"] for s, _ in self.runs if s.get("teacher_return") is not None]


def read_run(seed_dir: Path):
    """(summary, metrics rows) of a finished run; None, with a warning that names its folder, for a run whose files are
    missing or damaged (a half-written line, a summary without the fields the report reads): one such run is left out,
    the report goes on."""
    try:
        name = "summary.json"
        summary = json.loads((seed_dir / name).read_text())
        if not isinstance(summary, dict) or not SUMMARY_KEYS <= summary.keys():
            raise ValueError(f"no {', '.join(sorted(SUMMARY_KEYS - set(summary)))}")
        name = "metrics.jsonl"
        rows = []
        for number, line in enumerate((seed_dir / name).read_text().splitlines(), 1):
            name = f"metrics.jsonl line {number}"
            row = json.loads(line)
            if not isinstance(row, dict) or not ROW_KEYS <= row.keys():
                raise ValueError(f"no {', '.join(sorted(ROW_KEYS - set(row)))}")
            rows.append(row)
    except (OSError, ValueError, TypeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else e
        print(f"warning: skipping {seed_dir}: {name}: {reason}", file=sys.stderr)
        return None
    return summary, rows


def members(summary: dict, rows: list) -> list:
    """A run of a seeds script (ppo_seeds_torchcompile.py: a summary with `members`) as one run per member, each with
    its seed, final return and returns, as the run of that seed alone would read, and its share of the wall time (the
    pages sum the runs' times); any other run as it is."""
    if "members" not in summary:
        return [(summary, rows)]
    share = summary["wall_time"] / len(summary["members"])
    return [
        (
            dict(summary, seed=member["seed"], final_return=member["final_return"], wall_time=share),
            [dict(row, episodic_return=row["members"][k]["episodic_return"]) for row in rows],
        )
        for k, member in enumerate(summary["members"])
    ]


def load(runs: Path) -> dict:
    """{family: {configuration: Config}}, families in name order, configurations in prefix order."""
    data = {}
    for family_dir in sorted(p for p in runs.iterdir() if p.is_dir()):
        for config_dir in sorted(p for p in family_dir.iterdir() if p.is_dir()):
            found = []
            for seed_dir in sorted(p for p in config_dir.iterdir() if (p / "summary.json").exists()):
                found += [member for run in filter(None, [read_run(seed_dir)]) for member in members(*run)]
            skipped = config_dir / "SKIPPED"
            if found or skipped.exists():
                reason = skipped.read_text().strip() if skipped.exists() and not found else ""
                data.setdefault(family_dir.name, {})[config_dir.name] = Config(found, reason)
    return data


RECORD = "cleanrl_runs"  # --cleanrl's record of its runs, beside the page


def slim(row: dict) -> dict:
    """What the pages read of a metrics row: the step, the wall time, the return and each member's return."""
    kept = {key: row[key] for key in sorted(ROW_KEYS)}  # a set's order changes from process to process
    if "members" in row:
        kept["members"] = [{"episodic_return": member["episodic_return"]} for member in row["members"]]
    return kept


def record_runs(runs: Path, record: Path):
    """Every run under `runs` into `record` (<family>/<configuration>/<seed>/): its summary.json, with the day it
    finished or stopped, and what the page reads of its metrics.jsonl. CLEANRL=1's runs take hours and their folders
    do not outlast the machine they ran on; the record, committed with the page, carries them into a later sitting
    (run.sh does not run a recorded finished run again). A run recorded before is replaced by its newer state."""
    for summary_file in sorted(runs.glob("*/*/*/summary.json")):
        run = read_run(summary_file.parent)
        if run is None:
            continue
        summary, rows = run
        day = datetime.date.fromtimestamp(summary_file.stat().st_mtime).isoformat()
        target = record / summary_file.parent.relative_to(runs)
        target.mkdir(parents=True, exist_ok=True)
        (target / "summary.json").write_text(json.dumps(dict(summary, finished_on=day), indent=1) + "\n")
        (target / "metrics.jsonl").write_text("".join(json.dumps(slim(row)) + "\n" for row in rows))


def column_name(config: str) -> str:
    return config.split("-", 1)[-1]


def is_env_alone(config: str) -> bool:
    """bench_env.py's runs: the envs with random actions, a ceiling to measure against and no contender."""
    return column_name(config) == "env-alone"


def apart(config: str):
    """Why a configuration trains another agent than the baseline's, or several (no contender for the fastest column,
    shown apart); None for a contender."""
    if column_name(config) == "pruned":
        return "a smaller network"
    if column_name(config).endswith("-seeds"):
        return "all its agents' steps"
    return None


def fmt(x, spec=",.0f"):
    return "-" if x is None else format(x, spec)


def first_summary(configs: dict) -> dict:
    return next(c.runs[0][0] for c in configs.values() if c.runs)


def headline(data: dict, columns: list) -> list:
    """LeanRL's table: one row per family, the median fps of each configuration, the best speed-up of those that
    train the baseline's agent, and those of `pruned` and the seeds program apart."""
    head = ["family (env, steps per run)"] + [f"`{column_name(c)}`" for c in columns] + ["fastest vs baseline"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for family, configs in data.items():
        s = first_summary(configs)
        cells = [f"{family} ({s['env_id']}, {s['total_timesteps']:,})"]
        for column in columns:
            c = configs.get(column)
            cells.append("not run" if c is None else f"skipped: {c.skipped}" if c.skipped else fmt(c.median_fps))
        # the contenders train the baseline's agent: the env alone is the ceiling, `pruned` a smaller network, a seeds
        # program several agents at once
        measured = {
            name: c.median_fps
            for name, c in configs.items()
            if c.median_fps and not is_env_alone(name) and not apart(name)
        }
        first = next(iter(configs))  # the family's first configuration: 01-baseline, or teacher's 10-large-alone
        base = measured.get(first)
        best = max(measured, key=measured.get, default=None)
        ceiling = next((c.median_fps for name, c in configs.items() if is_env_alone(name) and c.median_fps), None)
        versus = f" vs `{column_name(first)}`" if first != columns[0] else ""
        cells.append(
            (f"{measured[best] / base:.2f}x (`{column_name(best)}`){versus}" if base and best else "-")
            + (f", {measured[best] / ceiling:.0%} of `env-alone`" if best and ceiling else "")
            + "".join(
                f"; `{column_name(name)}` ({apart(name)}) {c.median_fps / base:.2f}x"
                for name, c in configs.items()
                if apart(name) and base and c.median_fps
            )
        )
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def mean_spread(values: list) -> str:
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.1f} ± {spread:.1f} (n={len(values)})" if values else "-"


def returns_table(data: dict, columns: list) -> list:
    head = ["family"] + [f"`{column_name(c)}`" for c in columns]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for family, configs in data.items():
        cells = [family]
        for column in columns:
            cells.append(mean_spread(configs[column].finals if column in configs else []))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def first_reaching(rows, threshold):
    row = next((r for r in rows if (r["episodic_return"] or float("-inf")) >= threshold), None)
    return (row["global_step"], row["time"]) if row else (None, None)


def detail(env_id: str, configs: dict) -> list:
    """Per family: fps spread, compile time and, where the env has a solved threshold, time to reach it."""
    threshold = THRESHOLDS.get(env_id)
    head = ["configuration", "runs", "fps (median, min-max)", "compile s (median)"]
    if threshold:
        head += [f"steps to {threshold:.0f} (median)", f"seconds to {threshold:.0f} (median)"]
    teacher = any(c.teacher_finals for c in configs.values())
    if teacher:
        head += ["final return (student, or the network alone)", "teacher's final return (acting alone)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, c in configs.items():
        if c.skipped:
            continue
        comp = [s["compile_time"] for s, _ in c.runs if s.get("compile_time") is not None]
        cells = [
            f"`{column_name(name)}`",
            str(len(c.runs)),
            f"{fmt(c.median_fps)} ({fmt(min(c.fps, default=None))}-{fmt(max(c.fps, default=None))})",
            fmt(statistics.median(comp) if comp else None, ".1f"),
        ]
        if threshold:
            reached = [first_reaching(rows, threshold) for _, rows in c.runs]
            steps = [s for s, _ in reached if s is not None]
            secs = [t for _, t in reached if t is not None]
            cells += [
                f"{fmt(statistics.median(steps) if steps else None)} ({len(steps)}/{len(c.runs)} reached)",
                fmt(statistics.median(secs) if secs else None, ".1f"),
            ]
        if teacher:
            cells += [mean_spread(c.finals), mean_spread(c.teacher_finals)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def plot_fps(data: dict, columns: list, out: Path):
    """Speed-up over each family's baseline, one group of bars per family, the fps written on each bar."""
    fig, ax = plt.subplots(figsize=(max(6, 2.2 * len(data)), 4))
    columns = [c for c in columns if any(c in configs and configs[c].median_fps for configs in data.values())]
    width = 0.8 / len(columns)
    for i, column in enumerate(columns):
        xs = []
        heights = []
        labels = []
        for j, configs in enumerate(data.values()):
            base = next(iter(configs.values())).median_fps  # the family's first configuration
            fps = configs[column].median_fps if column in configs else None
            if base and fps:
                xs.append(j + (i - (len(columns) - 1) / 2) * width)
                heights.append(fps / base)
                labels.append(fmt(fps))
        bars = ax.bar(xs, heights, width, label=column_name(column), color=f"C{i}")
        ax.bar_label(bars, labels, fontsize=6, rotation=90, padding=2)
    ax.set_xticks(range(len(data)), [f"{f}\n{first_summary(c)['env_id']}" for f, c in data.items()])
    ax.set_ylabel("speed-up over the baseline (fps on the bars)")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.margins(y=0.25)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "fps.png", dpi=100)
    plt.close(fig)


def plot_returns(family: str, configs: dict, out: Path) -> str:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for i, (name, c) in enumerate(configs.items()):
        for j, (_, rows) in enumerate(c.runs):
            pts = [
                (r["global_step"], r["time"], r["episodic_return"]) for r in rows if r["episodic_return"] is not None
            ]
            kw = dict(color=f"C{i}", alpha=0.8, lw=1, label=column_name(name) if j == 0 else None)
            axes[0].plot([p[0] for p in pts], [p[2] for p in pts], **kw)
            axes[1].plot([p[1] for p in pts], [p[2] for p in pts], **kw)
            # ppo_teacher_student's teacher, measured acting alone every few iterations: dashed, the student's colour
            pts = [(r["global_step"], r["time"], r.get("teacher_return")) for r in rows]
            pts = [p for p in pts if p[2] is not None]
            kw = dict(kw, ls="--", label=f"{column_name(name)} (teacher)" if j == 0 and pts else None)
            axes[0].plot([p[0] for p in pts], [p[2] for p in pts], **kw)
            axes[1].plot([p[1] for p in pts], [p[2] for p in pts], **kw)
    for ax, xlabel in zip(axes, ("environment steps", "wall time (s)")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("episodic return (last 20 episodes)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{family}: {first_summary(configs)['env_id']}")
    fig.tight_layout()
    name = f"returns_{family}.png"
    fig.savefig(out / name, dpi=100)
    plt.close(fig)
    return name


def hardware(data: dict) -> str:
    """The machines the runs ran on, as their summaries say: CPU model and cores, GPU, torch."""
    found = sorted(
        {(s["cpu"], s["gpu"] or "none", s["torch"]) for c in data.values() for cfg in c.values() for s, _ in cfg.runs}
    )
    return "; ".join(f"{cpu}, GPU: {gpu}, torch {torch}" for cpu, gpu, torch in found)


def finished(summaries) -> str:
    """The day the newest run finished: the newest of these summary.json files."""
    newest = max(p.stat().st_mtime for p in summaries)
    return datetime.date.fromtimestamp(newest).isoformat()


def commit() -> str:
    """The checkout's commit, and whether the tree differs from it (`git status --porcelain`: a changed, staged or
    untracked file; the ignored runs/ folder does not count): "abc1234 (clean tree)" or "abc1234 (with uncommitted
    changes)"."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, check=True)
        changes = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    tree = "with uncommitted changes" if changes.stdout.strip() else "clean tree"
    return f"{head.stdout.decode().strip()} ({tree})"


def seeds(data: dict) -> list:
    """The seeds of the finished runs, as their summaries say, in order."""
    return sorted({s["seed"] for c in data.values() for cfg in c.values() for s, _ in cfg.runs})


def fps_report(args: Args, data: dict):
    columns = sorted({name for configs in data.values() for name in configs})
    lines = [
        "# fps comparison",
        "",
        f"Written by `python leanrl/tools/report.py {args.runs}` (the last step of `run.sh`) on "
        f"{datetime.date.today().isoformat()}.",
        "",
        f"- commit: {commit()}, the checkout that wrote this page",
        f"- sweep finished: {finished(args.runs.glob('*/*/*/summary.json'))}, the day of the newest run",
        f"- machine: {hardware(data)}",
        f"- seeds: {', '.join(str(seed) for seed in seeds(data))}",
        "",
        "fps: environment steps per second over whole iterations after burn-in (off-policy families: after "
        "learning_starts plus the burn-in), median over seeds. "
        "`not run`: the sweep had no such configuration for that family. "
        "A seeds program (`compile-4-seeds`: the family's seeds script training the agents of seeds s to s + 3 in one "
        "process, with --compile) counts the steps of all its agents. "
        "The last column: the fastest configuration that trains the baseline's agent; `pruned` (a smaller network) and "
        "the seeds program (4 agents) apart.",
        "",
    ]
    lines += headline(data, columns) + ["", "![fps](fps.png)", "", "## Final return (mean ± std over seeds)", ""]
    lines += returns_table(data, columns) + [""]
    plot_fps(data, columns, args.out)
    for family, configs in data.items():
        env_id = first_summary(configs)["env_id"]
        lines += [f"## {family}: {env_id}", ""] + detail(env_id, configs)
        lines += ["", f"![{family} returns]({plot_returns(family, configs, args.out)})", ""]
    write_keeping_notes(args.out / "fps_table.md", lines)
    print(f"wrote {args.out / 'fps_table.md'}, {args.out / 'fps.png'} and the returns plots")


def verdict(values: list, baseline: list) -> str:
    """The rule in learning.md's caption: the mean final return against the range of the baseline's seeds."""
    if not values or not baseline:
        return "-"
    mean = statistics.mean(values)
    if mean < min(baseline):
        return "outside: below"
    if mean > max(baseline):
        return "outside: above"
    return "within the baseline's seed spread"


def seed_value(summary: dict) -> str:
    value = f"{summary['seed']}: {fmt(summary['final_return'], '.1f')}"
    if summary.get("interrupted"):
        value += f" (stopped at {summary['global_step']:,} steps)"
    return value


def first_logged(rows: list):
    return next((r["episodic_return"] for r in rows if r["episodic_return"] is not None), None)


def budget(configs: dict) -> str:
    steps = sorted({s["total_timesteps"] for c in configs.values() for s, _ in c.runs})
    return " / ".join(f"{n:,}" for n in steps)


def learning_table(configs: dict) -> list:
    """Per configuration: the final return (mean ± std, each seed) beside the baseline's, and the verdict."""
    reference = next(iter(configs))  # 01-baseline, or the family's first configuration
    base = configs[reference].finals
    base_cell = f"{statistics.mean(base):.1f} ({min(base):.1f} to {max(base):.1f})" if base else "-"
    head = [
        "configuration",
        "script",
        "first logged return (mean)",
        "final return (mean ± std)",
        "each seed (seed: final return)",
        f"`{column_name(reference)}` (mean, min to max)",
        "verdict",
    ]
    lines = ["| " + " | ".join(head) + " |", "|---|---|---:|---:|---|---:|---|"]
    for name, c in configs.items():
        if c.skipped:
            lines.append(f"| `{column_name(name)}` | skipped: {c.skipped} | - | - | - | {base_cell} | - |")
            continue
        firsts = [r for r in (first_logged(rows) for _, rows in c.runs) if r is not None]
        cells = [
            f"`{column_name(name)}`",
            ", ".join(sorted({f"`{s['script']}`" for s, _ in c.runs})),
            fmt(statistics.mean(firsts) if firsts else None, ".1f"),
            mean_spread(c.finals),
            ", ".join(seed_value(s) for s, _ in sorted(c.runs, key=lambda run: run[0]["seed"])),
            base_cell,
            "reference" if name == reference else verdict(c.finals, base),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def draw_seed_returns(ax, family: str, configs: dict):
    """Returns against environment steps, a colour per configuration and a thin line per seed."""
    for i, (config, c) in enumerate(configs.items()):
        for j, (_, rows) in enumerate(c.runs):
            pts = [(r["global_step"], r["episodic_return"]) for r in rows if r["episodic_return"] is not None]
            name = label(config, c).strip("`") if j == 0 else None
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=f"C{i}", alpha=0.7, lw=0.8, label=name)
    ax.set_xlabel("environment steps")
    ax.set_ylabel("episodic return (last 20 episodes)")
    ax.grid(alpha=0.3)
    ax.set_title(f"{family}: {first_summary(configs)['env_id']}, a line per seed")


def plot_seed_returns(family: str, configs: dict, out: Path, name: str, reference) -> str:
    """draw_seed_returns, with what `reference` draws on the axes (a line to reach); saved as `out/name`."""
    fig, ax = plt.subplots(figsize=(7, 4))
    draw_seed_returns(ax, family, configs)
    reference(ax)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / name, dpi=100)
    plt.close(fig)
    return name


def plot_learning(family: str, configs: dict, out: Path) -> str:
    """The returns, with the env's "solved" threshold where it has one."""
    env_id = first_summary(configs)["env_id"]

    def solved(ax):
        if env_id in THRESHOLDS:
            ax.axhline(THRESHOLDS[env_id], color="grey", ls="--", lw=0.8, label="solved")

    return plot_seed_returns(family, configs, out, f"learning_{family}.png", solved)


NOTES_MARK = "<!-- written by hand from here on: report.py keeps what follows when it writes this page again -->"


def write_keeping_notes(page: Path, lines: list):
    """`lines` into `page`, then the mark and what an earlier page had below it: what the numbers mean (a configuration
    outside, a fix, runs in progress) is written by hand there, and kept."""
    notes = page.read_text().partition(NOTES_MARK)[2] if page.exists() else ""
    page.write_text("\n".join(lines + [NOTES_MARK]) + (notes or "\n"))


def page_sections(text: str) -> dict:
    """{family: its section}, as an earlier learning.md has them above the hand-written notes."""
    sections = {}
    for block in ("\n" + text.partition(NOTES_MARK)[0]).split("\n## ")[1:]:
        heading = block.partition("\n")[0]
        sections[heading.partition(":")[0]] = "## " + block.rstrip("\n") + "\n"
    return sections


def run_time(summaries: list) -> str:
    seconds = sum(s["wall_time"] for s in summaries)
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def learning_report(args: Args, data: dict):
    ran = {f: c for f, c in data.items() if any(cfg.runs for cfg in c.values())}
    summaries = [s for c in ran.values() for cfg in c.values() for s, _ in cfg.runs]
    today = datetime.date.today().isoformat()
    # asked once, before the plots are written: a page written into the checkout's doc/ would otherwise make the
    # later sections say "with uncommitted changes" of a clean tree
    wrote = commit()
    page = args.out / "learning.md"
    before = page.read_text() if page.exists() else ""
    # a family with no runs under RUNS keeps its section from the page before (a LEARN=1 run of some families)
    kept = {f: text for f, text in page_sections(before).items() if f not in data}
    lines = [
        "# Learning at each family's budget",
        "",
        f"Written by `python leanrl/tools/report.py {args.runs} --learning` (the last step of `LEARN=1 bash run.sh`) "
        f"on {today}, from the runs under {args.runs}:",
        "",
        f"- commit: {wrote}, the checkout that wrote this page",
        f"- machine: {hardware(ran)}",
        f"- seeds: {', '.join(str(seed) for seed in seeds(ran))}",
        "- steps per run: " + "; ".join(f"{family} {budget(configs)}" for family, configs in ran.items()),
        f"- time: {run_time(summaries)}, the sum of the runs' wall times (run.sh runs them one after another)",
    ]
    if kept:
        lines.append(
            f"- kept from the page before, with no runs under {args.runs}: {', '.join(sorted(kept))} (each section "
            "says where and when its runs ran)"
        )
    lines += [
        "",
        "Final return: the mean episodic return of the last 20 episodes when the run ended (summary.json's "
        "`final_return`); first logged return: the first such mean the run logged, where it started from. "
        "Verdict: `within the baseline's seed spread` when the configuration's mean final return lies between the "
        "lowest and the highest final return of the baseline's seeds (ends included), otherwise `outside: below` or "
        "`outside: above`. With two or three seeds the spread is narrow and RL returns vary widely between seeds: "
        "`outside` asks for a look at the plot and more seeds, it does not prove a difference.",
        "",
    ]
    for family in sorted(data.keys() | kept.keys()):
        if family in kept:
            lines += [kept[family]]
            continue
        configs = data[family]
        if family not in ran:
            reasons = sorted({c.skipped for c in configs.values()})
            lines += [f"## {family}", ""] + [f"Not run: {reason.rstrip('.')}." for reason in reasons] + [""]
            continue
        runs = [s for cfg in configs.values() for s, _ in cfg.runs]
        lines += [f"## {family}: {first_summary(configs)['env_id']}, {budget(configs)} steps per run", ""]
        lines += [
            f"Runs: {hardware({family: configs})}; {run_time(runs)} of run time, the newest finished on "
            f"{finished((args.runs / family).glob('*/*/summary.json'))}; written on {today} at {wrote}.",
            "",
        ]
        lines += learning_table(configs)
        lines += ["", f"![{family} returns]({plot_learning(family, configs, args.out)})", ""]
    write_keeping_notes(page, lines)
    print(f"wrote {page} and the learning plots")


def cumulative(rows: list) -> list:
    """The rows with `time` counted from the run's first start. Each process of a resumed run logs the seconds since
    its own start, so where `time` drops a new process began, and the time of the one before (its last row) is added:
    the pause between them and the steps the stopped process logged past its checkpoint (dropped on resume) are not
    counted."""
    offset = 0.0
    last = 0.0
    counted = []
    for row in rows:
        if row["time"] < last:
            offset += last
        last = row["time"]
        counted.append(dict(row, time=offset + row["time"]))
    return counted


def time_to_score(rows: list, score: float):
    """(env step, wall time in seconds) of the first logged return at or above `score`; (None, None) if none is."""
    return first_reaching(cumulative(rows), score)


def elapsed(rows: list) -> float:
    """The run's wall time up to its last log line, every process of a resumed run counted."""
    return cumulative(rows)[-1]["time"]


def in_progress(summary: dict) -> bool:
    """A run stopped before its budget (Ctrl-C, SIGTERM), which the next `CLEANRL=1 bash run.sh` resumes. A PPO run that
    ended by itself stops at its last whole batch, short of total_timesteps: `interrupted` tells them apart."""
    return summary["interrupted"]


def iqm_ci(finals: list) -> tuple:
    """(IQM, low, high): the interquartile mean of the final returns and its 95% confidence interval, rliable's
    percentile stratified bootstrap (one task: the runs are resampled), seeded so that the page reads the same each
    time it is written."""
    return bootstrap_iqm(tuple(finals), BOOTSTRAP_REPS)


@functools.cache  # a row's interval is asked for its cell, its verdict and the plot: a bootstrap takes seconds
def bootstrap_iqm(finals: tuple, reps: int) -> tuple:
    from rliable import library, metrics  # pandas, seaborn and arch take seconds to import: the learning pages only

    # rliable 1.2.0's StratifiedBootstrap draws from numpy's global generator, whatever random_state it is given
    state = np.random.get_state()
    np.random.seed(0)
    try:
        point, interval = library.get_interval_estimates(
            {"runs": np.asarray(finals, dtype=float)[:, None]},
            lambda scores: np.array([metrics.aggregate_iqm(scores)]),
            reps=reps,
        )
    finally:
        np.random.set_state(state)
    return float(point["runs"][0]), float(interval["runs"][0, 0]), float(interval["runs"][1, 0])


def cleanrl_verdict(finals: list, reference: Optional[list], published: Published, steps: int) -> str:
    """The rule in learning_cleanrl.md's caption: the 95% CIs of the IQM of our finished runs and of CleanRL's file run
    at the same budget, as we ran it (`reference`: its finished runs' final returns, None where it has not run).
    Without that reference there is no verdict: CleanRL's tables give mean ± std, no per-seed values to bootstrap."""
    if not finals:
        return "no finished run yet"
    if reference is None:
        if steps < published.steps:
            return (
                f"no verdict: CleanRL's figure is at {published.steps:,} steps, ours at {steps:,}, and no run of "
                f"CleanRL's file at {steps:,}"
            )
        return "no verdict: CleanRL publishes no per-seed values"
    if len(finals) < MIN_RUNS:
        return f"no verdict: {len(finals)} finished runs, {MIN_RUNS} needed"
    if len(reference) < MIN_RUNS:
        return f"no verdict: {len(reference)} finished runs of CleanRL's file, {MIN_RUNS} needed"
    _, low, high = iqm_ci(finals)
    _, reference_low, reference_high = iqm_ci(reference)
    if low > reference_high:
        return "above: the CIs are apart"
    if high < reference_low:
        return "below: the CIs are apart"
    return "no difference shown: the CIs overlap"


def against_ci(finals: list, published: Published, steps: int) -> str:
    """Where CleanRL's published mean (the IQM of its 3 seeds: a quarter of 3 rounds down to none trimmed) lies
    against the CI of these runs: a fact beside the verdict, from MIN_RUNS finished runs on, at CleanRL's budget."""
    if len(finals) < MIN_RUNS or steps != published.steps:
        return "-"
    _, low, high = iqm_ci(finals)
    if published.mean < low:
        return "below it"
    if published.mean > high:
        return "above it"
    return "inside"


def iqm_cell(finals: list, brief: bool = False) -> str:
    """`IQM [low, high] (n=N)`; the IQM alone under MIN_RUNS runs. `brief`: `(N)`, for the README."""
    if not finals:
        return "-"
    n = f"({len(finals)})" if brief else f"(n={len(finals)})"
    if len(finals) < MIN_RUNS:
        return f"{iqm_ci(finals)[0]:.1f} {n}"
    iqm, low, high = iqm_ci(finals)
    return f"{iqm:.1f} [{low:.1f}, {high:.1f}] {n}"


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def shared_clock(summary: dict) -> str:
    """The footnote mark of a seeds-script member, whose wall time is the whole program's."""
    return "†" if "members" in summary else ""


def finished_finals(config: Config) -> list:
    return [s["final_return"] for s, _ in config.runs if not in_progress(s) and s["final_return"] is not None]


def budget_of(config: Config) -> int:
    return max(s["total_timesteps"] for s, _ in config.runs)


def our_steps(configs: dict) -> int:
    """The family's budget: that of our runs, or of CleanRL's file's where the family has no run of ours yet."""
    ours = [c for c in configs.values() if c.runs and not is_reference(c)]
    return max(budget_of(c) for c in ours or [c for c in configs.values() if c.runs])


def cleanrl_cell(published: Published) -> str:
    return f"{published.mean:.2f} ± {published.std:.2f}"


def is_reference(config: Config) -> bool:
    """A configuration of runs of CleanRL's own file (leanrl/tools/cleanrl_reference.py), not of ours."""
    return bool(config.runs) and all(s["script"].startswith(REFERENCE_SCRIPT) for s, _ in config.runs)


def reference_finals(configs: dict, steps: int) -> Optional[list]:
    """The finished runs' final returns of our runs of CleanRL's file at `steps`; None where it has not run."""
    found = [c for c in configs.values() if is_reference(c) and budget_of(c) == steps]
    return [final for c in found for final in finished_finals(c)] if found else None


def label(name: str, config: Config) -> str:
    return "CleanRL's file, our run" if is_reference(config) else f"`{column_name(name)}`"


def cleanrl_table(configs: dict, published: Published) -> list:
    """Per configuration: the IQM and CI of the finished runs' final returns, each seed's, CleanRL's published figure
    and where it lies against the CI, the verdict against our runs of CleanRL's file, each seed's wall time and env step
    to CleanRL's mean, and its wall time in all."""
    head = [
        "configuration",
        "script",
        "final return: IQM [95% CI] (finished runs)",
        "each seed (seed: final return)",
        f"CleanRL (mean ± std, {CLEANRL_SEEDS} seeds)",
        "CleanRL's mean against this row's CI",
        "verdict",
        f"time to {published.mean:.2f} (seed: wall time at env step)",
        "wall time (each seed)",
    ]
    lines = ["| " + " | ".join(head) + " |", "|---|---|---:|---|---:|---|---|---|---|"]
    steps = our_steps(configs)
    reference = reference_finals(configs, steps)
    for name, c in configs.items():
        if not c.runs:
            continue
        seeds_cells = []
        times = []
        walls = []
        for s, rows in sorted(c.runs, key=lambda run: run[0]["seed"]):
            mark = shared_clock(s)
            if in_progress(s):
                seeds_cells.append(f"{s['seed']}: in progress at step {s['global_step']:,}")
            else:
                seeds_cells.append(f"{s['seed']}: {fmt(s['final_return'], '.1f')}")
            step, seconds = time_to_score(rows, published.mean)
            reached = f"{minutes(seconds)} at {step:,} steps{mark}" if step is not None else "not reached"
            times.append(f"{s['seed']}: {reached}")
            walls.append(f"{s['seed']}: {minutes(elapsed(rows))}{mark}" if rows else f"{s['seed']}: -")
        finals = finished_finals(c)
        cells = [
            label(name, c),
            ", ".join(sorted({f"`{s['script']}`" for s, _ in c.runs})),
            iqm_cell(finals),
            ", ".join(seeds_cells),
            cleanrl_cell(published),
            against_ci(finals, published, steps),
            "the reference" if is_reference(c) else cleanrl_verdict(finals, reference, published, steps),
            ", ".join(times),
            ", ".join(walls),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def cleanrl_figure(family: str, configs: dict, published: Published):
    """Left, the returns of every seed below CleanRL's final mean (dashed) and its ± std (shaded). Right, a point per
    finished run at its final return (two modes stay two clusters), each row's IQM (a bar) and 95% CI (a line), and
    CleanRL's published mean ± std, which has no per-seed values to show."""
    fig, (curves, strip) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw=dict(width_ratios=[3, 2]))
    draw_seed_returns(curves, family, configs)
    published_label = f"CleanRL's {published.script} at {published.steps:,} steps: {cleanrl_cell(published)}"
    curves.axhline(published.mean, color="black", ls="--", lw=0.8, label=published_label)
    curves.axhspan(published.mean - published.std, published.mean + published.std, color="grey", alpha=0.2)
    curves.legend(fontsize=7)
    names = []
    for i, (name, c) in enumerate(configs.items()):  # the colours of the curves
        finals = finished_finals(c)
        names.append(label(name, c).strip("`").replace(", ", ",\n"))
        if not finals:
            continue
        spread = np.linspace(-0.15, 0.15, len(finals)) if len(finals) > 1 else np.zeros(1)
        strip.scatter(i + spread, finals, s=14, color=f"C{i}", alpha=0.8, zorder=3)
        iqm = iqm_ci(finals)
        strip.hlines(iqm[0], i - 0.3, i + 0.3, color="black", lw=1.5, zorder=4)
        if len(finals) >= MIN_RUNS:
            strip.vlines(i + 0.25, iqm[1], iqm[2], color="black", lw=1.0, zorder=4)
    strip.errorbar(
        len(names),
        published.mean,
        yerr=published.std,
        fmt="D",
        mfc="none",
        color="black",
        capsize=4,
        label=f"CleanRL: mean ± std of {CLEANRL_SEEDS} seeds, no per-seed values published",
    )
    strip.set_xticks(range(len(names) + 1), names + ["CleanRL\n(published)"], fontsize=7)
    strip.set_ylabel("final return (last 20 episodes)")
    strip.set_title("each run's final return; bar: IQM, line: its 95% CI", fontsize=9)
    strip.grid(alpha=0.3, axis="y")
    strip.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def plot_cleanrl(family: str, configs: dict, published: Published, out: Path) -> str:
    name = f"cleanrl_{family}.png"
    fig = cleanrl_figure(family, configs, published)
    fig.savefig(out / name, dpi=100)
    plt.close(fig)
    return name


def short_steps(steps: int) -> str:
    return f"{steps / 1e6:g}M" if steps >= 1_000_000 else f"{steps / 1e3:g}k"


def readme_lines(data: dict) -> list:
    """The README's table: per family CleanRL's published result (and our runs of CleanRL's file, where there are
    some), ours with --compile and without (IQM [95% CI] (runs), the verdict's first words), and the median time to
    CleanRL's mean over the seeds that reached it."""
    lines = [
        "| family | CleanRL | ours (compile) | ours (baseline) | time to CleanRL's score |",
        "|---|---:|---:|---:|---|",
    ]
    shared = False
    for family, configs in data.items():
        published = CLEANRL[family]
        steps = our_steps(configs)
        reference = reference_finals(configs, steps)
        budget_cell = short_steps(steps)
        if steps < published.steps:
            budget_cell += f" of CleanRL's {short_steps(published.steps)}"
        cleanrl = cleanrl_cell(published)
        if reference is not None:
            cleanrl += f"; its file, our run: {iqm_cell(reference, brief=True) if reference else 'in progress'}"
        cells = [f"{family} ({first_summary(configs)['env_id']}, {budget_cell})", cleanrl]
        times = []
        files = [name for name, c in configs.items() if is_reference(c) and budget_of(c) == steps]
        for name in files[:1] + ["03-compile", "01-baseline"]:
            c = configs.get(name)
            if c is None or not c.runs:
                cells.append("not run")
                continue
            finals = finished_finals(c)
            if not is_reference(c):
                verdict = cleanrl_verdict(finals, reference, published, steps).partition(":")[0]
                cells.append(f"{iqm_cell(finals, brief=True)}, {verdict}" if finals else "in progress")
            seconds = [time_to_score(rows, published.mean)[1] for _, rows in c.runs]
            reached = [t for t in seconds if t is not None]
            mark = shared_clock(c.runs[0][0])
            shared = shared or bool(mark)
            median = f"{minutes(statistics.median(reached))}{mark}" if reached else "not reached"
            times.append(f"{column_name(name)} {median} ({len(reached)} of {len(c.runs)} seeds)")
        cells.append(", ".join(times))
        lines.append("| " + " | ".join(cells) + " |")
    if shared:
        lines += ["", "† the seeds train together in one program: the time is the program's."]
    return lines


def cleanrl_report(args: Args, data: dict):
    for family in data.keys() - CLEANRL.keys():
        print(f"warning: {family}: no CleanRL result in report.py's CLEANRL table, left out", file=sys.stderr)
    # in run.sh's order for CLEANRL=1, the order of CleanRL's table
    ran = {f: data[f] for f in CLEANRL if f in data and any(c.runs for c in data[f].values())}
    # asked before the plots are written: a page written into the checkout's doc/ would make the tree look changed
    wrote = commit()
    today = datetime.date.today().isoformat()
    page = args.out / "learning_cleanrl.md"
    # a family with no recorded runs keeps its section from the page before
    kept = {f: text for f, text in page_sections(page.read_text() if page.exists() else "").items() if f not in ran}
    steps = "; ".join(f"{f} {our_steps(c):,} (CleanRL's {CLEANRL[f].steps:,})" for f, c in ran.items())
    newest = max(s["finished_on"] for c in ran.values() for cfg in c.values() for s, _ in cfg.runs)
    lines = [
        "# Learning at CleanRL's budgets, beside CleanRL's published results",
        "",
        f"Written by `python leanrl/tools/report.py {args.runs} --cleanrl`"
        + ("" if from_record(args) else " (the last step of `CLEANRL=1 bash run.sh`)")
        + f" on {today}, from the runs recorded in [{RECORD}/]({RECORD}/)"
        + ("" if from_record(args) else f" (the runs under {args.runs}, and those an earlier sitting recorded)")
        + ":",
        "",
        f"- commit: {wrote}, the checkout that wrote this page",
        f"- machines: {hardware(ran)}",
        f"- newest run: {newest}, the day it finished or stopped",
        f"- seeds: {', '.join(str(seed) for seed in seeds(ran))}",
        f"- steps per run: {steps}",
    ]
    if kept:
        lines.append(
            f"- kept from the page before, with no recorded runs: {', '.join(kept)} (the section says where and when "
            "its runs ran; its table, verdict included, is as that page wrote it)"
        )
    lines += [
        "",
        f"CleanRL: the final episodic return (mean ± std over CleanRL's {CLEANRL_SEEDS} seeds) and the runtime of one "
        "run on CleanRL's machine, from CleanRL's benchmark tables (openrlbenchmark, the runs tagged pr-424), which "
        "publish no per-seed values. CleanRL's file, our run: CleanRL's own script at its defaults, run by "
        "`leanrl/tools/cleanrl_reference.py` on a machine of ours (the section names it), a row like ours. "
        "Final return: the mean episodic return of the last 20 episodes when the run ended (summary.json's "
        "`final_return`). Each row gives the interquartile mean (IQM) of its finished runs' final returns, the mean of "
        "their middle half, which one run far off moves less than it moves the mean, and the IQM's 95% confidence "
        f"interval, a stratified bootstrap (rliable, {BOOTSTRAP_REPS:,} resamples, seed 0), as Agarwal et al. (2021, "
        f'"Deep RL at the Edge of the Statistical Precipice") advise for few runs. The CI needs {MIN_RUNS} finished '
        "runs; with fewer, the row gives the IQM alone. Of 3 runs the IQM is the mean (a quarter of 3 rounds down to "
        "none left out), so CleanRL's published mean is its IQM. The plot beside each table has a point per run at "
        "its final return: runs in two modes show as two clusters, not as one mean between them. "
        "CleanRL's mean against this row's CI: `inside`, `below it` or `above it`, a fact and not a verdict (the CI "
        "of CleanRL's own seeds is not known). "
        "Verdict: against our runs of CleanRL's file at the same budget, `above` or `below` where the two 95% "
        "CIs are apart, `no difference shown` where they overlap (touching ends included): with a few seeds an "
        "overlap is no proof that the two match. `no verdict` without that reference (a published mean ± std has no "
        "per-seed values to bootstrap, and a figure at another budget says nothing of ours) or with fewer than "
        f"{MIN_RUNS} finished runs on either side. A run stopped before its budget shows `in progress at step N` and "
        "is left out; the next `CLEANRL=1 bash run.sh` resumes it. "
        "Time to CleanRL's score: per seed, the wall time (compiling included) and the env step at which the logged "
        "episodic return (the same mean of the last 20 episodes) first reaches CleanRL's mean; a run stopped and "
        "resumed counts the time of each of its processes, not the pauses between them.",
        "",
    ]
    for family in CLEANRL:
        if family in kept:
            lines += [kept[family]]
            continue
        if family not in ran:
            continue
        configs = ran[family]
        published = CLEANRL[family]
        ours = our_steps(configs)
        lines += [f"## {family}: {published.env_id} (CleanRL's {published.script})", ""]
        runtime = f"{published.minutes} min a run on CleanRL's machine" if published.minutes else "not published"
        lines += [f"Steps per run: ours {ours:,}, CleanRL's {published.steps:,}. CleanRL's runtime: {runtime}.", ""]
        if ours < published.steps and reference_finals(configs, ours) is None:
            lines += [
                f"Our runs stop at {ours:,} steps: CleanRL's {published.steps:,}-step figure cannot judge them, and no "
                f"run of CleanRL's file at {ours:,} steps is here to: no verdict.",
                "",
            ]
        reference = next((c.runs for c in configs.values() if is_reference(c)), [])
        if reference:
            # each machine and set of versions the seeds ran on, in the order of their first seed, with its seeds
            where = {}
            for s, _ in sorted(reference, key=lambda run: run[0]["seed"]):
                machine = f"{s['cpu']}, gymnasium {s['gymnasium']}, MuJoCo {s['mujoco']}, torch {s['torch']}"
                where.setdefault(machine, []).append(s["seed"])
            labels = [
                machine if len(where) == 1 else f"{machine} (seed{'s' * (len(seeds) > 1)} {', '.join(map(str, seeds))})"
                for machine, seeds in where.items()
            ]
            lines += [
                f"CleanRL's file, our run: `{reference[0][0]['script']}`, run by `leanrl/tools/cleanrl_reference.py` "
                f"on {'; '.join(labels)}; ours on envpool.",
                "",
            ]
        lines += cleanrl_table(configs, published)
        scripts = sorted({s["script"] for c in configs.values() for s, _ in c.runs if shared_clock(s)})
        # a blank line first: a line right below a table would be read as one more row
        lines += [""] * bool(scripts) + [
            f"† {script} trains its seeds together in one program: a seed's wall time is the program's."
            for script in scripts
        ]
        lines += ["", f"![{family} returns]({plot_cleanrl(family, configs, published, args.out)})", ""]
    write_keeping_notes(page, lines)
    print(f"wrote {page} and the CleanRL plots; the README's lines:\n")
    print("\n".join(readme_lines(ran)))


def from_record(args: Args) -> bool:
    """--cleanrl given the record itself (doc/cleanrl_runs): the page is written again from it as it is."""
    return args.runs.resolve() == (args.out / RECORD).resolve()


def main():
    args = plumbing.parse_args(Args)
    if not args.runs.is_dir():
        plumbing.fail(f"{args.runs} is not a folder: give the OUT folder of run.sh")
    try:  # before the runs are read: a report that cannot be written is known at once
        args.out.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=args.out).close()
    except OSError as e:
        plumbing.fail(f"--out {args.out}: cannot write there ({e.strerror or e})")
    if args.learning and args.cleanrl:
        plumbing.fail("--learning and --cleanrl write different pages from different sweeps: give one of them")
    runs = args.runs
    if args.cleanrl:
        runs = args.out / RECORD
        if not from_record(args):
            record_runs(args.runs, runs)
        runs.mkdir(exist_ok=True)
    data = load(runs)
    if not any(cfg.runs for configs in data.values() for cfg in configs.values()):
        plumbing.fail(f"no finished runs under {args.runs} (expected <family>/<NN-configuration>/<seed>/summary.json)")
    if args.learning:
        learning_report(args, data)
    elif args.cleanrl:
        cleanrl_report(args, data)
    else:
        fps_report(args, {f: c for f, c in data.items() if any(cfg.runs for cfg in c.values())})


if __name__ == "__main__":
    main()
