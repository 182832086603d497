"""doc/copying.md's copy of the one-graph update and its compile block into CleanRL's ppo.py
(doc/copying/ppo_update.patch): it applies to today's ppo.py, and the copy trains as ppo.py does (its autograd step,
the independent reference), so the speed bench_copy.py measures is the speed of the same training."""

import os
import sys

import pytest

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
