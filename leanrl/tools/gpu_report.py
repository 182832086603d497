"""The GPU check's tables (leanrl/tools/gpu_check.sh writes its runs, then calls this): OUT/gpu_table.md, the figures
that doc/gpu.md and the README take, and OUT/tests.txt, the verdict of every test of tests/test_gpu.py.

    python leanrl/tools/gpu_report.py runs/gpu --commit abc1234

Reads OUT/tests/<shard>/ (pytest's output and its runs' summary.json files) and OUT/sweep/<family>/<config>/1/
(the time-boxed sweep), and sets the sweep against the last GPU figures (one H200, 2026-11-22, commit 6a8bca5) and
the targets: Breakout `--compile --cudagraphs` at 85% of its envs alone, HalfCheetah at 70%, every cold compile
under 45 s.
"""

import datetime
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import tyro

# steady-state fps on one H200 (16-core host), torch 2.11.0+cu130, commit 6a8bca5, 2026-11-22 (doc/gpu.md)
BEFORE = {
    "atari": dict(baseline=2047, cg=3656),
    "mujoco": dict(baseline=488, cg=3729),
    "classic": dict(baseline=2239, cg=27694),
}
SHARE = {"atari": 0.85, "mujoco": 0.70}  # the targets: --compile --cudagraphs against the envs alone
COMPILE_LIMIT = 45.0


@dataclass
class Args:
    """Write OUT/gpu_table.md and OUT/tests.txt from the GPU check's runs in OUT."""

    out: tyro.conf.Positional[Path]
    """the GPU check's folder (gpu_check.sh's OUT)"""
    commit: str = "unknown"
    """the commit the checked tree was at"""


def summaries(folder: Path) -> list:
    found = []
    for path in sorted(folder.glob("**/summary.json")):
        try:
            found.append((path, json.loads(path.read_text())))
        except (OSError, ValueError) as e:
            print(f"warning: {path}: unreadable ({e}); left out", file=sys.stderr)
    return found


def verdicts(out: Path) -> dict:
    """{test id: PASSED / FAILED / ERROR / SKIPPED, or "no verdict" where its shard stopped first}."""
    found = {}
    for shard in sorted((out / "tests").glob("*")):
        ids = (shard / "ids.txt").read_text().split() if (shard / "ids.txt").exists() else []
        text = (shard / "pytest.txt").read_text(errors="replace") if (shard / "pytest.txt").exists() else ""
        said = dict(
            (m.group(2), m.group(1)) for m in re.finditer(r"^(PASSED|FAILED|ERROR|SKIPPED) (\S+::\S+)", text, re.M)
        )
        # pytest names a skipped test only by its line ("SKIPPED [2] tests/test_gpu.py:43: reason"): a shard that
        # ran to its end with nothing but skips skipped them all (no CUDA: a rehearsal)
        skipped_all = not said and re.search(r"^(?:=+ )?\d+ skipped\b", text, re.M) is not None
        for test in ids:
            found[test] = said.get(test, "SKIPPED" if skipped_all else "no verdict (its shard stopped first)")
    return found


def fmt(x, spec=",.0f") -> str:
    return "-" if x is None else format(x, spec)


def sweep_table(out: Path) -> tuple:
    """The sweep's rows, and the targets' lines."""
    runs = {}
    for path, s in summaries(out / "sweep"):
        family, config = path.parts[-4], path.parts[-3]
        runs.setdefault(family, {})[config] = s
    lines = [
        "| family (env) | eager baseline | `--compile --cudagraphs` | speed-up | env alone | share of env alone "
        "| compile time | 2026-11-22: baseline / cudagraphs |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    targets = []
    for family, configs in sorted(runs.items()):
        base, cg, alone = (configs.get(k, {}) for k in ("baseline", "compile-cudagraphs", "env-alone"))
        fps_base, fps_cg, fps_alone = base.get("fps"), cg.get("fps"), alone.get("fps")
        env_id = next((c["env_id"] for c in configs.values() if c.get("env_id")), "?")
        before = BEFORE.get(family)
        then = f"{before['baseline']:,} / {before['cg']:,}" if before else "-"
        lines.append(
            f"| {family} ({env_id}) | {fmt(fps_base)} | {fmt(fps_cg)} "
            f"| {fmt(fps_cg / fps_base if fps_base and fps_cg else None, '.2f')}x | {fmt(fps_alone)} "
            f"| {fmt(fps_cg / fps_alone if fps_cg and fps_alone else None, '.0%')} "
            f"| {fmt(cg.get('compile_time'), '.1f')} s "
            f"| {then} |"
        )
        if family in SHARE:
            share = fps_cg / fps_alone if fps_cg and fps_alone else None
            met = share is not None and share >= SHARE[family]
            verdict = "met" if met else "NOT met"
            targets.append(f"- {family}: {fmt(share, '.0%')} of its envs alone (target {SHARE[family]:.0%}): {verdict}")
        if before:
            for key, name, fps in (("baseline", "eager baseline", fps_base), ("cg", "--compile --cudagraphs", fps_cg)):
                if fps is not None and fps < before[key]:
                    targets.append(f"- {family} {name}: {fps:,.0f} fps, slower than 2026-11-22's {before[key]:,}")
    return lines, targets


def main():
    args = tyro.cli(Args)
    out = args.out
    tests = verdicts(out)
    compiled = {}
    for _, s in summaries(out / "tests"):
        if s.get("compile_time") is not None:
            compiled[s["script"]] = max(compiled.get(s["script"], 0.0), s["compile_time"])
    sweep = summaries(out / "sweep")
    for _, s in sweep:
        if s.get("compile_time") is not None:
            compiled[s["script"]] = max(compiled.get(s["script"], 0.0), s["compile_time"])
    machine = next((s for _, s in sweep), {})
    counts = {v: sum(1 for x in tests.values() if x == v) for v in ("PASSED", "FAILED", "ERROR", "SKIPPED")}
    silent = sum(1 for x in tests.values() if x.startswith("no verdict"))
    rows, targets = sweep_table(out)
    slow = {k: v for k, v in compiled.items() if v >= COMPILE_LIMIT}
    targets.append(
        f"- cold compiles under {COMPILE_LIMIT:.0f} s: "
        + ("all" if not slow else "NOT all: " + ", ".join(f"{k} {v:.0f} s" for k, v in sorted(slow.items())))
        + f" (the longest: {max(compiled.values(), default=0):.0f} s)"
    )
    lines = [
        "# GPU check",
        "",
        f"{machine.get('gpu') or 'no GPU'} ({machine.get('cpu', '?')}), torch {machine.get('torch', '?')}, commit "
        f"{args.commit}, {datetime.date.today().isoformat()}: `bash leanrl/tools/gpu_check.sh`.",
        "",
        f"## tests/test_gpu.py: {counts['PASSED']} passed, {counts['FAILED'] + counts['ERROR']} failed, "
        f"{counts['SKIPPED']} skipped, {silent} without a verdict",
        "",
        "| test | verdict |",
        "|---|---|",
        *[f"| `{t.split('::', 1)[-1]}` | {v} |" for t, v in sorted(tests.items())],
        "",
        "## The sweep: one seed, each run time-boxed, steady-state fps after burn-in",
        "",
        *rows,
        "",
        "## Against the targets",
        "",
        *targets,
        "",
        "## Cold compile time per script (seconds: its first iteration against a steady one)",
        "",
        "| script | compile time |",
        "|---|---:|",
        *[f"| {k} | {v:.1f} |" for k, v in sorted(compiled.items())],
        "",
    ]
    (out / "gpu_table.md").write_text("\n".join(lines))
    (out / "tests.txt").write_text("".join(f"{v} {t}\n" for t, v in sorted(tests.items())))
    print(f"wrote {out / 'gpu_table.md'} and {out / 'tests.txt'}")


if __name__ == "__main__":
    main()
