"""ppo_atari_envpool_seeds_torchcompile.py: N Breakout agents in one program, each the run
`ppo_atari_envpool_torchcompile.py --seed s`.

The reference is the base script itself, run once per seed: a member must log what that run logs (its games exactly,
as the same actions are taken in emulators seeded alike; its losses within float tolerance, as the members' batched
convolutions, GEMMs and per-member norms sum in another order). The clip and --target-kl tests of every seeds
script are in test_ppo_seeds.py."""

import pytest

from conftest import read_metrics, read_summary, run_script
from test_ppo_seeds import sweep_flags

# 4 iterations of 2 envs x 64 steps, one epoch of 2 minibatches: a few seconds a run on one thread
BUDGET = ("--total-timesteps", "512", "--num-envs", "2", "--num-steps", "64", "--num-minibatches", "2")
BUDGET += ("--update-epochs", "1", "--num-threads", "1")
LOSSES = ("pg_loss", "v_loss", "entropy", "approx_kl", "clipfrac")


def assert_member_is_its_run(member_rows: list, run_rows: list, seed: int):
    assert len(member_rows) == len(run_rows) > 1
    assert any(row["episodic_return"] is not None for row in run_rows), "no game ended: the budget compares no score"
    for member, single in zip(member_rows, run_rows):
        assert member["seed"] == seed
        it = single["iteration"]
        assert member["episodic_return"] == single["episodic_return"], (seed, it)
        assert member["episodic_length"] == single["episodic_length"], (seed, it)
        for key in LOSSES:
            # pg_loss and approx_kl are differences of near-equal terms of order 1: an absolute floor for their
            # rounding, which the members' convolutions and Adam's step (its formulas, another order) carry on
            assert member[key] == pytest.approx(single[key], rel=1e-4, abs=1e-6), (seed, it, key)


@pytest.mark.parametrize(
    "num_seeds,flags,sweep",
    [
        (1, (), False),
        (2, (), False),
        (2, ("--split-envs", "--num-envs", "3", "--total-timesteps", "768"), False),
        (2, (), True),
    ],
    ids=["1-member", "2-members", "2-members-split-envs", "2-members-sweep"],
)
def test_a_member_is_its_single_seed_run(tmp_path, num_seeds, flags, sweep):
    """Member k of an N-member run, first seed 7, logs what `ppo_atari_envpool_torchcompile.py --seed 7+k` logs,
    iteration by iteration: the same games and the same losses. A member that shared another's generator, env seeds,
    gradient norm or Adam state would drift from its run within an iteration. In a sweep, member k is the run with its
    learning rate, entropy and clip coefficients."""
    seeds_dir = tmp_path / "seeds"
    script = "ppo_atari_envpool_seeds_torchcompile.py"
    member_flags = sweep_flags() if sweep else []
    run_script(script, *BUDGET, *flags, *member_flags, "--seed", "7", "--num-seeds", str(num_seeds), log_dir=seeds_dir)
    rows = read_metrics(seeds_dir)
    summary = read_summary(seeds_dir)
    assert summary["num_seeds"] == num_seeds
    assert [m["seed"] for m in summary["members"]] == list(range(7, 7 + num_seeds))
    for k in range(num_seeds):
        single_dir = tmp_path / f"seed{7 + k}"
        single_flags = sweep_flags(k) if sweep else []
        run_script(
            "ppo_atari_envpool_torchcompile.py",
            *BUDGET,
            *flags,
            *single_flags,
            "--seed",
            str(7 + k),
            log_dir=single_dir,
        )
        single = read_metrics(single_dir)
        assert [row["members"][k]["lr"] for row in rows] == pytest.approx([row["lr"] for row in single], rel=1e-6)
        assert_member_is_its_run([row["members"][k] for row in rows], single, 7 + k)
        assert summary["members"][k]["final_return"] == read_summary(single_dir)["final_return"]
