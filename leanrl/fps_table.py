"""Turn the runs of run.sh into doc/fps.md and plots: steady-state fps (median of the seeds), speed-up over the
family's eager baseline, compile time, and learning (final return, steps and seconds to the env's threshold).

    python leanrl/fps_table.py runs/bench --out doc

Each run is RUNS/<NN-config>/<seed>/ with the summary.json and metrics.jsonl a training script writes; the
two-digit prefix orders the rows, and the first configuration of each env is that env's baseline.
"""

import argparse
import json
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

THRESHOLDS = {"CartPole-v1": 475.0}  # the env's own "solved" return, where it has one


def load(runs: Path) -> dict:
    """{env_id: {config: [(summary, rows), ...]}} in the prefix order."""
    out = {}
    for config_dir in sorted(p for p in runs.iterdir() if p.is_dir()):
        for seed_dir in sorted(p for p in config_dir.iterdir() if (p / "summary.json").exists()):
            summary = json.loads((seed_dir / "summary.json").read_text())
            rows = [json.loads(line) for line in (seed_dir / "metrics.jsonl").read_text().splitlines()]
            config = config_dir.name.split("-", 1)[-1]
            out.setdefault(summary["env_id"], {}).setdefault(config, []).append((summary, rows))
    return out


def first_reaching(rows, threshold):
    row = next((r for r in rows if (r["episodic_return"] or float("-inf")) >= threshold), None)
    return (row["global_step"], row["time"]) if row else (None, None)


def fmt(x, spec=".0f"):
    return "-" if x is None else format(x, spec)


def table(env_id: str, configs: dict) -> list:
    threshold = THRESHOLDS.get(env_id)
    head = ["configuration", "fps (median, min-max)", "speed-up", "compile s", "final return (mean of seeds)"]
    if threshold:
        head += [f"steps to {threshold:.0f}", f"seconds to {threshold:.0f}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    base = None
    for config, runs in configs.items():
        fps = [s["fps"] for s, _ in runs if s["fps"]]
        med = statistics.median(fps) if fps else None
        base = base or med
        comp = [s["compile_time"] for s, _ in runs if s.get("compile_time") is not None]
        finals = [s["final_return"] for s, _ in runs if s["final_return"] is not None]
        cells = [f"`{config}`", f"{fmt(med)} ({fmt(min(fps, default=None))}-{fmt(max(fps, default=None))})",
                 f"{med / base:.2f}x" if med and base else "-", fmt(statistics.median(comp) if comp else None, ".1f"),
                 f"{fmt(statistics.mean(finals) if finals else None, '.1f')} (n={len(finals)})"]
        if threshold:
            reached = [first_reaching(rows, threshold) for _, rows in runs]
            steps = [s for s, _ in reached if s is not None]
            secs = [t for _, t in reached if t is not None]
            cells += [f"{fmt(statistics.median(steps) if steps else None)} ({len(steps)}/{len(runs)} runs)",
                      fmt(statistics.median(secs) if secs else None, ".1f")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def plot(env_id: str, configs: dict, out: Path) -> str:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for i, (config, runs) in enumerate(configs.items()):
        for j, (_, rows) in enumerate(runs):
            pts = [(r["global_step"], r["time"], r["episodic_return"]) for r in rows if r["episodic_return"] is not None]
            kw = dict(color=f"C{i}", alpha=0.8, lw=1, label=config if j == 0 else None)
            axes[0].plot([p[0] for p in pts], [p[2] for p in pts], **kw)
            axes[1].plot([p[1] for p in pts], [p[2] for p in pts], **kw)
    for ax, xlabel in zip(axes, ("environment steps", "wall time (s)")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("episodic return (last 20 episodes)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(env_id)
    fig.tight_layout()
    name = f"{env_id.replace('/', '-')}_return.png"
    fig.savefig(out / name, dpi=100)
    plt.close(fig)
    return name


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path)
    parser.add_argument("--out", type=Path, default=Path("doc"))
    opts = parser.parse_args()
    data = load(opts.runs)
    if not data:
        parser.error(f"no runs under {opts.runs}")
    opts.out.mkdir(parents=True, exist_ok=True)
    lines = ["# fps comparison", "", "Written by `run.sh` (`python leanrl/fps_table.py`); every number below is from one "
             "sweep on one machine, the configurations interleaved seed by seed.", ""]
    for env_id, configs in data.items():
        s = next(iter(configs.values()))[0][0]
        steps = s["total_timesteps"]
        lines += [f"## {env_id}, {steps:,} steps per run", "",
                  f"Hardware: {s['cpu']}, GPU: {s['gpu'] or 'none'}, torch {s['torch']}.", ""]
        lines += table(env_id, configs)
        lines += ["", f"![{env_id} return]({plot(env_id, configs, opts.out)})", ""]
    (opts.out / "fps.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {opts.out / 'fps.md'}")


if __name__ == "__main__":
    main()
