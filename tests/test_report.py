"""run.sh and leanrl/tools/report.py: the table from synthetic runs, and the whole sweep in its smoke mode."""

import json
import os
import sys

from conftest import ROOT, assert_user_error, run_command

ROW = {"episodic_return": None, "time": 1.0}


def fake_run(path, env_id, steps, fps, final, compile_time=None):
    """A finished run as a training script leaves it: summary.json and metrics.jsonl."""
    path.mkdir(parents=True)
    summary = {
        "env_id": env_id,
        "total_timesteps": steps,
        "fps": fps,
        "final_return": final,
        "cpu": "Test CPU (2 cores)",
        "gpu": None,
        "torch": "2.13.0+cpu",
        "compile_time": compile_time,
    }
    (path / "summary.json").write_text(json.dumps(summary))
    rows = [
        dict(ROW, global_step=steps // 2, episodic_return=final and final / 2),
        dict(ROW, global_step=steps, episodic_return=final),
    ]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def report(runs, out):
    return run_command([sys.executable, ROOT / "leanrl" / "tools" / "report.py", runs, "--out", out], timeout=300)


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


def test_report_bad_input(tmp_path):
    assert_user_error(report(tmp_path / "missing", tmp_path / "doc"), "not a folder")
    assert_user_error(report(tmp_path, tmp_path / "doc"), "no finished runs")


def test_run_sh_smoke(tmp_path):
    """SMOKE=1: every script of every family once with the tiny budget, then the table; a re-run repeats nothing."""
    env = dict(os.environ, SMOKE="1", OUT=str(tmp_path / "runs"), PYTHONWARNINGS="ignore")
    first = run_command(["bash", "run.sh"], tmp_path / "first", timeout=1500, env=env)
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
