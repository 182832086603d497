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
