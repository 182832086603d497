"""On a CUDA machine: every torchcompile script under `--compile --cudagraphs` gives the numbers of its eager path.

Skipped without CUDA (CI has none); run it where a GPU is (`python -m pytest -q tests/test_gpu.py`). Each script runs
twice at its family's smallest budget on the GPU, eager and `--compile --cudagraphs`, same seed; the first logged
losses must agree within 1e-3 (relative; compiled kernels only reorder sums, and both runs draw the same random
numbers from the loop's generator, so the data are the same). The pruned scripts prune twice within the budget, with
random ranking drawn from that generator: the graphs must be captured again for the new shapes, and every logged loss,
before and after each step, must still agree. `--host-actor` and `--split-envs` against their off switch: the same
first iteration.
"""

import pytest
import torch

from conftest import ROOT, SMOKE, read_metrics, read_summary, run_script
from test_dqn import TINY as DQN
from test_dqn_atari_envpool import TINY as DQN_ATARI
from test_sac_continuous_action import TINY as OFFPOLICY

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

TORCHCOMPILE = sorted(p.name for p in (ROOT / "leanrl").glob("*_torchcompile.py"))
# per family, the smallest run that calls every unit: each test module's own (dqn_atari before dqn: prefixes)
BUDGET = {"ppo": SMOKE, "sac": OFFPOLICY, "td3": OFFPOLICY, "dqn_atari": DQN_ATARI, "dqn": DQN}
PRUNE_TWICE = (
    "--prune-ratio",
    "0.5",
    "--prune-start",
    "2",
    "--prune-every",
    "1",
    "--prune-steps",
    "2",
    "--prune-importance",
    "random",
)


def losses(row: dict) -> dict:
    return {k: v for k, v in row.items() if isinstance(v, float) and ("loss" in k or k in ("entropy", "approx_kl"))}


@pytest.mark.parametrize("script", TORCHCOMPILE)
def test_compile_cudagraphs_matches_eager_on_cuda(script, tmp_path):
    budget = next(flags for family, flags in BUDGET.items() if script.startswith(family))
    flags = [*budget, "--seed", "1", *(PRUNE_TWICE if "pruned" in script else ())]
    run_script(script, *flags, log_dir=tmp_path / "eager", timeout=600)
    proc = run_script(script, *flags, "--compile", "--cudagraphs", log_dir=tmp_path / "graphs", timeout=900)
    assert "--cudagraphs ignored" not in proc.stderr
    assert read_summary(tmp_path / "graphs")["device"].startswith("cuda")
    eager, graphs = read_metrics(tmp_path / "eager"), read_metrics(tmp_path / "graphs")
    assert [r["global_step"] for r in graphs] == [r["global_step"] for r in eager]
    compared = [(e, g) for e, g in zip(eager, graphs) if losses(e)]
    if "pruned" not in script:
        compared = compared[:1]  # afterwards only the first iteration's data are the same by construction
    assert compared, "no logged losses to compare"
    for e, g in compared:
        assert losses(g) == pytest.approx(losses(e), rel=1e-3, abs=1e-5), g["global_step"]
    if "pruned" in script:
        assert read_summary(tmp_path / "graphs")["prune_steps_done"] == 2


# the GPU tricks against their off switch: a host copy of the actor and the split pools change float rounding only
# (the policy on the host, on half batches), so the first iteration's data and losses are the same
TRICKS = [
    ("ppo_torchcompile.py", "--host-actor", "--no-host-actor", SMOKE),
    ("ppo_continuous_action_torchcompile.py", "--host-actor", "--no-host-actor", SMOKE),
    (
        "ppo_atari_envpool_torchcompile.py",
        "--split-envs",
        "--no-split-envs",
        ["--num-envs", "4", "--num-steps", "64", "--total-timesteps", "512"],
    ),
]


@pytest.mark.parametrize("script,on,off,budget", TRICKS, ids=[f"{t[0][:-3]}{t[1]}" for t in TRICKS])
def test_gpu_tricks_change_no_number(script, on, off, budget, tmp_path):
    for flag in (on, off):
        run_script(
            script, *budget, "--seed", "1", "--compile", "--cudagraphs", flag, log_dir=tmp_path / flag, timeout=900
        )
    first_on, first_off = read_metrics(tmp_path / on)[0], read_metrics(tmp_path / off)[0]
    assert losses(first_on) and losses(first_on) == pytest.approx(losses(first_off), rel=1e-3, abs=1e-5)
    assert first_on["episodic_return"] == first_off["episodic_return"]
