"""The seeds scripts: N agents in one program, each exactly the run of its base script with its seed.

The reference is the base script itself, run once per seed: a member must log what that run logs (its episodes
exactly, as the same actions are taken; its losses within float tolerance, as the members' batched matmuls and
per-member norms sum in another order). ppo_seeds_torchcompile.py (CartPole) is compared over every iteration;
ppo_continuous_action_seeds_torchcompile.py (HalfCheetah) over its first iteration, where the first episode ends, and
the checkpoint it writes after it: MuJoCo turns a float difference in the weights into another trajectory within the
next rollout (the base's compiled and eager runs part the same way)."""

import functools

import numpy as np
import pytest
import torch

from conftest import assert_rejected, load_script, read_metrics, read_summary, run_script

BUDGET = ("--total-timesteps", "2048", "--num-envs", "4", "--num-steps", "128")
LOSSES = ("pg_loss", "v_loss", "entropy", "approx_kl", "clipfrac", "grad_norm")


def assert_member_is_its_run(member_rows: list, run_rows: list, seed: int):
    assert len(member_rows) == len(run_rows) > 1
    for member, single in zip(member_rows, run_rows):
        assert member["seed"] == seed
        it = single["iteration"]
        assert member["episodic_return"] == single["episodic_return"], (seed, it)
        for key in LOSSES:
            # pg_loss and approx_kl are differences of near-equal terms: an absolute floor for their rounding
            assert member[key] == pytest.approx(single[key], rel=1e-4, abs=2e-7), (seed, it, key)


@pytest.mark.parametrize(
    "num_seeds,flags",
    [(1, ()), (3, ()), (2, ("--no-numpy-act",)), (2, ("--compile",))],
    ids=["1-member", "3-members", "2-members-torch-acting", "2-members-compiled"],
)
def test_a_member_is_its_single_seed_run(tmp_path, num_seeds, flags):
    """Member k of an N-member run, first seed 7, logs what `ppo_torchcompile.py --seed 7+k` logs, iteration by
    iteration: the same episodes and the same losses. A member that shared another's generator, env seeds, gradient
    norm or Adam state would drift from its run within an iteration."""
    seeds_dir = tmp_path / "seeds"
    run_script(
        "ppo_seeds_torchcompile.py", *BUDGET, *flags, "--seed", "7", "--num-seeds", str(num_seeds), log_dir=seeds_dir
    )
    rows = read_metrics(seeds_dir)
    summary = read_summary(seeds_dir)
    assert summary["num_seeds"] == num_seeds
    assert [m["seed"] for m in summary["members"]] == list(range(7, 7 + num_seeds))
    for k in range(num_seeds):
        single_dir = tmp_path / f"seed{7 + k}"
        run_script("ppo_torchcompile.py", *BUDGET, *flags, "--seed", str(7 + k), log_dir=single_dir)
        single = read_metrics(single_dir)
        assert_member_is_its_run([row["members"][k] for row in rows], single, 7 + k)
        assert summary["members"][k]["final_return"] == read_summary(single_dir)["final_return"]


def test_members_may_differ_in_learning_rate_entropy_and_clip_coefficients(tmp_path):
    """A sweep in one program: member k with --learning-rates/--ent-coefs/--clip-coefs value k is the run of the base
    script with --learning-rate/--ent-coef/--clip-coef that value (annealed as that run anneals it), iteration by
    iteration."""
    seeds_dir = tmp_path / "seeds"
    run_script(
        "ppo_seeds_torchcompile.py", *BUDGET, "--seed", "7", "--num-seeds", "2", *sweep_flags(), log_dir=seeds_dir
    )
    rows = read_metrics(seeds_dir)
    for k in range(2):
        single_dir = tmp_path / f"member{k}"
        run_script("ppo_torchcompile.py", *BUDGET, "--seed", str(7 + k), *sweep_flags(k), log_dir=single_dir)
        single = read_metrics(single_dir)
        assert_member_is_its_run([row["members"][k] for row in rows], single, 7 + k)
        assert [row["members"][k]["lr"] for row in rows] == pytest.approx([row["lr"] for row in single], rel=1e-6)


def test_a_per_member_value_per_member(tmp_path):
    """--learning-rates takes one value per member: another count is refused in one line, before any work."""
    assert_rejected(
        "ppo_seeds_torchcompile.py",
        ["--num-seeds", "3", "--learning-rates", "1e-3", "2e-3"],
        ["--learning-rates", "--num-seeds 3"],
        tmp_path,
    )


# each seeds script and the base script whose runs its members are
SEEDS_SCRIPTS = {
    "ppo_seeds_torchcompile": "ppo_torchcompile",
    "ppo_continuous_action_seeds_torchcompile": "ppo_continuous_action_torchcompile",
    "ppo_atari_envpool_seeds_torchcompile": "ppo_atari_envpool_torchcompile",
}


@pytest.mark.parametrize("script", SEEDS_SCRIPTS)
def test_members_clip_their_own_gradients(script):
    """clip_members is torch's clip_grad_norm_ for each member alone: a member with a huge gradient is clipped hard and
    leaves the others' gradients and norms as their own clip_grad_norm_ leaves them."""
    module = load_script(script)
    torch.manual_seed(0)
    grads = [torch.randn(3, 8, 4, 2, 2), torch.randn(3, 8, 4), torch.randn(3, 8)]
    grads[0][1] *= 1000.0
    expected_grads, expected_norms = [], []
    for k in range(3):
        member = [torch.nn.Parameter(torch.zeros_like(g[k])) for g in grads]
        for p, g in zip(member, grads):
            p.grad = g[k].clone()
        expected_norms.append(torch.nn.utils.clip_grad_norm_(member, 0.5, foreach=False))
        expected_grads.append([p.grad for p in member])
    norms = module.clip_members(grads, 0.5)
    torch.testing.assert_close(norms, torch.stack(expected_norms))
    for k in range(3):
        for g, expected in zip(grads, expected_grads[k]):
            torch.testing.assert_close(g[k], expected)


@pytest.mark.parametrize("script", SEEDS_SCRIPTS)
def test_target_kl_is_refused_in_one_line(tmp_path, script):
    """--target-kl stops a run's epochs at its own time; members that update together cannot: refused before any
    work, with the way to get it (the base script, once per seed)."""
    base = SEEDS_SCRIPTS[script]
    assert_rejected(f"{script}.py", ["--target-kl", "0.01"], ["--target-kl", f"{base}.py"], tmp_path)


CHEETAH = ("--total-timesteps", "1024", "--num-steps", "1024", "--update-epochs", "2", "--save-model")


# a sweep in one program: member k takes value k of each per-member flag, its run the single flag with that value
SWEEP = dict(learning_rate=("1e-3", "2.5e-4"), ent_coef=("0.0", "0.05"), clip_coef=("0.3", "0.1"))


def sweep_flags(k=None) -> list:
    """The seeds script's per-member flags (k None), or member k's flags for its base run."""
    if k is None:
        return [x for name, values in SWEEP.items() for x in (f"--{name.replace('_', '-')}s", *values)]
    return [x for name, values in SWEEP.items() for x in (f"--{name.replace('_', '-')}", values[k])]


@pytest.mark.parametrize(
    "num_seeds,flags,sweep",
    [
        (1, (), False),
        (3, (), False),
        (2, ("--num-envs", "2", "--total-timesteps", "2048"), False),
        (2, (), True),
    ],
    # compiled, the members' units are CartPole's (its test compiles them); the contract test traces these
    ids=["1-member", "3-members", "2-members-2-envs-each", "2-members-sweep"],
)
def test_a_halfcheetah_member_is_its_single_seed_run(tmp_path, num_seeds, flags, sweep):
    """Member k of an N-member HalfCheetah run, first seed 7, is `ppo_continuous_action_torchcompile.py --seed 7+k`
    through one iteration in which the first episode ends (step 1000 of 1024) and the env resets: the same episode,
    the same losses, and in the checkpoint the same weights, Adam moments and normalizer statistics (the obs
    statistics took the ended episode's last obs; the reward statistics every step's return). With two envs each,
    the members' env seeds overlap, so each member's envs are a pool of their own. In a sweep, member k is the run
    with its learning rate, entropy and clip coefficients."""
    seeds_dir = tmp_path / "seeds"
    script = "ppo_continuous_action_seeds_torchcompile.py"
    member_flags = sweep_flags() if sweep else []
    run_script(script, *CHEETAH, *flags, *member_flags, "--seed", "7", "--num-seeds", str(num_seeds), log_dir=seeds_dir)
    (row,) = read_metrics(seeds_dir)
    stacked = torch.load(seeds_dir / "agent.pt", weights_only=True)
    for k in range(num_seeds):
        single_dir = tmp_path / f"seed{7 + k}"
        single_flags = sweep_flags(k) if sweep else []
        run_script(
            "ppo_continuous_action_torchcompile.py",
            *CHEETAH,
            *flags,
            *single_flags,
            "--seed",
            str(7 + k),
            log_dir=single_dir,
        )
        (single,) = read_metrics(single_dir)
        member = row["members"][k]
        assert member["seed"] == 7 + k
        assert member["lr"] == pytest.approx(single["lr"], rel=1e-6)
        assert member["episodic_return"] == pytest.approx(single["episodic_return"], rel=1e-6), k
        for key in LOSSES:
            assert member[key] == pytest.approx(single[key], rel=1e-4, abs=2e-7), (k, key)
        ckpt = torch.load(single_dir / "agent.pt", weights_only=True)
        for name, p in ckpt["agent"].items():
            torch.testing.assert_close(stacked["agent"][name][k], p, rtol=1e-4, atol=1e-6)
        for i, state in ckpt["optimizer"]["state"].items():
            for key in ("exp_avg", "exp_avg_sq"):
                # the moments' small entries carry the gradients' rounding: tolerance on the tensor's scale
                atol = 1e-4 * state[key].abs().max().item()
                torch.testing.assert_close(stacked["optimizer"]["state"][i][key][k], state[key], rtol=1e-3, atol=atol)
        for stats in ("obs_rms", "ret_rms"):
            for key, value in ckpt["normalizer"][stats].items():
                torch.testing.assert_close(stacked["normalizer"][stats][key][k].reshape(value.shape), value)


def test_halfcheetah_members_act_alike_in_torch_and_in_numpy():
    """--no-numpy-act acts for the members in torch (vmapped), the default in numpy: both must normalize the obs and
    act alike, step after step as the statistics move. The numpy path is the one the member-equals-run test compares
    with the base; in torch the batched matmuls round differently, and MuJoCo turns that into another episode."""
    module = load_script("ppo_continuous_action_seeds_torchcompile")
    args = module.Args(num_seeds=3, num_envs=2, seed=5)
    agent, params = module.stack_members(args, 17, 6, torch.device("cpu"))
    inference = {name: p.detach() for name, p in params.items()}
    steps = []
    actor = module.part(inference, "actor_mean")
    for numpy_act in (True, False):
        normalizer = module.Normalizer(args.num_seeds, args.num_envs, 17, 0.99, torch.device("cpu"))
        # the rollout's steps as main builds them on a CPU
        if numpy_act:
            normalize, policy = module.numpy_units(actor, normalizer)
        else:
            shape = (args.num_seeds, args.num_envs, -1)
            normalize = functools.partial(module.torch_normalize, normalizer.obs, torch.device("cpu"), shape)
            policy = functools.partial(module.torch_step, functools.partial(module.act, agent.actor_mean, actor))
        rng = np.random.default_rng(0)
        noise = torch.randn(4, args.num_seeds, args.num_envs, 6, generator=torch.Generator().manual_seed(1))
        if numpy_act:
            noise = noise.numpy()
        out = []
        for step in range(4):
            obs = normalize(rng.normal(size=(args.num_seeds * args.num_envs, 17)) * (step + 1))
            out.append((np.asarray(obs), policy(obs, noise[step])))
        steps.append(out)
    for (obs_np, act_np), (obs_torch, act_torch) in zip(*steps):
        np.testing.assert_allclose(obs_torch, obs_np, rtol=1e-6, atol=1e-6)
        assert act_torch.shape == act_np.shape == (args.num_seeds * args.num_envs, 6)
        np.testing.assert_allclose(act_torch, act_np, rtol=1e-5, atol=1e-6)


def test_the_torch_policy_unit_gives_one_action_per_env_in_a_row_as_numpy_does():
    """The rollout stores a step's actions as one row of every member's envs, member after member. `act` is the unit
    that --compile/--cudagraphs wrap and a CUDA learner acts with (--no-host-actor), so it must return that row itself,
    as the numpy step does (a (num_seeds, num_envs) block cannot be stored there)."""
    module = load_script("ppo_seeds_torchcompile")
    args = module.Args(num_seeds=3, num_envs=4, seed=5)
    agent, params = module.stack_members(args, 4, 2, torch.device("cpu"))
    actor = {name: p.detach() for name, p in module.part(params, "actor").items()}
    obs = np.random.default_rng(0).normal(size=(args.num_seeds * args.num_envs, 4)).astype(np.float32)
    gumbel = (
        -torch.empty(args.num_seeds, args.num_envs, 2).exponential_(generator=torch.Generator().manual_seed(1)).log()
    )
    expected = module.numpy_policy(actor)(obs, gumbel.numpy())
    actions = module.act(agent.actor, actor, torch.from_numpy(obs).view(args.num_seeds, args.num_envs, -1), gumbel)
    assert expected.shape == (args.num_seeds * args.num_envs,)
    np.testing.assert_array_equal(actions.numpy(), expected)
