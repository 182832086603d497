"""PPO continuous control (MuJoCo through envpool): smoke runs of both scripts, the normalizer against a plain numpy
reference, envpool's auto-reset, GAE, the update against autograd and compiled against eager, checkpoints, bad input.

Each script runs with --compile once, and the runs are shared by the assertions through module-scoped fixtures.
"""

import copy
import functools
import signal

import envpool
import gymnasium
import numpy as np
import pytest
import torch

import plumbing
from conftest import (
    SMOKE,
    assert_rejected,
    check_ppo_smoke_logs,
    load_script,
    read_metrics,
    resume_ppo_smoke,
    run_ids,
    run_script,
    script_fixture,
    smoke_fixture,
)
from test_ppo import assert_same_buffers, eager_and_compiled_update, is_current_copy, numpy_gae

SCRIPTS = ("ppo_continuous_action.py", "ppo_continuous_action_torchcompile.py")
# (script, extra flags): plain with --cudagraphs (ignored on CPU) and --save-model, then --compile
RUNS = [(s, flags) for s in SCRIPTS for flags in (("--cudagraphs", "--save-model"), ("--compile",))]
GAMMA = 0.99


base = script_fixture("ppo_continuous_action")
tc = script_fixture("ppo_continuous_action_torchcompile")
smoke = smoke_fixture(RUNS)


@pytest.mark.parametrize("script,flags", RUNS, ids=run_ids(RUNS))
def test_smoke_writes_logs(smoke, script, flags):
    rows, summary = check_ppo_smoke_logs(smoke[script, flags], script, flags, "HalfCheetah-v4", 3e-4)
    for row in rows:
        # HalfCheetah: 6 action dims, entropy 6 * (0.5 + 0.5 log 2 pi + log std) = 8.51 at std 1, moving slowly
        assert abs(row["entropy"] - 8.51) < 0.1
        assert row["episodic_return"] is None  # an episode is 1000 steps: none ends in 256
    if "--compile" in flags:
        assert summary["compile_time"] > 0


@pytest.mark.parametrize("script", SCRIPTS)
def test_checkpoint_holds_the_normalizer_and_resume_restores_it(smoke, script, tmp_path):
    """The normalizer's statistics are in agent.pt, and a resumed run carries on from them: its counts continue
    from the checkpoint's (a fresh normalizer would count only the resumed run's observations)."""
    ckpt = resume_ppo_smoke(script, smoke[script, ("--cudagraphs", "--save-model")][1], tmp_path, "--save-model")
    obs_rms, ret_rms = ckpt["normalizer"]["obs_rms"], ckpt["normalizer"]["ret_rms"]
    assert obs_rms["mean"].shape == (17,) and obs_rms["var"].shape == (17,)
    assert obs_rms["count"].item() == pytest.approx(1e-4 + 1 + 256)  # the reset observation and one per step
    assert ret_rms["count"].item() == pytest.approx(1e-4 + 256)  # one discounted return per step
    resumed = torch.load(tmp_path / "agent.pt", weights_only=True)["normalizer"]
    assert resumed["obs_rms"]["count"].item() == pytest.approx(1e-4 + 257 + 1 + 128)  # envs restart: a new reset
    assert resumed["ret_rms"]["count"].item() == pytest.approx(1e-4 + 384)


def reference_normalizer(obs, rewards, terminated, gamma, clip=10.0, eps=1e-8):
    """Plain numpy, written from the definitions: observations normalized by the mean and variance of all the
    observations seen so far (this one included), with gymnasium's prior of weight 1e-4 at mean 0, variance 1;
    rewards divided by the std of all discounted returns seen so far, each return summed from the env's last
    termination on, that step's reward included (gymnasium's NormalizeReward)."""
    T, N, _ = obs.shape
    w = 1e-4
    norm_obs, scaled = np.zeros_like(obs), np.zeros_like(rewards)
    for t in range(T):
        seen = obs[: t + 1].reshape(-1, obs.shape[2])
        mean = seen.sum(0) / (len(seen) + w)
        var = (w * 1.0 + (seen**2).sum(0)) / (len(seen) + w) - mean**2
        norm_obs[t] = np.clip((obs[t] - mean) / np.sqrt(var + eps), -clip, clip)
    returns = np.zeros_like(rewards)
    for n in range(N):
        start = 0
        for t in range(T):
            start = t if terminated[t, n] else start
            returns[t, n] = sum(gamma ** (t - k) * rewards[k, n] for k in range(start, t + 1))
    for t in range(T):
        seen = returns[: t + 1].reshape(-1)
        mean = seen.sum() / (len(seen) + w)
        var = (w * 1.0 + (seen**2).sum()) / (len(seen) + w) - mean**2
        scaled[t] = np.clip(rewards[t] / np.sqrt(var + eps), -clip, clip)
    return norm_obs, scaled


def normalizer_data():
    """3 envs, 40 steps: observations with offsets and scales far from 0 and 1, episodes terminating at different steps
    (env 1 twice, env 2 never), and one reward large enough to be clipped."""
    rng = np.random.default_rng(0)
    T, N, D = 40, 3, 5
    obs = rng.normal(size=(T, N, D)) * np.array([1.0, 5.0, 0.1, 2.0, 30.0]) + np.array([0.0, 3.0, -1.0, 50.0, 0.0])
    rewards = rng.normal(1.0, 2.0, size=(T, N))
    rewards[39, 0] = 1000.0  # last step: with the 120 returns seen by then, it scales to more than 10
    dones = np.zeros((T, N), dtype=bool)
    dones[[12, 25], 1] = True
    dones[17, 0] = True
    return obs, rewards, dones


def test_normalizer_matches_numpy_reference(base):
    obs, rewards, dones = normalizer_data()
    expected_obs, expected_rewards = reference_normalizer(obs, rewards, dones, GAMMA)
    normalizer = base.Normalizer(obs.shape[1], obs.shape[2], GAMMA)
    got_obs = np.stack([normalizer.obs(o) for o in obs])
    got_rewards = np.stack([normalizer.reward(r, d) for r, d in zip(rewards, dones)])
    np.testing.assert_allclose(got_obs, expected_obs, rtol=1e-7, atol=1e-7)
    np.testing.assert_allclose(got_rewards, expected_rewards, rtol=1e-7, atol=1e-7)
    assert np.abs(got_rewards).max() == 10.0  # the large reward was clipped


def test_torch_normalizer_matches_numpy_reference(tc):
    """The torchcompile script's normalizer: per-step observations, per-step discounted returns on the host, and the
    reward scaling of a whole rollout at once, in two rollouts of 20 steps (the statistics carry over)."""
    obs, rewards, dones = normalizer_data()
    expected_obs, expected_rewards = reference_normalizer(obs, rewards, dones, GAMMA)
    normalizer = tc.Normalizer(obs.shape[1], obs.shape[2], GAMMA, "cpu")
    got_obs = torch.stack([normalizer.obs(torch.from_numpy(o)) for o in obs])
    assert got_obs.dtype == torch.float32
    got_rewards = []
    for part in (slice(0, 20), slice(20, 40)):
        returns = np.stack([normalizer.discounted_return(r, d) for r, d in zip(rewards[part], dones[part])])
        got_rewards.append(normalizer.rewards(torch.from_numpy(rewards[part]), torch.from_numpy(returns)))
    np.testing.assert_allclose(got_obs.numpy(), expected_obs, rtol=1e-5, atol=1e-5)  # float32 out
    np.testing.assert_allclose(torch.cat(got_rewards).numpy(), expected_rewards, rtol=1e-5, atol=1e-5)


def test_compiled_normalizer_updates_the_same_statistics(tc):
    """Under torch.compile the in-place updates of the statistics still reach the normalizer's tensors."""
    obs = torch.from_numpy(normalizer_data()[0])
    eager, compiled = (tc.Normalizer(3, 5, GAMMA, "cpu") for _ in range(2))
    step = torch.compile(compiled.obs)
    for o in obs:
        torch.testing.assert_close(step(o), eager.obs(o))
    for name in ("mean", "var", "count"):
        torch.testing.assert_close(getattr(compiled.obs_rms, name), getattr(eager.obs_rms, name))


def hopper_record(steps=200, seed=3, time_limit=20) -> tuple:
    """Random play in Hopper-v4 through envpool, each ended episode reset at once, with 20-step episodes: some end by
    termination (a fall), some by the time limit. Returns the reset observations in order and every step's raw
    (obs, reward, terminated, truncated)."""
    envs = envpool.make("Hopper-v4", env_type="gymnasium", num_envs=1, seed=seed, max_episode_steps=time_limit)
    resets = [envs.reset()[0][0]]
    record = []
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        obs, reward, terminated, truncated, _ = envs.step(rng.uniform(-1, 1, (1, 3)))
        record.append((obs[0], reward[0], bool(terminated[0]), bool(truncated[0])))
        if terminated[0] or truncated[0]:
            resets.append(envs.reset(np.array([0]))[0][0])
    envs.close()
    return resets, record


class Replay:
    """Replays hopper_record's play whatever the actions, as one env of an envpool pool (step, reset by env ids) and
    as a gymnasium.Env (`single`), so that the scripts and CleanRL's wrappers see the same raw values."""

    def __init__(self, resets, record):
        self.resets = iter(resets)
        self.record = iter(record)

    def reset(self, env_ids=None, **_):
        return next(self.resets)[None].copy(), {}

    def step(self, action):
        obs, reward, terminated, truncated = next(self.record)
        return obs[None].copy(), np.array([reward]), np.array([terminated]), np.array([truncated]), {}

    def single(self):
        replay = self

        class Env(gymnasium.Env):
            observation_space = gymnasium.spaces.Box(-np.inf, np.inf, (11,), np.float64)
            action_space = gymnasium.spaces.Box(-1.0, 1.0, (3,), np.float32)

            def reset(self, seed=None, options=None):
                return replay.reset()[0][0], {}

            def step(self, action):
                obs, reward, terminated, truncated, _ = replay.step(action)
                return obs[0], float(reward[0]), bool(terminated[0]), bool(truncated[0]), {}

        return Env()


def cleanrl_normalized(resets, record) -> tuple:
    """CleanRL's ppo_continuous_action.py normalization of the same play: its make_env's gymnasium wrappers
    (NormalizeObservation, a clip to [-10, 10], NormalizeReward with gamma, a clip; FlattenObservation,
    RecordEpisodeStatistics and ClipAction change no value here) in a vector env that resets an ended env within the
    step (CleanRL's gymnasium 0.29, SAME_STEP in gymnasium 1.x). Returns the observations the agent sees (the first
    after each end is the reset's) and the scaled rewards."""

    def make_env():
        env = Replay(resets, record).single()
        env = gymnasium.wrappers.NormalizeObservation(env)
        env = gymnasium.wrappers.TransformObservation(env, lambda o: np.clip(o, -10, 10), env.observation_space)
        env = gymnasium.wrappers.NormalizeReward(env, gamma=GAMMA)
        return gymnasium.wrappers.TransformReward(env, lambda r: np.clip(r, -10, 10))

    envs = gymnasium.vector.SyncVectorEnv([make_env], autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP)
    obs = [envs.reset()[0]]
    rewards = []
    for _ in record:
        o, r, _, _, _ = envs.step(np.zeros((1, 3), np.float32))
        obs.append(o)
        rewards.append(r)
    return np.array(obs), np.array(rewards)


@pytest.mark.parametrize("how", ["baseline", "torch", "numpy_act"])
def test_normalizers_match_cleanrls_gymnasium_wrappers(how):
    """The scripts' observation normalization and reward scaling, fed a replayed Hopper play (200 steps, episodes
    ending by falls and by the 20-step time limit), give CleanRL's: gymnasium's wrappers as CleanRL's make_env stacks
    them (cleanrl_normalized). Among what that takes: the discounted return behind the reward scale restarts only at a
    termination, with that step's reward (gymnasium's `return * gamma * (1 - terminated) + reward`), never at a
    truncation, and an episode's last observation enters the statistics before the reset's. The baseline is driven as
    its main loop drives it; the torchcompile script through its `rollout` (torch's normalizer, and numpy's)."""
    resets, record = hopper_record()
    assert sum(r[2] for r in record) >= 2 and sum(r[3] for r in record) >= 2  # falls and time limits
    expected_obs, expected_rewards = cleanrl_normalized(resets, record)
    envs = Replay(resets, record)
    steps = len(record)
    if how == "baseline":
        module = load_script("ppo_continuous_action")
        normalizer = module.Normalizer(1, 11, GAMMA)
        obs = [normalizer.obs(envs.reset()[0])]
        rewards = []
        for _ in range(steps):  # as main's rollout
            next_obs, reward, terminated, _, last = module.env_step(envs, np.zeros((1, 3)))
            rewards.append(normalizer.reward(reward, terminated))
            if len(last):
                normalizer.observe(last)
            obs.append(normalizer.obs(next_obs))
        obs, rewards = np.array(obs), np.array(rewards)
    else:
        module = load_script("ppo_continuous_action_torchcompile")
        normalizer = module.Normalizer(1, 11, GAMMA, "cpu")
        buf = {
            k: torch.zeros((steps, 1) + dims)
            for k, dims in (("obs", (11,)), ("actions", (3,)), ("dones", ()), ("rewards", ()))
        }
        agent = module.Agent(11, 3).requires_grad_(False)
        # a CPU learner's rollout acts on the host, in torch or numpy: the compiled units are not needed
        normalize, policy = host_steps(module, agent.actor_mean, normalizer, how == "numpy_act")
        last = module.rollout(
            envs,
            policy,
            normalize,
            how == "numpy_act",
            normalizer,
            normalize(envs.reset()[0]),
            np.zeros(1, dtype=bool),
            buf,
            torch.zeros(steps, 1, 3),
            (-np.ones(3), np.ones(3)),
        )[0]
        obs = np.concatenate([buf["obs"].detach().numpy(), np.asarray(last)[None]])
        rewards = buf["rewards"].numpy()
    np.testing.assert_allclose(rewards, expected_rewards, rtol=1e-5, atol=1e-5, err_msg="rewards")
    np.testing.assert_allclose(obs, expected_obs, rtol=1e-5, atol=1e-5, err_msg="observations")


@pytest.mark.parametrize("name", ["ppo_continuous_action", "ppo_continuous_action_torchcompile"])
def test_auto_reset_keeps_every_transition_real(name):
    """envpool resets an env on the step after its episode ended (reward 0, action ignored). env_step resets at
    once: with 5-step episodes, episodes end every 5 steps (not 6), no reward is the dead step's 0, and the logged
    return is the sum of the episode's raw rewards."""
    module = load_script(name)
    envs = envpool.make("HalfCheetah-v4", env_type="gymnasium", num_envs=2, seed=3, max_episode_steps=5)
    envs.reset()
    episodes = plumbing.Episodes(2)
    actions = np.random.default_rng(0).uniform(-1, 1, size=(15, 2, 6))
    rewards, dones = [], []
    for a in actions:
        _, reward, _, done, _ = module.env_step(envs, a)
        episodes.record(reward, done)
        rewards.append(reward)
        dones.append(done)
    rewards, dones = np.array(rewards), np.array(dones)
    assert [t for t in range(15) if dones[t, 0]] == [4, 9, 14] and (dones[:, 0] == dones[:, 1]).all()
    assert (rewards != 0).all()
    expected = [rewards[s : s + 5, n].sum() for s in (0, 5, 10) for n in (0, 1)]
    np.testing.assert_allclose(list(episodes.finished), expected, rtol=1e-5)  # float32 rewards, summed in another order


@pytest.mark.parametrize("n_envs", [1, 3])
def test_gae_matches_numpy_reference(tc, n_envs):
    rng = np.random.default_rng(n_envs)
    T = 64
    rewards, values = rng.normal(size=(T, n_envs)), rng.normal(size=(T, n_envs))
    dones = (rng.random((T, n_envs)) < 0.1).astype(np.float64)
    next_value, next_done = rng.normal(size=n_envs), (rng.random(n_envs) < 0.5).astype(np.float64)
    f32 = functools.partial(torch.tensor, dtype=torch.float32)
    adv, ret = tc.gae(f32(next_value), f32(next_done), f32(rewards), f32(dones), f32(values), GAMMA, 0.95)
    expected = numpy_gae(rewards, dones, values, next_value, next_done, GAMMA, 0.95)
    np.testing.assert_allclose(adv.numpy(), expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ret.numpy(), expected + values, rtol=1e-4, atol=1e-4)


def random_batch(n):
    g = torch.Generator().manual_seed(1)
    return [
        torch.randn(n, 17, generator=g),
        torch.randn(n, 6, generator=g),
        -8.5 + torch.randn(n, generator=g),
        torch.randn(n, generator=g),
        torch.randn(n, generator=g),
        torch.randn(n, generator=g),
    ]


def make_update_state(tc, seed):
    torch.manual_seed(seed)
    agent = tc.Agent(17, 6)
    with torch.no_grad():
        agent.actor_logstd.uniform_(-0.5, 0.5)  # a std other than 1, so that the Gaussian's formulas are exercised
    lr = torch.tensor(3e-4)
    return agent, tc.make_optimizer(agent, lr, capturable=False), lr


def test_update_matches_autograd_with_torch_distributions(base, tc):
    """The torchcompile `update` (hand-written Gaussian log-prob and entropy, func.grad, functional Adam) against the
    baseline: its Agent (torch.distributions.Normal) and the plain loss.backward(); clip; Adam.step()."""
    args = tc.Args()
    agent, optimizer, lr = make_update_state(tc, 0)
    reference = base.Agent(17, 6)
    reference.load_state_dict(agent.state_dict())
    ref_opt = torch.optim.Adam(reference.parameters(), lr=3e-4, eps=1e-5)
    obs, actions, logprobs, advantages, returns, values = random_batch(256)
    inds = torch.randperm(256)[:64]
    for _ in range(3):  # a few steps, so Adam's moments and bias correction are exercised
        stats = tc.update(agent, optimizer, args, obs, actions, logprobs, advantages, returns, values, inds)
        _, newlogprob, entropy, newvalue = reference.get_action_and_value(obs[inds], actions[inds])
        ratio = (newlogprob - logprobs[inds]).exp()
        adv = (advantages[inds] - advantages[inds].mean()) / (advantages[inds].std() + 1e-8)
        pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(0.8, 1.2)).mean()
        newvalue = newvalue.view(-1)
        v_clipped = values[inds] + (newvalue - values[inds]).clamp(-0.2, 0.2)
        v_loss = 0.5 * torch.max((newvalue - returns[inds]) ** 2, (v_clipped - returns[inds]) ** 2).mean()
        loss = pg_loss - args.ent_coef * entropy.mean() + args.vf_coef * v_loss
        ref_opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), args.max_grad_norm)
        ref_opt.step()
        torch.testing.assert_close(
            stats[2:5], torch.stack([pg_loss, v_loss, entropy.mean()]).detach(), rtol=1e-5, atol=1e-6
        )
    for (name, p), q in zip(agent.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7, msg=name)


def test_compiled_update_matches_eager(tc):
    """Same seed and state: the compiled update gives the eager update's losses and parameters.
    Tolerance: float32 with the reductions reordered by inductor, a few ulps on O(1) values. Adam's first step moves
    a parameter by lr * g / (|g| + eps), at most lr, and is sensitive to gradient rounding only where |g| ~ eps:
    parameters must agree within 1% of lr (seen: 0.05%)."""
    (_, p0, v0), (_, p1, v1) = eager_and_compiled_update(
        tc, make_update_state, random_batch(256), torch.randperm(256)[:64], torch.compile
    )
    for a, b in zip(p0, p1):
        torch.testing.assert_close(b, a, rtol=0, atol=0.01 * tc.Args().learning_rate)
    for a, b in zip(v0, v1):  # Adam's second moments: the squared gradients
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-12)


def test_rollout_noise_samples_the_policy_gaussian(tc):
    """act() = mean + rollout_noise: its samples have the policy's mean and std, per action dimension."""
    torch.manual_seed(0)
    agent = make_update_state(tc, 0)[0]
    x = torch.zeros(1, 17)
    with torch.no_grad():
        samples = tc.act(agent.actor_mean, x, agent.rollout_noise((100_000, 1, 6), torch.Generator().manual_seed(0)))
        mean, std = agent.actor_mean(x)[0], agent.actor_logstd.exp()[0]
    torch.testing.assert_close(samples.mean((0, 1)), mean, rtol=0, atol=0.02)  # ~5 standard errors
    torch.testing.assert_close(samples.std((0, 1)), std, rtol=0.02, atol=0)


def host_steps(tc, actor, normalizer, numpy_act: bool):
    """The rollout's normalizer and policy steps as main builds them where the rollout acts on the host (a CPU
    learner's actor_mean, or the --host-actor copy): in numpy with `numpy_act`, else in torch, eagerly."""
    if numpy_act:
        return tc.numpy_units(actor, normalizer)
    normalize = functools.partial(tc.torch_normalize, normalizer.obs, torch.device("cpu"))
    return normalize, functools.partial(tc.torch_step, functools.partial(tc.act, actor))


def cheetah_rollout(tc, actor, num_steps=64, seed=3, numpy_act=False):
    """One rollout of a fresh HalfCheetah from a fixed seed (env, noise), acting with `actor` as a CPU learner acts
    with its own (main's acting choice: in torch, or in numpy with `numpy_act`), and a fresh normalizer: the buffers
    and the normalizer's statistics afterwards."""
    envs = envpool.make("HalfCheetah-v4", env_type="gymnasium", num_envs=1, seed=seed)
    normalizer = tc.Normalizer(1, 17, GAMMA, "cpu")
    buf = {
        k: torch.zeros((num_steps, 1) + dims)
        for k, dims in (("obs", (17,)), ("actions", (6,)), ("dones", ()), ("rewards", ()))
    }
    noise = 0.5 * torch.randn(num_steps, 1, 6, generator=torch.Generator().manual_seed(seed))
    normalize, policy = host_steps(tc, actor, normalizer, numpy_act)
    tc.rollout(
        envs,
        policy,
        normalize,
        numpy_act,
        normalizer,
        normalize(envs.reset()[0]),
        np.zeros(1, dtype=bool),
        buf,
        noise,
        (envs.action_space.low, envs.action_space.high),
    )
    envs.close()
    return dict(buf, **{f"{name}.{k}": v for name, s in normalizer.state_dict().items() for k, v in s.items()})


class FirstRollout(Exception):
    """Raised by the stand-in rollout: main has built its units, nothing more is needed."""


def main_units(tc, tmp_path, **flags) -> dict:
    """What `main` acts and learns with, as its first rollout receives them: a CPU run stopped there. The agents are
    the two `main` makes, in order: the learner, then its inference copy."""
    agents = []
    seen = {}

    class Agent(tc.Agent):
        def __init__(self, *shape):
            super().__init__(*shape)
            agents.append(self)

    def first_rollout(envs, policy, normalize, numpy_act, normalizer, next_obs, next_done, buf, noise, *_):
        seen.update(policy=policy, normalize=normalize, normalizer=normalizer, next_obs=next_obs, noise=noise)
        raise FirstRollout

    threads = torch.get_num_threads()
    args = tc.Args(cuda=False, num_steps=64, total_timesteps=64, log_dir=str(tmp_path / "run"), **flags)
    with pytest.MonkeyPatch.context() as patch:  # undone on return: the caller's rollouts are the real ones
        patch.setattr(tc, "Agent", Agent)
        patch.setattr(tc, "rollout", first_rollout)
        patch.setattr(signal, "signal", lambda *_: None)  # the test process keeps its own Ctrl-C
        with pytest.raises(FirstRollout):
            tc.main(args)
    torch.set_num_threads(threads)
    return dict(seen, agent=agents[0], agent_inference=agents[1])


def test_a_cpu_learner_acts_with_the_learner_itself(tc, tmp_path):
    """A CPU learner acts with its inference copy's actor_mean (the agent's storage, no copy, nothing to refresh),
    even with --host-actor (the default), and keeps the normalizer on the CPU: the rollout's normalize step merges
    into the statistics main checkpoints, and its policy step acts with the learner's weights as they are now."""
    u = main_units(tc, tmp_path, numpy_act=False)
    agent = u["agent"]
    acting = u["agent_inference"].actor_mean
    assert acting[0].weight.data_ptr() == agent.actor_mean[0].weight.data_ptr()
    assert not any(p.requires_grad for p in acting.parameters())
    normalizer = u["normalizer"]
    assert u["next_obs"].device.type == "cpu" and normalizer.obs_rms.mean.device.type == "cpu"
    reference = tc.Normalizer(1, 17, GAMMA, "cpu")
    reference.load_state_dict(normalizer.state_dict())
    raw = np.random.default_rng(0).normal(size=(1, 17)) * 3 + 1
    assert torch.equal(u["normalize"](raw), reference.obs(torch.from_numpy(raw)))
    for name, stats in reference.state_dict().items():
        for key, value in stats.items():
            assert torch.equal(value, normalizer.state_dict()[name][key]), (name, key)
    obs, noise = u["next_obs"], u["noise"][0]
    before = u["policy"](obs, noise)
    with torch.no_grad():
        agent.actor_mean[0].weight.add_(1.0)
        agent.actor_mean[4].bias.add_(1.0)  # the output layer's weights are small (std 0.01): moved here too
    after = u["policy"](obs, noise)
    assert np.abs(after - before).max() > 1e-2
    assert np.array_equal(after, tc.act(agent.actor_mean, obs, noise).detach().numpy())


def test_host_copy_acts_as_the_learner_and_refresh_brings_the_updates(tc, tmp_path):
    """--host-actor (a CUDA learner) acts with a host copy of actor_mean, refreshed after the updates, and the
    normalizer on the host. Here the copy is made on the CPU explicitly, with storage of its own: a rollout acting
    with it fills the buffers (and normalizer statistics) that one acting with the learner's actor_mean fills,
    exactly; after updates a stale copy's rollout differs, and a refreshed one is the learner's again."""
    u = main_units(tc, tmp_path, numpy_act=False)
    agent = u["agent"]
    learner_actor = u["agent_inference"].actor_mean
    acting = tc.host_copy(agent.actor_mean, torch.device("cpu"))
    assert is_current_copy(acting, agent.actor_mean)
    assert_same_buffers(cheetah_rollout(tc, acting), cheetah_rollout(tc, learner_actor))
    lr = torch.tensor(0.01)  # a few large steps
    update = functools.partial(tc.update, agent, tc.make_optimizer(agent, lr, capturable=False), tc.Args())
    batch = random_batch(256)
    for _ in range(3):
        update(*batch, torch.randperm(256)[:64])
    learner = cheetah_rollout(tc, learner_actor)
    numpy_learner = cheetah_rollout(tc, learner_actor, numpy_act=True)
    assert not is_current_copy(acting, agent.actor_mean)
    assert_same_buffers(cheetah_rollout(tc, acting), learner, same=False)  # stale: acts otherwise
    assert_same_buffers(cheetah_rollout(tc, acting, numpy_act=True), numpy_learner, same=False)
    tc.refresh(acting, agent.actor_mean)
    assert is_current_copy(acting, agent.actor_mean)
    assert_same_buffers(cheetah_rollout(tc, acting), learner)
    assert_same_buffers(cheetah_rollout(tc, acting, numpy_act=True), numpy_learner)


@pytest.mark.parametrize("numpy_act", [False, True])
def test_a_cuda_learner_acts_with_a_host_copy_that_refresh_brings_up_to_date(tc, tmp_path, numpy_act):
    """What main builds for a CUDA learner with --host-actor, built as main builds it (the host path touches no CUDA,
    so a CPU learner stands in): the steps on a copy of its own, stale after updates until `refresh`, and the
    normalizer's statistics on the host."""
    u = main_units(tc, tmp_path, numpy_act=False)
    agent = u["agent"]
    acting = tc.host_copy(agent.actor_mean, torch.device("cpu"))
    normalizer = tc.Normalizer(1, 17, GAMMA, torch.device("cpu"))
    normalize, policy = host_steps(tc, acting, normalizer, numpy_act)
    rng = np.random.default_rng(0)
    obs = normalize(rng.normal(size=(1, 17)))
    noise = torch.from_numpy(rng.normal(size=(1, 1, 6)).astype(np.float32))[0]
    if numpy_act:
        noise = noise.numpy()

    def learner_actions():
        with torch.no_grad():
            return tc.act(agent.actor_mean, torch.as_tensor(obs), torch.as_tensor(noise)).numpy()

    np.testing.assert_allclose(policy(obs, noise), learner_actions(), rtol=0, atol=1e-5)
    lr = torch.tensor(0.01)
    update = functools.partial(tc.update, agent, tc.make_optimizer(agent, lr, capturable=False), tc.Args())
    batch = random_batch(256)
    for _ in range(3):
        update(*batch, torch.randperm(256)[:64])
    assert np.abs(policy(obs, noise) - learner_actions()).max() > 1e-2  # the copy has storage of its own
    tc.refresh(acting, agent.actor_mean)
    np.testing.assert_allclose(policy(obs, noise), learner_actions(), rtol=0, atol=1e-5)


def test_numpy_units_match_torch_and_follow_the_learner(tc, tmp_path):
    """--numpy-act (on by default where the rollout acts on a CPU): numpy's normalizer gives the torch unit's
    normalized obs exactly and its float64 statistics to the last bits; numpy's actions are torch's to float rounding,
    before and after updates that move them, because both read views of the tensors. Units over a copy taken once
    must fail (checked below). main() acts through them by default on a CPU."""
    u = main_units(tc, tmp_path)
    assert isinstance(u["next_obs"], np.ndarray) and u["noise"].device.type == "cpu"  # the rollout takes a view
    agent = u["agent"]
    actor = u["agent_inference"].actor_mean
    torch_normalizer = tc.Normalizer(3, 17, GAMMA, "cpu")
    numpy_normalizer = tc.Normalizer(3, 17, GAMMA, "cpu")
    normalize, policy = tc.numpy_units(actor, numpy_normalizer)
    _, taken_once = tc.numpy_units(copy.deepcopy(actor), tc.Normalizer(3, 17, GAMMA, "cpu"))
    rng = np.random.default_rng(0)
    for _ in range(50):
        raw = rng.normal(size=(3, 17)) * 3 + 1
        assert np.array_equal(normalize(raw), torch_normalizer.obs(torch.from_numpy(raw)).numpy())
    for name, stats in torch_normalizer.state_dict().items():
        for key, value in stats.items():
            torch.testing.assert_close(value, numpy_normalizer.state_dict()[name][key], rtol=1e-12, atol=0)
    obs = normalize(rng.normal(size=(3, 17)))
    noise = rng.normal(size=(3, 6)).astype(np.float32)

    def torch_actions():
        return tc.act(actor, torch.from_numpy(obs), torch.from_numpy(noise)).numpy()

    before = torch_actions()
    np.testing.assert_allclose(policy(obs, noise), before, atol=1e-5)
    lr = torch.tensor(0.01)
    update = functools.partial(tc.update, agent, tc.make_optimizer(agent, lr, capturable=False), tc.Args())
    batch = random_batch(256)
    for _ in range(3):
        update(*batch, torch.randperm(256)[:64])
    after = torch_actions()
    assert np.abs(after - before).max() > 1e-2  # the updates moved the policy
    np.testing.assert_allclose(policy(obs, noise), after, atol=1e-5)
    assert np.array_equal(u["policy"](obs, noise), policy(obs, noise))  # main's step: numpy, on the learner's weights
    assert np.abs(taken_once(obs, noise) - after).max() > 1e-2


DISCRETE = [
    (["--env-id", "CartPole-v1"], ["CartPole-v1", "classic-control", "leanrl/ppo.py"]),
    (["--env-id", "Breakout-v5"], ["Breakout-v5", "Atari", "ppo_atari_envpool.py"]),
]
BAD_INPUT = [
    (["--env-id", "CheetahRun-v1"], ["CheetahRun-v1", "HalfCheetah-v4"]),
    (["--num-minibatches", "3"], ["does not divide"]),
    (["--resume", "/nonexistent/agent.pt"], ["no such file"]),
]
# one discrete-action id against each script; the other mistakes share check_args, so one script covers them
CASES = [(s, *case) for s, case in zip(SCRIPTS, DISCRETE)] + [(SCRIPTS[1], *case) for case in BAD_INPUT]


@pytest.mark.parametrize("script,flags,words", CASES, ids=[f"{s[:-3]} {' '.join(f)}" for s, f, _ in CASES])
def test_bad_input(script, flags, words, log_dir):
    assert_rejected(script, flags, words, log_dir)


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_classic_control_task_with_continuous_actions_trains(script, log_dir):
    """Pendulum-v1 (envpool's, a Box action in [-2, 2]) is what the continuous scripts are for, as CleanRL's
    ppo_continuous_action.py takes any Box-action env: a smoke run of it goes through, its return a Pendulum's
    (every step's reward is in [-16.3, 0], an episode is 200 steps)."""
    run_script(script, "--env-id", "Pendulum-v1", *SMOKE[:4], "--total-timesteps", "512", log_dir=log_dir)
    rows = read_metrics(log_dir)
    assert rows[-1]["global_step"] == 512
    assert -16.3 * 200 <= rows[-1]["episodic_return"] <= 0
