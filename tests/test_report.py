"""run.sh and leanrl/report.py: the table from synthetic runs, and the whole sweep in its smoke mode."""

import json
import os
import subprocess
import sys

from conftest import ROOT, assert_user_error

ROW = {"episodic_return": None, "time": 1.0}


def fake_run(path, env_id, steps, fps, final, compile_time=None):
    """A finished run as a training script leaves it: summary.json and metrics.jsonl."""
    path.mkdir(parents=True)
    summary = {"env_id": env_id, "total_timesteps": steps, "fps": fps, "final_return": final, "cpu": "Test CPU (2 cores)",
               "gpu": None, "torch": "2.13.0+cpu", "compile_time": compile_time}
    (path / "summary.json").write_text(json.dumps(summary))
    rows = [dict(ROW, global_step=steps // 2, episodic_return=final / 2), dict(ROW, global_step=steps, episodic_return=final)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def report(runs, out):
    return subprocess.run([sys.executable, str(ROOT / "leanrl" / "report.py"), str(runs), "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT)


def test_report_on_synthetic_runs(tmp_path):
    runs = tmp_path / "runs"
    for seed, (fps_base, fps_comp, final) in enumerate([(100, 400, 10.0), (200, 500, 20.0), (300, 600, 30.0)]):
        fake_run(runs / "classic/01-baseline" / str(seed), "CartPole-v1", 1000, fps_base, final)
        fake_run(runs / "classic/03-compile" / str(seed), "CartPole-v1", 1000, fps_comp, final + 1, compile_time=5.0)
    (runs / "classic/04-compile-cudagraphs").mkdir()
    (runs / "classic/04-compile-cudagraphs/SKIPPED").write_text("no CUDA device\n")
    fake_run(runs / "atari/01-baseline/1", "Breakout-v5", 2048, 50, 2.0)
    fake_run(runs / "atari/01-baseline/2", "Breakout-v5", 2048, 70, 4.0)
    proc = report(runs, tmp_path / "doc")
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "doc/fps_table.md").read_text()
    lines = text.splitlines()
    assert "| family (env, steps per run) | `baseline` | `compile` | `compile-cudagraphs` | fastest vs baseline |" in lines
    assert "| atari (Breakout-v5, 2,048) | 60 | not run | not run | 1.00x (`baseline`) |" in lines
    assert "| classic (CartPole-v1, 1,000) | 200 | 500 | skipped: no CUDA device | 2.50x (`compile`) |" in lines
    assert "| atari | 3.0 ± 1.4 (n=2) | - | - |" in lines
    assert "| classic | 20.0 ± 10.0 (n=3) | 21.0 ± 10.0 (n=3) | - |" in lines
    assert "| `compile` | 3 | 500 (400-600) | 5.0 |" in text  # the detail rows start so; CartPole adds steps to 475
    assert "Test CPU (2 cores), GPU: none, torch 2.13.0+cpu" in text
    for png in ("fps.png", "returns_classic.png", "returns_atari.png"):
        assert (tmp_path / "doc" / png).stat().st_size > 0


def test_report_bad_input(tmp_path):
    assert_user_error(report(tmp_path / "missing", tmp_path / "doc"), "not a folder")
    assert_user_error(report(tmp_path, tmp_path / "doc"), "no finished runs")


def test_run_sh_smoke(tmp_path):
    """SMOKE=1: every script of every family once with the tiny budget, then the table; a re-run repeats nothing."""
    env = dict(os.environ, SMOKE="1", OUT=str(tmp_path / "runs"), PYTHONWARNINGS="ignore")
    first = subprocess.run(["bash", "run.sh"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=1500)
    assert first.returncode == 0, first.stderr[-4000:]
    text = (tmp_path / "runs/doc/fps_table.md").read_text()
    for family, env_id in (("classic", "CartPole-v1"), ("atari", "Breakout-v5"), ("mujoco", "HalfCheetah-v4")):
        row = next(ln for ln in text.splitlines() if ln.startswith(f"| {family} ({env_id}, 256) |"))
        assert "x (`" in row  # a measured speed-up: the baseline ran
    assert "skipped: no CUDA device" in text
    again = subprocess.run(["bash", "run.sh"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert again.returncode == 0 and "seed" not in again.stderr, again.stderr
    for family in ("dqn", "dqn_atari"):  # the off-policy families: their own tiny budget of 600 steps
        assert any(ln.startswith(f"| {family} (") and ", 600) |" in ln and "x (`" in ln for ln in text.splitlines())
    bad = subprocess.run(["bash", "run.sh", "nosuch"], capture_output=True, text=True, cwd=ROOT, env=env)
    assert_user_error(bad, "unknown family")
