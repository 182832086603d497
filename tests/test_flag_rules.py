"""One rule for a flag across the PPO scripts: `--target-kl` with `--cudagraphs` is accepted everywhere (issue 51: Atari
refused it, CartPole and HalfCheetah ran it). The KL is read on the host between graph replays, once an epoch and only
when asked, as CleanRL reads it; nothing inside a captured unit changes."""

import glob
from pathlib import Path

import pytest

from conftest import ROOT, load_script

# the seeds scripts refuse --target-kl for a reason of their own (members stop their epochs at different times)
SCRIPTS = sorted(
    Path(p).stem
    for p in glob.glob(str(ROOT / "leanrl" / "ppo*_torchcompile.py"))
    if "_seeds_" not in p and "target_kl" in Path(p).read_text()
)


@pytest.mark.parametrize("script", SCRIPTS)
def test_target_kl_with_cudagraphs_is_accepted(script, tmp_path):
    module = load_script(script)
    args = module.Args(cudagraphs=True, target_kl=0.02, log_dir=str(tmp_path / "run"))
    module.check_args(args)


@pytest.mark.parametrize("script", sorted(Path(p).stem for p in glob.glob(str(ROOT / "leanrl" / "*_seeds_*.py"))))
def test_a_seeds_runs_memory_check_counts_every_members_envs(script, tmp_path, monkeypatch):
    """The env pools of every member are on the host (issue 51: 8 members of 16 Breakout envs were counted as one
    member's 18 MiB; the run peaked at 1.19 GB), so a --num-seeds the machine cannot hold is refused up front."""
    import plumbing

    module = load_script(script)
    args = module.Args(num_seeds=8, num_envs=2, num_steps=64, log_dir=str(tmp_path / "run"))
    family = next(f for f in ("atari", "mujoco", "classic") if f in plumbing.env_family(args.env_id))
    seen = []
    monkeypatch.setattr(plumbing.memory, "fits", lambda args, stores, *rest: seen.append(dict(stores)))
    module.check_args(args)
    host = seen[-1]
    assert host["envs"] == 8 * 2 * plumbing.ENV_BYTES[family]
