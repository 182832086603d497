"""PPO Atari (envpool): smoke runs of both scripts, the game-score statistics, compiled-vs-eager update, bad input.

Compiling the Nature CNN costs tens of seconds per process, so each script runs with --compile once, and the
runs are shared by the assertions through module-scoped fixtures.
"""

import copy
from functools import partial
from operator import attrgetter

import envpool
import numpy as np
import pytest
import torch
from tensordict import TensorDict

import plumbing
from conftest import (
    SMOKE,
    assert_user_error,
    check_ppo_smoke_logs,
    load_script,
    resume_ppo_smoke,
    run_ids,
    run_script,
    script_fixture,
    smoke_fixture,
)

SCRIPTS = ("ppo_atari_envpool.py", "ppo_atari_envpool_torchcompile.py")
# (script, extra flags): plain with --cudagraphs (ignored on CPU) and --save-model, then --compile; and the main loop on
# two env pools (off by default on a CPU), 2 envs x 32 steps for the same 64 steps an iteration
RUNS = [(s, flags) for s in SCRIPTS for flags in (("--cudagraphs", "--save-model"), ("--compile",))] + [
    ("ppo_atari_envpool_torchcompile.py", ("--split-envs", "--num-envs", "2", "--num-steps", "32"))
]


tc = script_fixture("ppo_atari_envpool_torchcompile")
smoke = smoke_fixture(RUNS)


@pytest.mark.parametrize("script,flags", RUNS, ids=run_ids(RUNS))
def test_smoke_writes_logs(smoke, script, flags):
    proc, _ = smoke[script, flags]
    rows, summary = check_ppo_smoke_logs(smoke[script, flags], script, flags, "Breakout-v5", 2.5e-4)
    assert all(0 < row["entropy"] <= np.log(4) + 1e-5 for row in rows)  # Breakout has 4 actions
    if script == "ppo_atari_envpool_torchcompile.py":  # a compiled run says, once, that its first iteration compiles
        assert proc.stderr.count("compiling the units on their first call") == ("--compile" in flags)
        assert summary["flags"]["split_envs"] == ("--split-envs" in flags or torch.cuda.is_available())


@pytest.mark.parametrize("script", SCRIPTS)
def test_resume_continues_from_the_checkpoint(smoke, script, tmp_path):
    resume_ppo_smoke(script, smoke[script, ("--cudagraphs", "--save-model")][1], tmp_path)


def test_inference_copy_shares_storage_and_needs_no_grad(tc):
    agent = tc.Agent(4)
    twin = tc.inference_copy(agent)
    pairs = [(p, attrgetter(name)(twin)) for name, p in agent.named_parameters()]
    assert len(pairs) == 12  # 3 convs, the 3136x512 layer, actor and critic: weight and bias each
    for p, q in pairs:
        assert p.requires_grad and not q.requires_grad
        assert p.data_ptr() == q.data_ptr()
    with torch.no_grad():  # an optimizer step on the agent is seen by the copy, with no copying
        agent.critic.bias.add_(1.0)
    assert torch.equal(twin.critic.bias, agent.critic.bias)
    obs = torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8)
    assert not any(t.requires_grad for t in tc.policy(twin, obs, torch.zeros(2, 4)))


def rollouts(tc, num_envs: int, split: bool, seed: int, rounds: int = 3, num_steps: int = 64):
    """`rounds` rollouts of the script's own pools, units and rollout, from a fixed agent and noise: the buffers
    [rounds, steps, envs], the game statistics, and the last next_obs and next_done."""
    args = tc.Args(num_envs=num_envs, num_steps=num_steps, split_envs=split)
    pools = tc.make_pools(args, seed=seed)
    assert len(pools) == (2 if split else 1)
    torch.manual_seed(0)
    agent = tc.Agent(4)
    acts = [partial(tc.policy, tc.inference_copy(agent)) for _ in pools]
    stats, rng = plumbing.AtariEpisodes(num_envs, window=1000), torch.Generator().manual_seed(0)
    next_obs = torch.from_numpy(np.concatenate([envs.reset()[0] for _, envs in pools]))
    next_done, shape, bufs = torch.zeros(num_envs), (num_steps, num_envs), []
    for _ in range(rounds):
        buf = TensorDict(
            obs=torch.zeros(shape + (4, 84, 84), dtype=torch.uint8),
            actions=torch.zeros(shape, dtype=torch.long),
            logprobs=torch.zeros(shape),
            rewards=torch.zeros(shape),
            dones=torch.zeros(shape),
            values=torch.zeros(shape),
            batch_size=shape,
        )
        gumbel = -torch.empty(shape + (4,)).exponential_(generator=rng).log()
        games, _, _ = tc.rollout(pools, acts, next_obs, next_done, buf, gumbel)
        stats.record_steps(games)
        bufs.append(buf)
    for _, envs in pools:
        envs.close()
    return torch.stack(bufs), stats, next_obs, next_done


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_gae_bootstraps_from_the_agents_value_and_matches_numpy_reference(tc, compiled):
    """The GAE unit computes the last observations' value itself (one graph under CUDA graphs), and its advantages
    are the independent reference's for that bootstrap value."""
    from test_ppo import numpy_gae

    torch.manual_seed(0)
    agent = tc.Agent(4)
    T, N, gamma, lam = 16, 3, 0.99, 0.95
    next_obs = torch.randint(0, 256, (N, 4, 84, 84), dtype=torch.uint8)
    rewards, values = torch.randn(T, N), torch.randn(T, N)
    dones = (torch.rand(T, N) < 0.15).float()
    next_done = torch.tensor([0.0, 1.0, 0.0])
    unit = partial(tc.gae, agent, gamma=gamma, gae_lambda=lam)
    with torch.no_grad():
        next_value = agent.get_value(next_obs)
        adv, ret = (torch.compile(unit) if compiled else unit)(next_obs, next_done, rewards, values, dones)
    expected = numpy_gae(*(x.double().numpy() for x in (rewards, dones, values, next_value, next_done)), gamma, lam)
    np.testing.assert_allclose(adv.numpy(), expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ret.numpy(), expected + values.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("num_envs", [4, 3])
def test_split_rollout_equals_single_pool(tc, num_envs):
    """--split-envs changes no transition: the same seed, agent and noise give the same buffers as one pool, over 3
    rollouts of 64 steps (seed 2: every env scores and loses lives, and a game ends). Exact: obs, actions, rewards,
    dones, the episode statistics (the running score of every env too: a wrong env offset shows there). The policy
    runs on half batches, whose convolutions may sum in another order: logprobs and values within 1e-5 relative,
    1e-6 absolute (measured: 1.2e-7 and 4.8e-7 absolute)."""
    split, stats_s, obs_s, done_s = rollouts(tc, num_envs, split=True, seed=2)
    single, stats_1, obs_1, done_1 = rollouts(tc, num_envs, split=False, seed=2)
    per_env = single["rewards"].sum((0, 1)), single["dones"].sum((0, 1))
    assert (per_env[0] > 0).all() and (per_env[1] > 0).all() and stats_1.finished  # the teeth the docstring says
    for key in ("obs", "actions", "rewards", "dones"):
        assert torch.equal(split[key], single[key]), key
    torch.testing.assert_close(split["logprobs"], single["logprobs"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(split["values"], single["values"], rtol=1e-5, atol=1e-6)
    assert torch.equal(obs_s, obs_1) and torch.equal(done_s, done_1)
    assert np.array_equal(stats_s.ret, stats_1.ret)
    assert list(stats_s.finished) == list(stats_1.finished) and list(stats_s.lengths) == list(stats_1.lengths)


def test_episode_stats_hand_built_sequence():
    """Two envs coming back in either order (as envpool's async recv returns them): per-life terminations must not
    end a game, only info["terminated"] (lives exhausted) or the time limit does, and the score is unclipped."""
    stats = plumbing.AtariEpisodes(num_envs=2)
    steps = [  # env_id, reward (unclipped), info terminated (game over), truncated, elapsed_step
        ([0, 1], [1.0, 7.0], [False, False], [False, False], [1, 1]),
        ([1, 0], [4.0, 0.0], [False, False], [False, False], [2, 2]),  # a lost life shows only in the 5-tuple
        ([0, 1], [4.0, 1.0], [True, False], [False, False], [3, 3]),  # env 0: game over, 1 + 0 + 4
        ([1, 0], [0.0, 7.0], [False, False], [True, False], [4, 1]),  # env 1: time limit, 7 + 4 + 1 + 0
        ([0, 1], [1.0, 1.0], [True, True], [False, False], [2, 1]),  # env 0: 7 + 1; env 1: a fresh 1-step game
    ]
    for ids, reward, terminated, truncated, elapsed in steps:
        info = dict(
            env_id=np.array(ids),
            reward=np.array(reward),
            terminated=np.array(terminated),
            elapsed_step=np.array(elapsed),
        )
        stats.step(info, np.array(truncated))
    assert list(stats.finished) == [5.0, 12.0, 8.0, 1.0]
    assert list(stats.lengths) == [3, 4, 2, 1]
    assert stats.mean() == pytest.approx(6.5)
    assert stats.mean_length() == pytest.approx(2.5)


@pytest.mark.parametrize(
    "name,pool", [("ppo_atari_envpool", {}), ("ppo_atari_envpool_torchcompile", {"num_envs": 2})]
)  # one pool of 2
def test_episode_return_is_the_full_unclipped_game_score(name, pool):
    """The scripts' envs and game statistics (plumbing.AtariEpisodes), stepped with a fixed action sequence, against
    an independent count: a twin envpool instance without reward clipping, same seed and actions (so the same frames),
    whose 5-tuple rewards are summed until its lives reach 0."""
    module = load_script(name)
    args = module.Args(num_envs=2)
    envs, twin = (
        module.make_envs(args, seed=7, **pool),
        envpool.make("Breakout-v5", env_type="gym", num_envs=2, episodic_life=True, reward_clip=False, seed=7),
    )
    stats = plumbing.AtariEpisodes(args.num_envs, window=1000)
    obs, _ = envs.reset()
    twin_obs, _ = twin.reset()
    score, expected, clipped_seen = np.zeros(2), [], set()
    actions = np.random.default_rng(0).integers(0, 4, size=(3000, 2))  # FIRE is 1 in 4: lives go fast
    for a in actions:
        obs, reward, terminated, truncated, info = envs.step(a)
        twin_obs, twin_reward, _, twin_truncated, twin_info = twin.step(a)
        assert np.array_equal(obs, twin_obs)  # same game, frame for frame
        stats.step(info, truncated)
        clipped_seen.update(reward.tolist())
        score += twin_reward
        for i in np.flatnonzero((twin_info["lives"] == 0) | twin_truncated):
            expected.append(score[i])
            score[i] = 0.0
    assert len(expected) >= 5, "the action sequence must finish several games"
    assert list(stats.finished) == expected
    assert clipped_seen <= {0.0, 1.0}  # the training reward is clipped; the logged score is not
    assert max(expected) > 0


@pytest.mark.parametrize(
    "bf16",
    [
        False,
        pytest.param(
            True,
            marks=pytest.mark.skipif(
                not torch.ops.mkldnn._is_mkldnn_bf16_supported(),
                reason="this CPU has no native bf16 (AVX512-BF16 or AMX): the script runs its trunk in fp32 here, "
                "and eager and Inductor's emulated bf16 round differently",
            ),
        ),
    ],
    ids=["fp32", "bf16"],
)
def test_compiled_update_matches_eager(tc, bf16):
    """One minibatch step of `update`, eager and under torch.compile, from the same agent and data.
    Tolerances: in fp32 inductor only reorders sums (fused kernels), ~1e-6 relative on losses and gradients
    (measured: 3e-7 of the gradient norm). Under bf16 autocast each conv/linear output is rounded to 8 mantissa bits
    (2^-8 = 0.4%) and eager and inductor may round at different points, so losses get 1e-2 relative and gradients
    are compared by direction (cosine) and norm (measured here: both paths use the same oneDNN kernels and agree to
    1e-8). Adam's first step moves each parameter by lr * g / (|g| + eps), at most lr, and is sensitive to gradient
    error only where |g| ~ eps: parameters must agree within 1% of lr in fp32 (measured 0.04%). In bf16 a parameter
    whose gradient is that small can move differently by a good part of lr (4 of 8,192 conv weights by 16% of lr on a
    Zen 4 CPU, 0 on an Intel AMX one), so there all must agree within lr and at most 0.5% of the entries (of all
    parameters) may differ by over 5% of lr."""
    torch.manual_seed(0)
    args = tc.Args()
    n = 64
    data = (
        torch.randint(0, 256, (n, 4, 84, 84), dtype=torch.uint8),
        torch.randint(0, 4, (n,)),
        torch.randn(n) * 0.1 - 1.4,
        torch.randn(n),
        torch.randn(n),
        torch.randn(n),
    )
    results = []
    for compiled in (False, True):
        torch.manual_seed(1)
        agent = tc.Agent(4, bf16=bf16)
        optimizer = torch.optim.Adam(agent.parameters(), lr=torch.tensor(args.learning_rate), eps=1e-5)
        before = copy.deepcopy(agent.state_dict())
        step = partial(tc.update, agent, optimizer, args)
        stats = (torch.compile(step) if compiled else step)(*data)
        grads = torch.cat([p.grad.flatten() for p in agent.parameters()])
        results.append((before, stats, grads, agent.state_dict()))
    (before_e, stats_e, grads_e, after_e), (before_c, stats_c, grads_c, after_c) = results
    for k in before_e:
        assert torch.equal(before_e[k], before_c[k])
    assert not torch.equal(after_e["critic.weight"], before_e["critic.weight"])  # the step happened
    if bf16:
        torch.testing.assert_close(stats_c, stats_e, rtol=1e-2, atol=1e-4)
        assert torch.nn.functional.cosine_similarity(grads_c, grads_e, dim=0) > 0.999
        assert grads_c.norm() == pytest.approx(grads_e.norm().item(), rel=1e-2)
    else:
        torch.testing.assert_close(stats_c, stats_e, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(grads_c, grads_e, rtol=1e-4, atol=1e-6)
    diff = torch.cat([(after_c[k] - after_e[k]).abs().flatten() for k in after_e]) / args.learning_rate
    if bf16:
        assert diff.max() <= 1 and (diff > 0.05).float().mean() <= 0.005, (diff.max(), (diff > 0.05).sum())
    else:
        assert diff.max() <= 0.01, diff.max()


@pytest.mark.parametrize("script", [*SCRIPTS, "ppo_atari_envpool_compile_async_torchcompile.py"])
def test_classic_control_id_names_the_right_script(script, log_dir):
    proc = run_script(script, "--env-id", "CartPole-v1", *SMOKE, log_dir=log_dir, check=False)
    assert_user_error(proc, "CartPole-v1", "classic-control", "leanrl/ppo.py")
    assert not log_dir.exists()  # nothing ran


@pytest.mark.parametrize("script", [*SCRIPTS, "ppo_atari_envpool_compile_async_torchcompile.py"])
def test_mujoco_id_is_refused(script, log_dir):
    proc = run_script(script, "--env-id", "HalfCheetah-v4", *SMOKE, log_dir=log_dir, check=False)
    assert_user_error(proc, "HalfCheetah-v4", "continuous-action", "Atari")
    assert not log_dir.exists()


def test_unknown_env_id(log_dir):
    proc = run_script(
        "ppo_atari_envpool_torchcompile.py", "--env-id", "Breakout-v99", *SMOKE, log_dir=log_dir, check=False
    )
    assert_user_error(proc, "unknown env id", "Breakout-v5")
