"""run.sh and leanrl/tools/report.py: the table from synthetic runs, and the whole sweep in its smoke mode."""

import datetime
import json
import os
import re
import subprocess
import sys
import time

import matplotlib.collections
import numpy as np
import pytest
import torch

import plumbing
from conftest import ROOT, assert_user_error, run_command

ROW = {"episodic_return": None, "time": 1.0}


def fake_run(path, env_id, steps, fps, final, compile_time=None, script="ppo"):
    """A finished run as a training script leaves it: summary.json and metrics.jsonl, the seed its folder's name."""
    path.mkdir(parents=True)
    summary = {
        "script": script,
        "seed": int(path.name),
        "env_id": env_id,
        "total_timesteps": steps,
        "fps": fps,
        "final_return": final,
        "cpu": "Test CPU (2 cores)",
        "gpu": None,
        "torch": "2.13.0+cpu",
        "compile_time": compile_time,
        "wall_time": 900.0,
        "global_step": steps,
        "interrupted": False,
    }
    (path / "summary.json").write_text(json.dumps(summary))
    rows = [
        dict(ROW, global_step=steps // 2, episodic_return=final and final / 2),
        dict(ROW, global_step=steps, episodic_return=final),
    ]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def report(runs, out, *flags):
    cmd = [sys.executable, ROOT / "leanrl" / "tools" / "report.py", runs, "--out", out, *flags]
    return run_command(cmd, timeout=300)


def test_report_on_synthetic_runs(tmp_path):
    runs = tmp_path / "runs"
    for seed, (fps_base, fps_comp, final) in enumerate([(100, 400, 10.0), (200, 500, 20.0), (300, 600, 30.0)]):
        fake_run(runs / "classic/01-baseline" / str(seed), "CartPole-v1", 1000, fps_base, final)
        fake_run(runs / "classic/03-compile" / str(seed), "CartPole-v1", 1000, fps_comp, final + 1, compile_time=5.0)
        fake_run(runs / "classic/09-env-alone" / str(seed), "CartPole-v1", 1000, 2 * fps_comp, None)
    (runs / "classic/04-compile-cudagraphs").mkdir()
    (runs / "classic/04-compile-cudagraphs/SKIPPED").write_text("no CUDA device\n")
    fake_run(runs / "atari/01-baseline/1", "Breakout-v5", 2048, 50, 2.0)
    fake_run(runs / "atari/01-baseline/2", "Breakout-v5", 2048, 70, 4.0)
    proc = report(runs, tmp_path / "doc")
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "doc/fps_table.md").read_text()
    lines = text.splitlines()
    assert (
        "| family (env, steps per run) | `baseline` | `compile` | `compile-cudagraphs` | `env-alone` "
        "| fastest vs baseline |"
    ) in lines
    assert "| atari (Breakout-v5, 2,048) | 60 | not run | not run | not run | 1.00x (`baseline`) |" in lines
    # the env alone is the ceiling, not the fastest configuration
    assert (
        "| classic (CartPole-v1, 1,000) | 200 | 500 | skipped: no CUDA device | 1,000 "
        "| 2.50x (`compile`), 50% of `env-alone` |"
    ) in lines
    assert "| atari | 3.0 ± 1.4 (n=2) | - | - | - |" in lines
    assert "| classic | 20.0 ± 10.0 (n=3) | 21.0 ± 10.0 (n=3) | - | - |" in lines
    assert "| `compile` | 3 | 500 (400-600) | 5.0 |" in text  # the detail rows start so; CartPole adds steps to 475
    assert "Test CPU (2 cores), GPU: none, torch 2.13.0+cpu" in text
    for png in ("fps.png", "returns_classic.png", "returns_atari.png"):
        assert (tmp_path / "doc" / png).stat().st_size > 0


def test_fps_report_caption(tmp_path):
    """doc/fps_table.md's caption, filled in by report.py itself: the checkout's commit and whether its tree is clean,
    the day the newest run finished, each machine the summaries name (CPU and cores, GPU, torch), and exactly the
    seeds of the runs, in numeric order."""
    runs = tmp_path / "runs"
    for seed in (3, 11):
        fake_run(runs / "classic/01-baseline" / str(seed), "CartPole-v1", 1000, 100, 10.0)
    fake_run(runs / "atari/01-baseline/7", "Breakout-v5", 2048, 50, 2.0)
    gpu_run = runs / "atari/03-compile/7"
    fake_run(gpu_run, "Breakout-v5", 2048, 80, 2.0)
    summary = json.loads((gpu_run / "summary.json").read_text())
    summary.update(cpu="Other CPU (16 cores)", gpu="NVIDIA H100 80GB HBM3", torch="2.13.0+cu126")
    (gpu_run / "summary.json").write_text(json.dumps(summary))
    day = time.mktime((2026, 1, 2, 12, 0, 0, 0, 0, -1))
    for path in runs.glob("*/*/*/summary.json"):
        os.utime(path, (day, day))
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    status = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, check=True)
    proc = report(runs, tmp_path / "doc")
    assert proc.returncode == 0, proc.stderr
    lines = (tmp_path / "doc/fps_table.md").read_text().splitlines()
    tree = "with uncommitted changes" if status.stdout.strip() else "clean tree"
    assert f"- commit: {head.stdout.strip()} ({tree}), the checkout that wrote this page" in lines
    assert "- sweep finished: 2026-01-02, the day of the newest run" in lines
    machines = "Other CPU (16 cores), GPU: NVIDIA H100 80GB HBM3, torch 2.13.0+cu126; "
    machines += "Test CPU (2 cores), GPU: none, torch 2.13.0+cpu"
    assert f"- machine: {machines}" in lines
    assert "- seeds: 3, 7, 11" in lines
    # the newest run decides the day
    (runs / "classic/01-baseline/3/summary.json").touch()
    assert report(runs, tmp_path / "doc2").returncode == 0
    newest = f"- sweep finished: {time.strftime('%Y-%m-%d')}, the day of the newest run"
    assert newest in (tmp_path / "doc2/fps_table.md").read_text().splitlines()


def test_report_shows_the_teacher_family(tmp_path):
    """run.sh's teacher family: its speed-up is against its own first configuration (the large network alone), and
    its detail table has the student's and the teacher's final returns."""
    runs = tmp_path / "runs"
    fake_run(runs / "classic/01-baseline/1", "CartPole-v1", 1000, 100, 10.0)
    fake_run(runs / "teacher/10-large-alone/1", "CartPole-v1", 1000, 200, 30.0)
    for seed, teacher_return in ((1, 40.0), (2, 60.0)):
        path = runs / "teacher/11-student-64x2" / str(seed)
        fake_run(path, "CartPole-v1", 1000, 500, 20.0)
        summary = json.loads((path / "summary.json").read_text())
        (path / "summary.json").write_text(json.dumps(dict(summary, teacher_return=teacher_return)))
    proc = report(runs, tmp_path / "doc")
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "doc/fps_table.md").read_text()
    assert "| teacher (CartPole-v1, 1,000) | not run | 200 | 500 | 2.50x (`student-64x2`) vs `large-alone` |" in text
    student = "| `student-64x2` | 2 | 500 (500-500) | - | - (0/2 reached) | - | 20.0 ± 0.0 (n=2) | 50.0 ± 14.1 (n=2) |"
    assert student in text
    assert "| `large-alone` | 1 | 200 (200-200) | - | - (0/1 reached) | - | 30.0 ± 0.0 (n=1) | - |" in text


def test_learning_report_on_synthetic_runs(tmp_path):
    """--learning: each configuration's final return beside the baseline's seeds, one verdict per configuration, the
    skipped families and configurations with their reasons, the caption, the returns plots; no fps table."""
    runs = tmp_path / "runs"
    finals = {
        "01-baseline": ("ppo", 400.0, 480.0),
        "03-compile": ("ppo_torchcompile", 450.0, 470.0),
        "06-quantized": ("ppo_quantized_torchcompile", 100.0, 130.0),
        "07-pruned": ("ppo_pruned_torchcompile", 490.0, 500.0),
    }
    for config, (script, *values) in finals.items():
        for seed, final in zip((1, 2), values):
            fake_run(runs / "classic" / config / str(seed), "CartPole-v1", 500000, 1000, final, script=script)
    (runs / "classic/08-ddp2").mkdir()
    (runs / "classic/08-ddp2/SKIPPED").write_text("one CPU core: no room for 2 ranks\n")
    fake_run(runs / "sac/01-baseline/1", "HalfCheetah-v4", 100000, 100, 2000.0, script="sac_continuous_action")
    # a run stopped early: its return counts, and its row says where it stopped
    fake_run(
        runs / "sac/03-compile/1", "HalfCheetah-v4", 100000, 300, 900.0, script="sac_continuous_action_torchcompile"
    )
    summary = json.loads((runs / "sac/03-compile/1/summary.json").read_text())
    summary.update(interrupted=True, global_step=40000)
    (runs / "sac/03-compile/1/summary.json").write_text(json.dumps(summary))
    for config in ("01-baseline", "03-compile"):
        (runs / "dqn_atari" / config).mkdir(parents=True)
        (runs / "dqn_atari" / config / "SKIPPED").write_text("needs a faster machine: 10M steps\n")
    proc = report(runs, tmp_path / "doc", "--learning")
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "doc/learning.md").read_text()
    lines = text.splitlines()
    assert (
        "| configuration | script | first logged return (mean) | final return (mean ± std) "
        "| each seed (seed: final return) | `baseline` (mean, min to max) | verdict |"
    ) in lines
    assert (
        "| `baseline` | `ppo` | 220.0 | 440.0 ± 56.6 (n=2) | 1: 400.0, 2: 480.0 | 440.0 (400.0 to 480.0) | reference |"
    ) in lines
    assert (
        "| `compile` | `ppo_torchcompile` | 230.0 | 460.0 ± 14.1 (n=2) | 1: 450.0, 2: 470.0 | 440.0 (400.0 to 480.0) "
        "| within the baseline's seed spread |"
    ) in lines
    assert (
        "| `quantized` | `ppo_quantized_torchcompile` | 57.5 | 115.0 ± 21.2 (n=2) | 1: 100.0, 2: 130.0 "
        "| 440.0 (400.0 to 480.0) | outside: below |"
    ) in lines
    assert "| 495.0 ± 7.1 (n=2) | 1: 490.0, 2: 500.0 | 440.0 (400.0 to 480.0) | outside: above |" in text
    assert "| `ddp2` | skipped: one CPU core: no room for 2 ranks | - | - | - | 440.0 (400.0 to 480.0) | - |" in lines
    assert "| 1: 900.0 (stopped at 40,000 steps) | 2000.0 (2000.0 to 2000.0) | outside: below |" in text
    assert "## classic: CartPole-v1, 500,000 steps per run" in lines
    assert "## sac: HalfCheetah-v4, 100,000 steps per run" in lines
    assert lines[lines.index("## dqn_atari") + 2] == "Not run: needs a faster machine: 10M steps."
    commit = next(ln for ln in lines if ln.startswith("- commit: "))
    assert re.fullmatch(r"- commit: [0-9a-f]{7,} \((clean tree|with uncommitted changes)\), .*", commit), commit
    assert "- machine: Test CPU (2 cores), GPU: none, torch 2.13.0+cpu" in lines
    assert "- seeds: 1, 2" in lines
    assert "- steps per run: classic 500,000; sac 100,000" in lines
    assert "- time: 2.5 h, the sum of the runs' wall times (run.sh runs them one after another)" in lines  # 10 runs
    assert "lies between the lowest and the highest final return of the baseline's seeds" in text
    for png in ("learning_classic.png", "learning_sac.png"):
        assert (tmp_path / "doc" / png).stat().st_size > 0
    assert not (tmp_path / "doc/learning_dqn_atari.png").exists()
    assert not (tmp_path / "doc/fps_table.md").exists()
    # the notes written by hand below the mark survive a new report; the tables are written anew
    mark = "<!-- written by hand from here on: report.py keeps what follows when it writes this page again -->"
    assert text.endswith(mark + "\n")
    (tmp_path / "doc/learning.md").write_text(text.replace("1: 900.0", "1: 0.0") + "\n## Findings\n\nBy hand.\n")
    assert report(runs, tmp_path / "doc", "--learning").returncode == 0
    again = (tmp_path / "doc/learning.md").read_text()
    assert again == text + "\n## Findings\n\nBy hand.\n"
    newest = datetime.date.today().isoformat()
    assert (
        f"Runs: Test CPU (2 cores), GPU: none, torch 2.13.0+cpu; 2.0 h of run time, the newest finished on {newest}; "
        "written on "
    ) in text  # classic
    # a later LEARN=1 run of one family rewrites its section and keeps the others' (with where their runs ran)
    fake_run(tmp_path / "more/atari/01-baseline/1", "Breakout-v5", 400000, 300, 12.0, script="ppo_atari_envpool")
    assert report(tmp_path / "more", tmp_path / "doc", "--learning").returncode == 0
    third = (tmp_path / "doc/learning.md").read_text()
    for family in ("classic", "dqn_atari", "sac"):
        section = next(b for b in text.split("\n## ") if b.startswith(family))
        assert "\n## " + section in third, family
    assert third.index("## atari: Breakout-v5, 400,000 steps per run") < third.index("## classic: ")
    assert "| `baseline` | `ppo_atari_envpool` | 6.0 | 12.0 ± 0.0 (n=1) | 1: 12.0 |" in third
    assert "- kept from the page before, with no runs under " in third
    assert ": classic, dqn_atari, sac (each section says where and when its runs ran)" in third
    assert "- steps per run: atari 400,000" in third.splitlines()
    assert third.endswith(mark + "\n\n## Findings\n\nBy hand.\n")


def test_a_seeds_run_reads_as_one_run_per_member(tmp_path):
    """A run of ppo_seeds_torchcompile.py (members in its summary and rows) is, in learning.md, one seed per member:
    its final return, its first logged return, its share of the wall time."""
    runs = tmp_path / "runs"
    fake_run(runs / "classic/01-baseline/1", "CartPole-v1", 500000, 1000, 400.0, script="ppo")
    run = runs / "classic/03-compile/1"
    fake_run(run, "CartPole-v1", 500000, 5000, 450.0, script="ppo_seeds_torchcompile")
    summary = json.loads((run / "summary.json").read_text())
    summary["members"] = [dict(seed=1, final_return=480.0), dict(seed=2, final_return=500.0)]
    (run / "summary.json").write_text(json.dumps(summary))
    rows = [
        dict(
            ROW, global_step=250000, episodic_return=5.0, members=[dict(episodic_return=4.0), dict(episodic_return=6.0)]
        ),
        dict(
            ROW,
            global_step=500000,
            episodic_return=490.0,
            members=[dict(episodic_return=480.0), dict(episodic_return=500.0)],
        ),
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert report(runs, tmp_path / "doc", "--learning").returncode == 0
    text = (tmp_path / "doc/learning.md").read_text()
    assert (
        "| `compile` | `ppo_seeds_torchcompile` | 5.0 | 490.0 ± 14.1 (n=2) | 1: 480.0, 2: 500.0 "
        "| 400.0 (400.0 to 400.0) | outside: above |"
    ) in text
    # the baseline's 900 s, and the 900 s that the members share
    assert "- time: 30 min, the sum of the runs' wall times" in text


def test_learning_report_dates_and_commit(tmp_path, monkeypatch):
    """Each section says the day its family's newest run finished, and every section names the commit the header
    names, asked before the plots are written (into the checkout's doc/, they would make the tree look changed)."""
    monkeypatch.syspath_prepend(ROOT / "leanrl" / "tools")
    import report as report_module

    runs = tmp_path / "runs"
    out = tmp_path / "doc"
    for family, day in (("classic", datetime.date(2026, 1, 2)), ("sac", datetime.date(2026, 3, 4))):
        for seed in (1, 2):
            fake_run(runs / family / "01-baseline" / str(seed), "CartPole-v1", 1000, 100, 10.0 * seed)
            moment = time.mktime((day - datetime.timedelta(days=2 - seed)).timetuple()) + 3600
            os.utime(runs / family / "01-baseline" / str(seed) / "summary.json", (moment, moment))

    def git_status():
        # what `git status` would say of a checkout whose doc/ the report writes into
        return "abc1234 (with uncommitted changes)" if any(out.glob("*.png")) else "abc1234 (clean tree)"

    monkeypatch.setattr(report_module, "commit", git_status)
    out.mkdir()
    report_module.learning_report(report_module.Args(runs=runs, out=out, learning=True), report_module.load(runs))
    text = (out / "learning.md").read_text()
    assert "- commit: abc1234 (clean tree), the checkout that wrote this page" in text.splitlines()
    assert "with uncommitted changes" not in text
    assert "of run time, the newest finished on 2026-01-02; written on " in text.split("## sac")[0]
    assert "of run time, the newest finished on 2026-03-04; written on " in text.split("## sac")[1]


def dry_run(tmp_path, *families, **env):
    """run.sh's DRY=1 lines: {family/configuration: [command, ...]} and the other lines (skips, the report)."""
    env = dict(os.environ, DRY="1", OUT=str(tmp_path / "runs"), **env)
    proc = run_command(["bash", "run.sh", *families], tmp_path / "dry", timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    runs = {}
    other = []
    for line in proc.stdout.splitlines():
        key, _, command = line.partition(": ")
        if line.startswith(("skip ", "python leanrl/tools/report.py")):
            other.append(line)
        else:
            runs.setdefault(key, []).append(command)
    return runs, other


def flag(command: str, name: str) -> str:
    words = command.split()
    return words[words.index(name) + 1]


def test_run_sh_learn_budgets(tmp_path):
    """LEARN=1 DRY=1: each family's learning budget, the baseline, --compile and the family's variants, both seeds;
    dqn_atari skipped with the budget that would show it; nothing run or written. A finished run is not repeated,
    one stopped early is. CartPole's and HalfCheetah's --compile runs are one run of their seeds script, the seeds its
    members, where the seeds follow each other (about 1.7-2.1x faster than a run per seed in turn: doc/seeds.md)."""
    runs, other = dry_run(tmp_path, LEARN="1")
    steps = {"classic": 500000, "atari": 400000, "mujoco": 200000, "sac": 100000, "td3": 100000, "dqn": 500000}
    ddp = ["08-ddp2"] if plumbing.cores() >= 2 else []
    variants = ["06-quantized", "07-pruned"] + ddp + ["10-compile-async"]
    bf16 = ["05-bf16"] if torch.ops.mkldnn._is_mkldnn_bf16_supported() or torch.cuda.is_available() else []
    expected = {
        family: ["01-baseline", "03-compile"]
        + (variants if family in ("classic", "atari") else [])
        + (bf16 if family in ("sac", "td3") else [])
        for family in steps
    }
    assert sorted(runs) == sorted(f"{family}/{config}" for family, configs in expected.items() for config in configs)
    members = {"classic/03-compile": "ppo_seeds_torchcompile.py", "mujoco/03-compile": "ppo_continuous_action_seeds"}
    for key, script in members.items():
        (command,) = runs.pop(key)
        assert command.startswith(f"python leanrl/{script}"), command
        assert flag(command, "--seed") == "1" and flag(command, "--num-seeds") == "2", command
        assert flag(command, "--total-timesteps") == str(steps[key.split("/")[0]]), command
        assert flag(command, "--log-dir") == str(tmp_path / "runs" / key / "1") and "--compile" in command
    for key, commands in runs.items():
        family = key.split("/")[0]
        assert [flag(c, "--seed") for c in commands] == ["1", "2"], key
        for command in commands:
            assert flag(command, "--total-timesteps") == str(steps[family]), command
            assert flag(command, "--log-dir") == str(tmp_path / "runs" / key / flag(command, "--seed"))
            # the scripts' own learning_starts and pruning schedule; every contender compiled
            assert "--learning-starts" not in command and "--prune-start" not in command, command
            assert ("--compile" in command) == (not key.endswith("01-baseline")), command
    if ddp:  # on one core (taskset) run.sh skips ddp2: no room for its 2 ranks
        assert runs["classic/08-ddp2"][0].startswith("python -m torch.distributed.run --standalone --nproc-per-node 2 ")
    assert runs["atari/07-pruned"][0].startswith("python leanrl/ppo_atari_envpool_pruned_torchcompile.py --compile ")
    assert runs["classic/10-compile-async"][0].startswith(
        "python leanrl/ppo_compile_async_torchcompile.py --compile --compile-async "
    )
    if bf16:
        for family in ("sac", "td3"):
            script = f"{family}_continuous_action_torchcompile.py"
            assert runs[f"{family}/05-bf16"][0].startswith(f"python leanrl/{script} --compile --bf16 ")
    skips = [line for line in other if line.startswith("skip dqn_atari/")]
    assert [line.split(":")[0] for line in skips] == ["skip dqn_atari/01-baseline", "skip dqn_atari/03-compile"]
    assert "needs a faster machine" in skips[0] and "10M steps (learning from step 80k)" in skips[0]
    assert other[-1] == f"python leanrl/tools/report.py {tmp_path / 'runs'} --out doc --learning"
    assert not (tmp_path / "runs").exists()

    done = tmp_path / "runs/sac/01-baseline/1"
    fake_run(done, "HalfCheetah-v4", 100000, 100, 2000.0)
    fake_run(tmp_path / "runs/sac/03-compile/1", "HalfCheetah-v4", 100000, 100, 2000.0)
    summary = json.loads((tmp_path / "runs/sac/03-compile/1/summary.json").read_text())
    (tmp_path / "runs/sac/03-compile/1/summary.json").write_text(json.dumps(dict(summary, interrupted=True), indent=2))
    runs, _ = dry_run(tmp_path, "sac", LEARN="1", SEEDS="1 2 3")
    assert [flag(c, "--seed") for c in runs["sac/01-baseline"]] == ["2", "3"]
    assert [flag(c, "--seed") for c in runs["sac/03-compile"]] == ["1", "2", "3"]
    # seeds that do not follow each other: one run per seed, as before
    runs, _ = dry_run(tmp_path, "classic", LEARN="1", SEEDS="1 3")
    assert [flag(c, "--seed") for c in runs["classic/03-compile"]] == ["1", "3"]
    assert all(c.startswith("python leanrl/ppo_torchcompile.py --compile ") for c in runs["classic/03-compile"])
    runs, other = dry_run(tmp_path, "dqn_atari", LEARN="1", DQN_ATARI_STEPS="10000000")
    assert flag(runs["dqn_atari/03-compile"][0], "--total-timesteps") == "10000000" and not other[:-1]


def test_run_sh_default_sweep_unchanged(tmp_path):
    """DRY=1 without LEARN: the fps sweep's configurations and short budgets, as before."""
    runs, _ = dry_run(tmp_path, "classic", "sac", SEEDS="21")
    assert "classic/02-eager" in runs and "classic/09-env-alone" in runs
    assert "classic/10-compile-async" not in runs
    assert "--prune-start 1" in runs["classic/07-pruned"][0]
    assert flag(runs["classic/01-baseline"][0], "--total-timesteps") == "200000"
    assert flag(runs["sac/03-compile"][0], "--learning-starts") == "5000"
    bad = run_command(["bash", "run.sh"], tmp_path / "bad", timeout=60, env=dict(os.environ, LEARN="1", SMOKE="1"))
    assert_user_error(bad, "different sweeps")


def test_run_sh_default_sweep_runs_the_seeds_programs(tmp_path):
    """DRY=1: the fps sweep runs CartPole's and HalfCheetah's seeds scripts, 4 agents with --compile per sweep seed, at
    the family's budget; Breakout's keeps to single runs (its seeds script is slower than them on a CPU,
    doc/seeds.md)."""
    runs, _ = dry_run(tmp_path, "classic", "mujoco", "atari", SEEDS="21 31")
    for family, script in (
        ("classic", "ppo_seeds_torchcompile.py"),
        ("mujoco", "ppo_continuous_action_seeds_torchcompile.py"),
    ):
        commands = runs[f"{family}/11-compile-4-seeds"]
        assert [flag(c, "--seed") for c in commands] == ["21", "31"], commands
        for command in commands:
            assert command.startswith(f"python leanrl/{script} --compile"), command
            assert flag(command, "--num-seeds") == "4", command
            assert flag(command, "--total-timesteps") == flag(runs[f"{family}/01-baseline"][0], "--total-timesteps")
    assert not [key for key in runs if key.startswith("atari/") and key.endswith("-seeds")]


def test_report_bad_input(tmp_path):
    assert_user_error(report(tmp_path / "missing", tmp_path / "doc"), "not a folder")
    assert_user_error(report(tmp_path, tmp_path / "doc"), "no finished runs")


# about 30 runs one after the other: 4 minutes on 2 idle cores, 18 in CI beside the other worker's compiles, near the
# 20 minutes pytest.ini gives a test
@pytest.mark.timeout(2400)
def test_run_sh_smoke(tmp_path):
    """SMOKE=1: every script of every family once with the tiny budget, then the table; a re-run repeats nothing."""
    env = dict(os.environ, SMOKE="1", OUT=str(tmp_path / "runs"), PYTHONWARNINGS="ignore")
    first = run_command(["bash", "run.sh"], tmp_path / "first", timeout=2000, env=env)
    assert first.returncode == 0, first.stderr[-4000:]
    text = (tmp_path / "runs/doc/fps_table.md").read_text()
    for family, env_id, steps in (
        ("classic", "CartPole-v1", 256),
        ("atari", "Breakout-v5", 256),
        ("mujoco", "HalfCheetah-v4", 256),
        ("sac", "HalfCheetah-v4", 600),
        ("td3", "HalfCheetah-v4", 600),
        ("dqn", "CartPole-v1", 600),
        ("dqn_atari", "Breakout-v5", 600),
    ):
        row = next(ln for ln in text.splitlines() if ln.startswith(f"| {family} ({env_id}, {steps}) |"))
        assert "x (`" in row  # a measured speed-up: the baseline ran
    assert "skipped: no CUDA device" in text
    again = run_command(["bash", "run.sh"], tmp_path / "again", timeout=300, env=env)
    assert again.returncode == 0 and "seed" not in again.stderr, again.stderr
    bad = run_command(["bash", "run.sh", "nosuchfamily"], tmp_path / "bad", timeout=60, env=env)
    assert_user_error(bad, "unknown family")


def test_a_damaged_run_is_skipped_with_a_warning_that_names_it(tmp_path):
    """One run of a sweep damaged in each way a stopped or full machine leaves one: a half-written last metrics line, no
    metrics.jsonl, a summary that is not JSON, a summary without the fields the table reads. Each is left out with a
    line naming its folder, and the table is the one the sound runs give."""
    runs = tmp_path / "runs"
    for seed, fps in ((1, 100), (2, 300)):
        fake_run(runs / "classic/01-baseline" / str(seed), "CartPole-v1", 1000, fps, 10.0)
    damaged = {}
    for seed in (3, 4, 5, 6):
        damaged[seed] = runs / "classic/01-baseline" / str(seed)
        fake_run(damaged[seed], "CartPole-v1", 1000, 10_000, 99.0)
    with open(damaged[3] / "metrics.jsonl", "a") as f:
        f.write('{"global_step": 1')
    (damaged[4] / "metrics.jsonl").unlink()
    (damaged[5] / "summary.json").write_text('{"script": "ppo", "fps": ')
    (damaged[6] / "summary.json").write_text(json.dumps({"script": "ppo", "seed": 6}))
    proc = report(runs, tmp_path / "doc")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 4, proc.stderr
    for seed, line in zip((3, 4, 5, 6), warnings):
        assert str(damaged[seed]) in line, line
    lines = (tmp_path / "doc/fps_table.md").read_text().splitlines()
    assert "| classic (CartPole-v1, 1,000) | 200 | 1.00x (`baseline`) |" in lines  # the median of 100 and 300


def test_an_unwritable_out_is_refused_before_reading_the_runs(tmp_path):
    """Checked first: an empty runs folder (refused too, but after) and an --out under a file name --out."""
    runs = tmp_path / "runs"
    runs.mkdir()
    (tmp_path / "a_file").write_text("")
    assert_user_error(report(runs, tmp_path / "a_file" / "doc"), "--out", "a_file")


# CleanRL's published CartPole figure (report.py's CLEANRL table): within its mean ± 2 std is 477.80 to 502.28
CARTPOLE_MEAN = 490.04


@pytest.fixture
def report_module(monkeypatch):
    monkeypatch.syspath_prepend(ROOT / "leanrl" / "tools")
    import report as report_module

    # the page's 10,000 resamples take seconds a bootstrap on CI's 2 cores; the intervals asserted hold at 1,000
    monkeypatch.setattr(report_module, "BOOTSTRAP_REPS", 1000)
    return report_module


def write_rows(path, rows):
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def update_summary(path, **fields):
    summary = json.loads((path / "summary.json").read_text())
    (path / "summary.json").write_text(json.dumps(dict(summary, **fields)))


# a run stopped twice and resumed: each process logs `time` from its own start (10, 20, 30 | 4, 14 | 3, 13)
RESUMED = [
    (1000, 10.0, 100.0),
    (2000, 20.0, 300.0),
    (3000, 30.0, 400.0),
    (4000, 4.0, 480.0),
    (5000, 14.0, 495.0),
    (6000, 3.0, 500.0),
    (7000, 13.0, 500.0),
]


def test_cleanrl_time_to_score_adds_up_a_resumed_run(report_module):
    """The wall time to CleanRL's mean counts every segment of a resumed run (30 s, then 14 s into the second), at the
    env step of the first logged return at or above it; a run that never gets there has not reached it."""
    rows = [dict(global_step=step, time=t, episodic_return=r) for step, t, r in RESUMED]
    assert report_module.time_to_score(rows, CARTPOLE_MEAN) == (5000, 44.0)
    assert report_module.time_to_score(rows, 400.0) == (3000, 30.0)
    assert report_module.time_to_score(rows, 500.01) == (None, None)
    assert report_module.elapsed(rows) == 30.0 + 14.0 + 13.0


def test_cleanrl_a_seeds_run_is_one_run_per_member_on_the_program_clock(tmp_path, report_module):
    """A seeds-script run (CLEANRL=1's --compile of classic and mujoco) is one row of the table per member; each
    member's time to CleanRL's score is the whole program's wall time (they train together), and a footnote says so."""
    runs = tmp_path / "runs"
    run = runs / "classic/03-compile/1"
    fake_run(run, "CartPole-v1", 500000, 5000, 495.0, script="ppo_seeds_torchcompile")
    update_summary(run, members=[dict(seed=1, final_return=495.0), dict(seed=2, final_return=300.0)])
    rows = [
        dict(
            ROW,
            global_step=step,
            time=t,
            episodic_return=r,
            members=[{"episodic_return": r}, {"episodic_return": 0.5 * r}],
        )
        for step, t, r in RESUMED
    ]
    write_rows(run, rows)
    (compile_config,) = report_module.load(runs)["classic"].values()
    assert [s["seed"] for s, _ in compile_config.runs] == [1, 2]
    (_, first), (_, second) = compile_config.runs
    assert report_module.time_to_score(first, CARTPOLE_MEAN) == (5000, 44.0)
    assert report_module.time_to_score(second, 245.0) == (5000, 44.0)  # half the returns: the same row
    out = tmp_path / "doc"
    report_module.record_runs(runs, out / report_module.RECORD)
    data = report_module.load(out / report_module.RECORD)
    report_module.cleanrl_report(report_module.Args(runs=runs, out=out, cleanrl=True), data)
    text = (out / "learning_cleanrl.md").read_text()
    assert "| 1: 0.7 min at 5,000 steps†, 2: not reached |" in text
    assert (
        "† ppo_seeds_torchcompile trains its seeds together in one program: a seed's wall time is the program's."
        in text
    )


def test_iqm_is_the_middle_half_mean(report_module):
    """The interquartile mean drops the lowest and highest quarter of the runs (scipy's trim_mean rounds the quarter
    down): 8 runs keep the middle 4, 5 runs the middle 3, and 3 runs all of them, so CleanRL's published mean over its
    3 seeds is its IQM."""
    assert report_module.iqm_ci([8.0, 1.0, 7.0, 2.0, 6.0, 3.0, 5.0, 4.0])[0] == (3 + 4 + 5 + 6) / 4
    assert report_module.iqm_ci([100.0, 1.0, 2.0, 3.0, 4.0])[0] == (2 + 3 + 4) / 3
    assert report_module.iqm_ci([1.0, 2.0, 30.0])[0] == 11.0


def test_iqm_ci_is_rliables_stratified_bootstrap(report_module):
    """The interval is rliable's percentile stratified bootstrap of the IQM over the runs (one task), 95%, seeded: a
    page written twice reads the same. rliable draws from numpy's global generator (it ignores its random_state), which
    the report seeds and then puts back as it was."""
    from rliable import library, metrics

    finals = [1442.9, 1521.6, 2789.3, 3322.1, 3883.1, 1341.8, 3807.6]
    np.random.seed(0)
    _, interval = library.get_interval_estimates(
        {"runs": np.array(finals)[:, None]},
        lambda scores: np.array([metrics.aggregate_iqm(scores)]),
        reps=report_module.BOOTSTRAP_REPS,
    )
    (low,), (high,) = interval["runs"]
    np.random.seed(5)
    expected_draw = np.random.rand()
    np.random.seed(5)
    assert report_module.iqm_ci(finals) == (metrics.aggregate_iqm(np.array(finals)), low, high)
    assert np.random.rand() == expected_draw
    report_module.bootstrap_iqm.cache_clear()
    assert report_module.iqm_ci(finals) == (metrics.aggregate_iqm(np.array(finals)), low, high)


def test_cleanrl_verdict_by_intervals(report_module):
    """Against our runs of CleanRL's file at the same budget: `above` or `below` where the two 95% CIs of the
    IQM are apart, `no difference shown` where they overlap (touching ends included); no verdict with fewer than 3
    finished runs on either side, against a published figure alone (no per-seed values), or against a figure at
    another budget; no finished run, no verdict."""
    published = report_module.Published("ppo.py", "CartPole-v1", 1000, 100.0, 10.0, None)
    verdict = report_module.cleanrl_verdict
    assert verdict([5.0] * 3, [4.0] * 3, published, 1000) == "above: the CIs are apart"
    assert verdict([4.0] * 3, [5.0] * 4, published, 1000) == "below: the CIs are apart"
    assert verdict([5.0] * 3, [5.0] * 3, published, 1000) == "no difference shown: the CIs overlap"
    # [3, 4, 5]'s CI reaches 5: all three resampled as 5 is 1 draw in 27, more than the 2.5% cut
    assert report_module.iqm_ci([3.0, 4.0, 5.0])[2] == 5.0
    assert verdict([5.0] * 3, [3.0, 4.0, 5.0], published, 1000) == "no difference shown: the CIs overlap"
    assert verdict([5.0] * 2, [4.0] * 3, published, 1000) == "no verdict: 2 finished runs, 3 needed"
    assert verdict([5.0] * 3, [4.0] * 2, published, 1000) == ("no verdict: 2 finished runs of CleanRL's file, 3 needed")
    assert verdict([500.0] * 5, None, published, 1000) == "no verdict: CleanRL publishes no per-seed values"
    assert verdict([50.0] * 5, None, published, 500) == (
        "no verdict: CleanRL's figure is at 1,000 steps, ours at 500, and no run of CleanRL's file at 500"
    )
    assert verdict([], [4.0] * 3, published, 1000) == "no finished run yet"


def test_cleanrl_mean_against_a_rows_interval(report_module):
    """Where CleanRL's published mean (its 3 seeds' IQM) lies against a row's CI: a fact beside the verdict, shown from
    3 finished runs on and only at CleanRL's budget."""
    published = report_module.Published("ppo.py", "CartPole-v1", 1000, 100.0, 10.0, None)
    where = report_module.against_ci
    assert where([100.0] * 3, published, 1000) == "inside"
    assert where([99.0, 101.0, 100.0], published, 1000) == "inside"
    assert where([101.0] * 3, published, 1000) == "below it"
    assert where([99.0] * 3, published, 1000) == "above it"
    assert where([101.0] * 2, published, 1000) == "-"
    assert where([101.0] * 3, published, 500) == "-"


def test_cleanrl_a_run_in_progress_is_left_out_of_the_verdict(tmp_path, report_module):
    """A run stopped before its budget (SIGTERM: summary.json with interrupted) shows where it is, and only the
    finished runs count: seeds 1-3 give an IQM of 496 over 3 runs, seed 4's 10 would have made it 495.5 over 4."""
    runs = tmp_path / "runs"
    for seed, final in ((1, 495.0), (2, 496.0), (3, 497.0), (4, 10.0)):
        fake_run(runs / "classic/01-baseline" / str(seed), "CartPole-v1", 500000, 1000, final)
    update_summary(runs / "classic/01-baseline/4", interrupted=True, global_step=40960)
    fake_run(runs / "td3/03-compile/1", "HalfCheetah-v4", 1000000, 100, 2000.0, script="td3_continuous_action")
    update_summary(runs / "td3/03-compile/1", interrupted=True, global_step=250000)
    data = report_module.load(runs)
    table = report_module.cleanrl_table(data["classic"], report_module.CLEANRL["classic"])
    row = next(line for line in table if line.startswith("| `baseline` |"))
    assert (
        "| 496.0 [495.0, 497.0] (n=3) | 1: 495.0, 2: 496.0, 3: 497.0, 4: in progress at step 40,960 | 490.04 ± 6.12 "
        "| below it | no verdict: CleanRL publishes no per-seed values |"
    ) in row
    (row,) = [
        line for line in report_module.cleanrl_table(data["td3"], report_module.CLEANRL["td3"]) if "`compile`" in line
    ]
    assert "| - | 1: in progress at step 250,000 | 9583.22 ± 126.09 | - | no finished run yet |" in row


def test_cleanrl_page_and_plots(tmp_path, report_module, monkeypatch, capsys):
    """--cleanrl writes learning_cleanrl.md (header, the rule, a section per family) and cleanrl_<family>.png, and
    prints the README's lines; a family run at less than CleanRL's budget says its verdict is a lower bound."""
    runs = tmp_path / "runs"
    out = tmp_path / "doc"
    for seed, final in ((1, 480.0), (2, 500.0)):
        fake_run(runs / "classic/01-baseline" / str(seed), "CartPole-v1", 500000, 1000, final)
        fake_run(runs / "classic/03-compile" / str(seed), "CartPole-v1", 500000, 3000, final, script="ppo_torchcompile")
    fake_run(runs / "atari/03-compile/1", "Breakout-v5", 2000000, 300, 50.0, script="ppo_atari_envpool_torchcompile")
    monkeypatch.setattr(sys, "argv", ["report.py", str(runs), "--out", str(out), "--cleanrl"])
    report_module.main()
    text = (out / "learning_cleanrl.md").read_text()
    lines = text.splitlines()
    assert lines[0] == "# Learning at CleanRL's budgets, beside CleanRL's published results"
    assert "- machines: Test CPU (2 cores), GPU: none, torch 2.13.0+cpu" in lines
    assert "- seeds: 1, 2" in lines
    assert "- steps per run: classic 500,000 (CleanRL's 500,000); atari 2,000,000 (CleanRL's 10,000,000)" in lines
    assert "interquartile mean (IQM)" in text and "where the two 95% CIs are apart" in text
    assert "## classic: CartPole-v1 (CleanRL's ppo.py)" in lines
    assert "## atari: Breakout-v5 (CleanRL's ppo_atari_envpool.py)" in lines
    assert (
        "| 490.0 (n=2) | 1: 480.0, 2: 500.0 | 490.04 ± 6.12 | - | no verdict: CleanRL publishes no per-seed values |"
        in text
    )
    assert (
        "| 50.0 (n=1) | 1: 50.0 | 211.24 ± 151.84 | - | no verdict: CleanRL's figure is at 10,000,000 steps, ours at "
        "2,000,000, and no run of CleanRL's file at 2,000,000 |"
    ) in text
    assert "CleanRL's 10,000,000-step figure cannot judge them" in text
    for png in ("cleanrl_classic.png", "cleanrl_atari.png"):
        assert (out / png).stat().st_size > 0
    printed = capsys.readouterr().out
    assert "| family | CleanRL | ours (compile) | ours (baseline) | time to CleanRL's score |" in printed
    assert "| classic (CartPole-v1, 500k) | 490.04 ± 6.12 | 490.0 (2), no verdict | 490.0 (2), no verdict |" in printed
    assert "| atari (Breakout-v5, 2M of CleanRL's 10M) | 211.24 ± 151.84 |" in printed
    # the two pages are different reports of different sweeps
    monkeypatch.setattr(sys, "argv", ["report.py", str(runs), "--out", str(out), "--cleanrl", "--learning"])
    with pytest.raises(SystemExit) as stopped:
        report_module.main()
    assert stopped.value.code == 2


def reference_run(path, final):
    """A run of CleanRL's own file as leanrl/tools/cleanrl_reference.py records it."""
    fake_run(path, "HalfCheetah-v4", 1000000, 600, final, script="cleanrl/ppo_continuous_action.py")
    update_summary(path, gymnasium="1.4.0", mujoco="2.3.3")


def test_our_runs_of_cleanrls_file_are_the_reference(tmp_path, report_module, monkeypatch, capsys):
    """Our runs of CleanRL's own file at the same budget (its runs' script `cleanrl/...`) is a row of its own,
    the reference of the family's verdicts; its versions are named; the README's lines give it a column."""
    runs = tmp_path / "runs"
    out = tmp_path / "doc"
    for seed, final in ((1, 1400.0), (2, 1450.0), (3, 1500.0)):
        reference_run(runs / "mujoco/00-cleanrl-file" / str(seed), final)
    for seed, final in ((1, 3000.0), (2, 3100.0), (3, 3200.0)):
        fake_run(runs / "mujoco/01-baseline" / str(seed), "HalfCheetah-v4", 1000000, 1000, final)
    for seed, final in ((1, 1420.0), (2, 3800.0), (3, 1460.0)):
        fake_run(runs / "mujoco/03-compile" / str(seed), "HalfCheetah-v4", 1000000, 3000, final)
    monkeypatch.setattr(sys, "argv", ["report.py", str(runs), "--out", str(out), "--cleanrl"])
    report_module.main()
    text = (out / "learning_cleanrl.md").read_text()
    assert (
        "| CleanRL's file, our run | `cleanrl/ppo_continuous_action.py` | 1450.0 [1400.0, 1500.0] (n=3) "
        "| 1: 1400.0, 2: 1450.0, 3: 1500.0 | 1442.64 ± 46.03 | inside | the reference |"
    ) in text
    assert "| 3100.0 [3000.0, 3200.0] (n=3) | 1: 3000.0, 2: 3100.0, 3: 3200.0 | 1442.64 ± 46.03 | below it " in text
    assert "| below it | above: the CIs are apart |" in text
    assert "| no difference shown: the CIs overlap |" in text  # --compile: 1420 to 3800
    assert "on Test CPU (2 cores), gymnasium 1.4.0, MuJoCo 2.3.3, torch 2.13.0+cpu; ours on envpool." in text
    printed = capsys.readouterr().out
    assert (
        "| mujoco (HalfCheetah-v4, 1M) | 1442.64 ± 46.03; its file, our run: 1450.0 [1400.0, 1500.0] (3) "
        "| 2226.7 [1420.0, 3800.0] (3), no difference shown | 3100.0 [3000.0, 3200.0] (3), above |"
    ) in printed


def test_reference_runs_on_two_machines_name_both(tmp_path, report_module, monkeypatch):
    """CleanRL's file's seeds ran on two machines: the page names each machine with its seeds, not the first
    run's machine for all of them."""
    runs = tmp_path / "runs"
    for seed, final in ((1, 1400.0), (2, 1450.0), (3, 1500.0)):
        reference_run(runs / "mujoco/00-cleanrl-file" / str(seed), final)
    update_summary(runs / "mujoco/00-cleanrl-file/3", cpu="Other CPU (2 cores)")
    for seed, final in ((1, 3000.0), (2, 3100.0), (3, 3200.0)):
        fake_run(runs / "mujoco/01-baseline" / str(seed), "HalfCheetah-v4", 1000000, 1000, final)
    monkeypatch.setattr(sys, "argv", ["report.py", str(runs), "--out", str(tmp_path / "doc"), "--cleanrl"])
    report_module.main()
    text = (tmp_path / "doc" / "learning_cleanrl.md").read_text()
    versions = "gymnasium 1.4.0, MuJoCo 2.3.3, torch 2.13.0+cpu"
    assert f"on Test CPU (2 cores), {versions} (seeds 1, 2); Other CPU (2 cores), {versions} (seed 3); ours" in text


def test_cleanrl_plot_shows_every_runs_final_return(tmp_path, report_module):
    """A two-mode outcome is not averaged away: the plot has a point per finished run at its final return, beside its
    row's IQM and CI; CleanRL's published figure is drawn as mean ± std, with no per-seed points made up."""
    runs = tmp_path / "runs"
    finals = {"01-baseline": [1400.0, 3300.0, 1500.0, 3800.0], "03-compile": [1450.0, 2900.0, 1420.0]}
    for config, values in finals.items():
        for seed, final in enumerate(values, 1):
            fake_run(runs / "mujoco" / config / str(seed), "HalfCheetah-v4", 1000000, 1000, final)
    configs = report_module.load(runs)["mujoco"]
    fig = report_module.cleanrl_figure("mujoco", configs, report_module.CLEANRL["mujoco"])
    strip = fig.axes[1]
    dots = [c for c in strip.collections if isinstance(c, matplotlib.collections.PathCollection)]
    points = sorted(y for collection in dots for _, y in collection.get_offsets())
    assert points == sorted(v for values in finals.values() for v in values)
    labels = [text.get_text() for text in strip.get_legend().get_texts()]
    assert any("mean ± std of 3 seeds, no per-seed values published" in label for label in labels), labels


def test_fastest_column_compares_the_same_agent(tmp_path):
    """`pruned` trains a smaller network, another agent: the fastest column names the fastest configuration that
    trains the baseline's agent, and shows `pruned` apart, as a smaller network (issue 51: it credited `pruned`)."""
    runs = tmp_path / "runs"
    fake_run(runs / "classic/01-baseline/1", "CartPole-v1", 1000, 100, 10.0)
    fake_run(runs / "classic/03-compile/1", "CartPole-v1", 1000, 300, 10.0)
    fake_run(runs / "classic/07-pruned/1", "CartPole-v1", 1000, 400, 10.0)
    fake_run(runs / "classic/09-env-alone/1", "CartPole-v1", 1000, 1000, None)
    proc = report(runs, tmp_path / "doc")
    assert proc.returncode == 0, proc.stderr
    row = next(ln for ln in (tmp_path / "doc/fps_table.md").read_text().splitlines() if ln.startswith("| classic"))
    assert row.endswith("| 3.00x (`compile`), 30% of `env-alone`; `pruned` (a smaller network) 4.00x |"), row


def test_a_seeds_program_counts_all_its_agents_steps_and_stands_apart(tmp_path):
    """The sweep's seeds configuration trains 4 agents in one program: its fps is the steps of all of them per second
    (summary.json's fps_all_seeds; its fps is one member's), and it trains several agents, not the baseline's one
    faster, so the fastest column shows it apart, as `pruned` is (issue 52)."""
    runs = tmp_path / "runs"
    fake_run(runs / "classic/01-baseline/1", "CartPole-v1", 1000, 100, 10.0)
    fake_run(runs / "classic/03-compile/1", "CartPole-v1", 1000, 300, 10.0)
    program = runs / "classic/11-compile-4-seeds/1"
    fake_run(program, "CartPole-v1", 1000, 150, 10.0)
    summary = json.loads((program / "summary.json").read_text())
    members = [{"seed": 1 + k, "final_return": 10.0 + k} for k in range(4)]
    summary.update(members=members, num_seeds=4, fps_all_seeds=600)
    (program / "summary.json").write_text(json.dumps(summary))
    rows = [
        dict(ROW, global_step=1000, episodic_return=11.5, members=[{"episodic_return": 10.0 + k} for k in range(4)])
    ]
    (program / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = report(runs, tmp_path / "doc")
    assert proc.returncode == 0, proc.stderr
    row = next(ln for ln in (tmp_path / "doc/fps_table.md").read_text().splitlines() if ln.startswith("| classic"))
    assert row == (
        "| classic (CartPole-v1, 1,000) | 100 | 300 | 600 "
        "| 3.00x (`compile`); `compile-4-seeds` (all its agents' steps) 6.00x |"
    ), row


def test_fps_page_keeps_its_hand_written_notes(tmp_path, report_module):
    """What is written by hand below the mark on fps_table.md (an A/B of two commits that explains a moved figure)
    survives the next sweep's report, as the learning pages' notes do."""
    runs = tmp_path / "runs"
    fake_run(runs / "classic/01-baseline/1", "CartPole-v1", 1000, 100, 10.0)
    assert report(runs, tmp_path / "doc").returncode == 0
    page = tmp_path / "doc/fps_table.md"
    page.write_text(page.read_text() + "\nthe old commit ran as fast on this machine\n")
    fake_run(runs / "classic/03-compile/1", "CartPole-v1", 1000, 300, 10.0)
    proc = report(runs, tmp_path / "doc")
    assert proc.returncode == 0, proc.stderr
    text = page.read_text()
    assert "| `compile` | 1 | 300 (300-300) |" in text
    assert text.count(report_module.NOTES_MARK) == 1
    assert text.endswith("\nthe old commit ran as fast on this machine\n")


def test_cleanrl_page_keeps_its_hand_written_notes(tmp_path, report_module, monkeypatch, capsys):
    """What is written by hand below the mark (why a family is outside, where runs stand) survives the next
    `CLEANRL=1` report, as learning.md's notes do."""
    runs = tmp_path / "runs"
    out = tmp_path / "doc"
    fake_run(runs / "classic/01-baseline/1", "CartPole-v1", 500000, 1000, 490.0)
    monkeypatch.setattr(sys, "argv", ["report.py", str(runs), "--out", str(out), "--cleanrl"])
    report_module.main()
    page = out / "learning_cleanrl.md"
    page.write_text(page.read_text() + "\nseed 3 found a faster gait\n")
    report_module.main()
    text = page.read_text()
    assert text.count(report_module.NOTES_MARK) == 1
    assert text.endswith("\nseed 3 found a faster gait\n")


def test_cleanrl_runs_outlast_the_machine_they_ran_on(tmp_path, report_module, monkeypatch, capsys):
    """A sitting's machine and its run folders do not last (the last session lost /work/runs): the page's runs are
    recorded beside it (doc/cleanrl_runs, committed with it), so a later sitting's report, from a new OUT, shows the
    earlier runs beside its own, with their time to CleanRL's score; a family in neither keeps its section."""
    out = tmp_path / "doc"
    first = tmp_path / "sitting1"
    fake_run(first / "classic/01-baseline/1", "CartPole-v1", 500000, 1000, 495.0)
    write_rows(first / "classic/01-baseline/1", [dict(global_step=s, time=t, episodic_return=r) for s, t, r in RESUMED])
    monkeypatch.setattr(sys, "argv", ["report.py", str(first), "--out", str(out), "--cleanrl"])
    report_module.main()
    page = out / "learning_cleanrl.md"
    page.write_text(
        page.read_text().replace("## classic:", "## dqn: CartPole-v1 (by an earlier page)\n\nkept\n\n## classic:")
    )
    second = tmp_path / "sitting2"
    fake_run(second / "classic/01-baseline/2", "CartPole-v1", 500000, 1000, 485.0)
    monkeypatch.setattr(sys, "argv", ["report.py", str(second), "--out", str(out), "--cleanrl"])
    report_module.main()
    text = page.read_text()
    assert "| 490.0 (n=2) | 1: 495.0, 2: 485.0 | 490.04 ± 6.12 | - | no verdict: " in text
    assert "| 1: 0.7 min at 5,000 steps, 2: not reached | " in text
    assert "## dqn: CartPole-v1 (by an earlier page)\n\nkept\n" in text
    assert (out / "cleanrl_runs/classic/01-baseline/1/summary.json").exists()


def test_cleanrl_page_written_again_from_its_record_alone(tmp_path, report_module, monkeypatch, capsys):
    """`report.py doc/cleanrl_runs --cleanrl` writes the page from the record alone (a new run of CleanRL's file
    converted into it, no sweep folder on this machine): the record is read as it is, each run keeping the day it
    finished, not copied onto itself with the day of the checkout's files."""
    out = tmp_path / "doc"
    fake_run(tmp_path / "runs/classic/01-baseline/1", "CartPole-v1", 500000, 1000, 495.0)
    monkeypatch.setattr(sys, "argv", ["report.py", str(tmp_path / "runs"), "--out", str(out), "--cleanrl"])
    report_module.main()
    record = out / report_module.RECORD
    update_summary(record / "classic/01-baseline/1", finished_on="2026-01-02")
    monkeypatch.setattr(sys, "argv", ["report.py", str(record), "--out", str(out), "--cleanrl"])
    report_module.main()
    assert json.loads((record / "classic/01-baseline/1/summary.json").read_text())["finished_on"] == "2026-01-02"
    text = (out / "learning_cleanrl.md").read_text()
    assert "- newest run: 2026-01-02, the day it finished or stopped" in text
    today = datetime.date.today().isoformat()
    assert f"{record} --cleanrl` on {today}, from the runs recorded in [cleanrl_runs/](cleanrl_runs/):" in text


def test_the_record_of_a_run_is_written_the_same_in_every_process():
    """The record's rows (doc/cleanrl_runs/) took their key order from a set, which Python orders by a per-process hash
    seed: each report rewrote every recorded metrics.jsonl with its keys shuffled, a diff of thousands of lines."""
    code = (
        "import json, sys; sys.path[:0] = ['leanrl', 'leanrl/tools']; import report; "
        "print(json.dumps(report.slim(dict(time=1.5, episodic_return=2.5, global_step=3, fps=9.0))))"
    )
    written = {
        subprocess.run(
            [sys.executable, "-c", code],
            env=dict(os.environ, PYTHONHASHSEED=str(seed)),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
        for seed in range(4)
    }
    assert len(written) == 1 and "fps" not in next(iter(written)), written
