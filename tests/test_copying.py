"""doc/copying.md's copy of the one-graph update and its compile block into CleanRL's ppo.py
(doc/copying/ppo_update.patch): it applies to today's ppo.py, and the copy trains as ppo.py does (its autograd step,
the independent reference), so the speed bench_copy.py measures is the speed of the same training."""

import os
import sys

import pytest
import torch

from conftest import ROOT, read_metrics, run_command

sys.path.insert(0, str(ROOT / "leanrl" / "tools"))
import bench_copy  # noqa: E402

TINY = ["--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "2"]
TINY += ["--total-timesteps", "128", "--seed", "3"]
LOSSES = ("approx_kl", "clipfrac", "pg_loss", "v_loss", "entropy")


def test_the_copied_update_trains_as_ppo_py(tmp_path):
    copied = bench_copy.copy_script(tmp_path / "copy")
    text = copied.read_text()
    assert "def adam_step(" in text and "update_minibatch = torch.compile(update_minibatch" in text
    env = dict(os.environ, PYTHONPATH=str(ROOT / "leanrl"))
    rows = {}
    for name, script in (("ppo", ROOT / "leanrl" / "ppo.py"), ("copy", copied)):
        log_dir = tmp_path / name
        proc = run_command([sys.executable, script, *TINY, "--log-dir", log_dir], tmp_path / f"{name}.out", 300, env)
        assert proc.returncode == 0, proc.stderr
        rows[name] = read_metrics(log_dir)
    assert len(rows["ppo"]) == len(rows["copy"]) == 2
    for ours, theirs in zip(rows["copy"], rows["ppo"]):
        assert ours["lr"] == pytest.approx(theirs["lr"])  # CleanRL's annealing, in place
        for key in LOSSES:
            assert ours[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-6), key


def test_cleanrl_float_lr_line_trains_as_eager_under_compile(tmp_path):
    """CleanRL's own annealing line (`optimizer.param_groups[0]["lr"] = frac * args.learning_rate`, a new float each
    iteration) in the copy, compiled: every iteration's step takes that iteration's lr, as ppo.py's eager Adam does.
    Skipped guards used to keep the first iteration's lr for the whole run (issue 58)."""
    copied = bench_copy.copy_script(tmp_path / "copy")
    text = copied.read_text()
    ours = "lr.fill_(frac * args.learning_rate)"
    assert ours in text
    copied.write_text(text.replace(ours, 'optimizer.param_groups[0]["lr"] = frac * args.learning_rate'))
    env = dict(os.environ, PYTHONPATH=str(ROOT / "leanrl"))
    flags = [*TINY[:-4], "--total-timesteps", "256", "--seed", "3", "--save-model"]
    states = {}
    rows = {}
    for name, script, extra in (("ppo", ROOT / "leanrl" / "ppo.py", []), ("copy", copied, ["--compile"])):
        log_dir = tmp_path / name
        cmd = [sys.executable, script, *flags, *extra, "--log-dir", log_dir]
        proc = run_command(cmd, tmp_path / f"{name}.out", 400, env)
        assert proc.returncode == 0, proc.stderr
        rows[name] = read_metrics(log_dir)
        states[name] = torch.load(log_dir / "agent.pt", weights_only=True)["agent"]
    assert len(rows["copy"]) == 4
    lrs = [row["lr"] for row in rows["ppo"]]
    assert lrs[1] < lrs[0] and lrs[3] < lrs[2]  # the schedule moves every iteration
    for row, reference in zip(rows["copy"], rows["ppo"]):
        for key in LOSSES:
            assert row[key] == pytest.approx(reference[key], rel=1e-4, abs=1e-6), (row["iteration"], key)
    for key, value in states["ppo"].items():
        torch.testing.assert_close(states["copy"][key], value, rtol=1e-4, atol=1e-6, msg=key)
