"""A seeds run in which one member diverges (issue 51): that member is reported, the others train on to the end.

One member is made to diverge with --learning-rates: at 1e30 its weights are not finite after its first minibatch
step. The reference for the members that go on is the base script run with their seed (as in tests/test_ppo_seeds.py):
a NaN of the diverged member that reached another member would part it from its run. The reference for the
checkpoint is the earlier agent.pt, read before the run that replaces it."""

import json
import math
import shutil
import sys

import pytest
import torch

from conftest import ROOT, Child, assert_user_error, read_metrics, read_summary, run_script
from test_ppo_seeds import assert_member_is_its_run

CLASSIC = "ppo_seeds_torchcompile.py"
TINY = ("--num-envs", "2", "--num-steps", "16", "--num-threads", "1")  # 32 steps an iteration
LR = "2.5e-4"  # the base's default
HUGE = "1e30"


def diverged_lines(proc) -> list:
    return [line for line in proc.stderr.splitlines() if "training diverged" in line]


def seeds_run(log_dir, *flags, timeout=300):
    return run_script(CLASSIC, *TINY, "--num-seeds", "2", *flags, log_dir=log_dir, check=False, timeout=timeout)


def strict_summary(log_dir) -> dict:
    """summary.json read as a strict JSON reader reads it: a bare NaN fails."""
    return json.loads((log_dir / "summary.json").read_text(), parse_constant=pytest.fail)


def test_a_diverged_member_stops_alone_and_the_others_train_to_the_end(tmp_path):
    """Member seed 8 (lr 1e30) diverges in the first iteration: one line names its seed, the step and the losses;
    member seed 7 trains to the end of the budget as `ppo_torchcompile.py --seed 7` does, iteration by iteration; the
    top-level fields are the means of the members still training; summary.json records the divergence for seed 8
    only; exit code 1."""
    log_dir = tmp_path / "seeds"
    proc = seeds_run(log_dir, "--total-timesteps", "128", "--seed", "7", "--learning-rates", LR, HUGE)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    said = diverged_lines(proc)
    assert len(said) == 1, proc.stderr
    assert "seed 8" in said[0] and "step 32" in said[0] and "pg_loss nan" in said[0], said[0]
    assert "seed 7" not in said[0]

    rows = read_metrics(log_dir)
    assert [row["global_step"] for row in rows] == [32, 64, 96, 128]
    single_dir = tmp_path / "single"
    run_script("ppo_torchcompile.py", *TINY, "--total-timesteps", "128", "--seed", "7", log_dir=single_dir)
    assert_member_is_its_run([row["members"][0] for row in rows], read_metrics(single_dir), 7)
    for row in rows:
        alive, diverged = row["members"]
        assert diverged["pg_loss"] is None and diverged["v_loss"] is None
        for key in ("pg_loss", "v_loss", "entropy", "approx_kl", "episodic_return", "lr"):
            assert row[key] == alive[key], key  # the mean of the one member still training

    summary = strict_summary(log_dir)
    assert summary["global_step"] == 128 and summary["interrupted"] is False
    alive, diverged = summary["members"]
    assert "diverged" not in alive and alive["final_return"] == read_summary(single_dir)["final_return"]
    assert diverged["seed"] == 8 and diverged["diverged"]["global_step"] == 32
    assert "pg_loss" in diverged["diverged"]["losses"] and "members[1].pg_loss" in summary["diverged"]["losses"]
    assert summary["diverged"]["members"] == [8] and summary["diverged"]["global_step"] == 32
    assert summary["final_return"] == alive["final_return"]


def test_a_seeds_run_stops_when_every_member_has_diverged(tmp_path):
    """With no member left training the run stops as any diverged run does: one line, no checkpoint, exit 1."""
    log_dir = tmp_path / "seeds"
    proc = seeds_run(log_dir, "--total-timesteps", "128", "--learning-rates", HUGE, HUGE, "--save-model")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    said = diverged_lines(proc)
    assert len(said) == 1 and "step 32" in said[0] and "run stops" in said[0], proc.stderr
    assert "members[0].pg_loss nan" in said[0] and "members[1].pg_loss nan" in said[0], said[0]
    assert len(read_metrics(log_dir)) == 1 and not (log_dir / "agent.pt").exists()
    summary = strict_summary(log_dir)
    assert summary["diverged"]["members"] == [1, 2] and summary["interrupted"] is False
    assert [m["diverged"]["global_step"] for m in summary["members"]] == [32, 32]


def member_tensors(ckpt: dict, k: int) -> dict:
    """Member k's slices of the stacked parameters and of Adam's moments."""
    out = {f"agent.{name}": t[k] for name, t in ckpt["agent"].items()}
    for i, state in ckpt["optimizer"]["state"].items():
        out.update({f"adam.{i}.{key}": state[key][k] for key in ("exp_avg", "exp_avg_sq")})
    return out


def test_a_checkpoint_keeps_a_diverged_members_last_finite_state(tmp_path):
    """A finite run saves agent.pt at step 64; resumed into its folder with lr 1e30 for seed 2, which diverges at step
    96, it saves again at step 128: seed 2's parameters and Adam moments are those of the first file, seed 1's trained
    on. Resumed once more with a sane lr, seed 2 goes on from that state, said in one line."""
    log_dir = tmp_path / "run"
    first = seeds_run(log_dir, "--total-timesteps", "64", "--save-model")
    assert first.returncode == 0, first.stderr
    shutil.copy(log_dir / "agent.pt", tmp_path / "first.pt")
    earlier = torch.load(tmp_path / "first.pt", weights_only=True)

    resume = ("--save-model", "--resume", str(log_dir / "agent.pt"))
    proc = seeds_run(log_dir, "--total-timesteps", "128", "--learning-rates", LR, HUGE, *resume)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert len(diverged_lines(proc)) == 1 and "step 96" in diverged_lines(proc)[0], proc.stderr
    ckpt = torch.load(log_dir / "agent.pt", weights_only=True)
    assert ckpt["global_step"] == 128
    for name, t in member_tensors(ckpt, 1).items():
        assert torch.equal(t, member_tensors(earlier, 1)[name]), name
    for name, t in member_tensors(ckpt, 0).items():
        assert torch.isfinite(t).all() and not torch.equal(t, member_tensors(earlier, 0)[name]), name
    (record,) = ckpt["diverged"]
    assert record["seed"] == 2 and record["global_step"] == 96 and record["kept"] == 64, record
    assert "pg_loss" in record["losses"]

    proc = seeds_run(log_dir, "--total-timesteps", "160", *resume)
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "seed 2" in line]
    assert len(said) == 1 and "step 64" in said[0] and "step 96" in said[0], proc.stderr
    row = read_metrics(log_dir)[-1]
    assert row["global_step"] == 160 and all(math.isfinite(m["pg_loss"]) for m in row["members"])
    assert torch.load(log_dir / "agent.pt", weights_only=True)["diverged"] == []


def test_a_member_that_diverged_before_any_checkpoint_cannot_resume(tmp_path):
    """With no earlier checkpoint there is no finite state of the diverged member to keep: agent.pt holds the others
    and records the member, and --resume refuses the file in one line rather than resume a NaN member."""
    log_dir = tmp_path / "run"
    proc = seeds_run(log_dir, "--total-timesteps", "64", "--learning-rates", LR, HUGE, "--save-model")
    assert proc.returncode == 1, proc.stderr
    ckpt = torch.load(log_dir / "agent.pt", weights_only=True)
    assert all(torch.isfinite(t).all() for t in member_tensors(ckpt, 0).values())
    (record,) = ckpt["diverged"]
    assert record["seed"] == 2 and record["global_step"] == 32 and record["kept"] is None, record
    proc = seeds_run(tmp_path / "again", "--total-timesteps", "128", "--resume", str(log_dir / "agent.pt"))
    assert_user_error(proc, "seed 2", "diverged", "not finite")


# the other seeds scripts, at tiny budgets: (script, flags), member seed 2 given lr 1e30
OTHERS = [
    (
        "ppo_continuous_action_seeds_torchcompile.py",
        ("--num-envs", "1", "--num-steps", "16", "--num-minibatches", "2", "--total-timesteps", "64"),
        "3e-4",
    ),
    (
        "ppo_atari_envpool_seeds_torchcompile.py",
        ("--num-envs", "2", "--num-steps", "16", "--total-timesteps", "96"),
        LR,
    ),
]


@pytest.mark.parametrize("script,flags,lr", OTHERS, ids=[s.removesuffix(".py") for s, _, _ in OTHERS])
def test_a_diverged_member_does_not_stop_the_others(script, flags, lr, tmp_path):
    """HalfCheetah (a NaN member's actions reach its own envs and normalizer only) and Breakout: the member that
    diverges is reported once and the other trains, its losses finite, to the end of the budget."""
    log_dir = tmp_path / "run"
    flags = (*flags, "--num-threads", "1", "--num-seeds", "2", "--learning-rates", lr, HUGE)
    # run from tmp_path: MuJoCo logs the NaN member's actions to MUJOCO_LOG.TXT in the working directory
    cmd = [sys.executable, ROOT / "leanrl" / script, "--log-dir", log_dir, *flags]
    proc = Child(cmd, log_dir, cwd=tmp_path).result(300, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    said = diverged_lines(proc)
    assert len(said) == 1 and "seed 2" in said[0], proc.stderr
    rows = read_metrics(log_dir)
    budget = int(flags[flags.index("--total-timesteps") + 1])
    assert rows[-1]["global_step"] == budget
    assert all(math.isfinite(row["members"][0][key]) for row in rows for key in ("pg_loss", "v_loss", "entropy"))
    assert all(math.isfinite(row[key]) for row in rows for key in ("pg_loss", "v_loss", "entropy"))
    summary = strict_summary(log_dir)
    assert [("diverged" in m) for m in summary["members"]] == [False, True] and summary["global_step"] == budget
