"""PPO for continuous control (MuJoCo through envpool, HalfCheetah-v4): the eager baseline.

CleanRL's `ppo_continuous_action.py` algorithm, network and defaults, written plainly: a Gaussian policy with a
state-independent log-std, Python loops, one autograd step per minibatch. CleanRL gets observation normalization,
reward scaling and action clipping from gymnasium wrappers; here they are written out (`RunningMeanStd`,
`Normalizer`) with the wrappers' semantics, shared by all envs, and saved in the checkpoint with the agent.
It is the yardstick `ppo_continuous_action_torchcompile.py` is measured against.

    python leanrl/ppo_continuous_action.py                  # 1M steps of HalfCheetah-v4
    python leanrl/ppo_continuous_action.py --compile        # the same code under a naive torch.compile of the agent
"""

import time
from dataclasses import dataclass
from typing import Optional

import envpool
import numpy as np
import torch
import torch.nn as nn
from torch.distributions.normal import Normal

import plumbing

SCRIPT = plumbing.script_name(__file__)


@dataclass
class Args:
    exp_name: str = SCRIPT
    """the name of this experiment, recorded with the flags (summary.json, wandb's config); the log dir is
    --log-dir's, by default named after the script"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """if toggled, cuda will be used when available"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases"""
    wandb_project_name: str = "leanrl"
    """the wandb's project name"""
    wandb_entity: Optional[str] = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """not supported with envpool (it renders no frames): refused with one line (the flag exists so that every
    script takes the same flags)"""

    env_id: str = "HalfCheetah-v4"
    """the id of the environment (any continuous-action envpool task: MuJoCo's, Pendulum-v1, ...)"""
    total_timesteps: int = 1000000
    """total timesteps of the experiments"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizer"""
    num_envs: int = 1
    """the number of parallel game environments (more than one: the envs share one set of observation and reward
    statistics, where CleanRL's wrappers keep one per env)"""
    num_steps: int = 2048
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """Toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 32
    """the number of mini-batches"""
    update_epochs: int = 10
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """Toggles advantages normalization"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """Toggles whether or not to use a clipped loss for the value function, as per the paper."""
    ent_coef: float = 0.0
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: Optional[float] = None
    """the target KL divergence threshold"""

    compile: bool = False
    """if toggled, wrap the agent's methods in torch.compile (the naive one-liner; see the _torchcompile script)"""
    cudagraphs: bool = False
    """not in this eager baseline: CUDA graphs need the units of ppo_continuous_action_torchcompile.py (refused on CUDA,
    ignored without)"""
    measure_burnin: int = 3
    """iterations left out of the steady-state fps (compilation and warm-up happen there)"""
    log_dir: Optional[str] = None
    """where metrics.jsonl, summary.json and agent.pt go (default: runs/<env_id>__<script>__<seed>__<time>)"""
    save_model: bool = False
    """if toggled, save the agent, optimizer and normalizer to `<log_dir>/agent.pt` at the end (and on Ctrl-C)"""
    resume: Optional[str] = None
    """path of an agent.pt written by --save-model: continue that run (envpool cannot snapshot its simulators: the
    episodes restart)"""
    num_threads: Optional[int] = None
    """torch intra-op threads (default: torch's own, as in CleanRL: the baseline is measured as its users run it)"""


def check_args(args: Args) -> Optional[dict]:
    """Every flag checked before any work, a mistake refused in one line; returns the checkpoint to resume, if any."""
    # the env first: a refused env makes every other flag moot
    plumbing.check_env_id(args.env_id, "mujoco", "ppo")
    plumbing.positive(args, "total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs")
    plumbing.positive_finite(args, "learning_rate", "clip_coef", "max_grad_norm", "target_kl")
    plumbing.non_negative_finite(args, "ent_coef", "vf_coef")
    plumbing.unit_interval(args, "gamma", "gae_lambda")
    batch_size = args.num_envs * args.num_steps
    plumbing.check_minibatches(args, batch_size)
    if args.total_timesteps < batch_size:
        plumbing.fail(f"--total-timesteps {args.total_timesteps} is less than one batch of {batch_size} steps")
    if args.cudagraphs and args.cuda and torch.cuda.is_available():
        plumbing.fail(
            "--cudagraphs needs the units of leanrl/ppo_continuous_action_torchcompile.py; "
            "ppo_continuous_action.py is the eager baseline"
        )
    # the rollout: float32 observations and actions, and four floats (log-prob, reward, done, value) per env step
    plumbing.check_memory(args, "mujoco", rollout=batch_size * (sum(plumbing.spaces(args.env_id)) + 4) * 4)
    return plumbing.check_run(args, SCRIPT, same=("env_id", "num_envs", "num_steps"), step=batch_size)


def make_envs(args: Args, seed: int):
    return envpool.make(args.env_id, env_type="gymnasium", num_envs=args.num_envs, seed=plumbing.envpool_seed(seed))


def env_step(envs, action: np.ndarray):
    """One step with CleanRL's (gymnasium's SAME_STEP) auto-reset: the observation after an episode's end is the
    next episode's first. envpool resets an env on the step *after* its episode ended, ignoring that step's action and
    returning reward 0 (checked on envpool 1.2.5): left alone, that dead step would enter the batch as a transition
    the action did not cause. Resetting the ended envs right away (envpool's reset takes a subset of env ids) keeps
    every stored transition real, at one extra env call per episode end. Returns the obs, reward, termination, done
    (terminated or truncated) and the last obs of the episodes that ended (gymnasium's wrappers see them too)."""
    obs, reward, terminated, truncated, _ = envs.step(action)
    done = terminated | truncated
    last = obs[done]
    if done.any():
        ended = np.flatnonzero(done)
        obs[ended] = envs.reset(ended)[0]
    return obs, reward, terminated, done, last


class RunningMeanStd:
    """Mean and (population) variance of everything seen so far, merged one batch at a time (Chan et al.'s parallel
    update, exact for any batch size). Starts like gymnasium's: mean 0, var 1, with a weight of 1e-4 samples."""

    def __init__(self, shape=()):
        self.mean = np.zeros(shape)
        self.var = np.ones(shape)
        self.count = 1e-4

    def update(self, x: np.ndarray):
        batch_mean = x.mean(0)
        batch_var = x.var(0)
        batch_count = x.shape[0]
        delta = batch_mean - self.mean
        total = self.count + batch_count
        self.mean = self.mean + delta * batch_count / total
        self.var = (
            self.var * self.count + batch_var * batch_count + delta**2 * self.count * batch_count / total
        ) / total
        self.count = total

    def state_dict(self):
        return dict(mean=torch.as_tensor(self.mean), var=torch.as_tensor(self.var), count=torch.tensor(self.count))

    def load_state_dict(self, s):
        self.mean = s["mean"].numpy()
        self.var = s["var"].numpy()
        self.count = s["count"].item()


class Normalizer:
    """CleanRL's NormalizeObservation + clip and NormalizeReward + clip (gymnasium's wrappers in a vector env that
    resets an ended env within the step), for all envs at once: one set of statistics updated with every env's values
    each step, where CleanRL's wrappers keep one per env (the same at its default of one env). As gymnasium's, an
    episode's last observation enters the statistics before the reset's, and each env's discounted return restarts
    only at a termination, from that step's reward: never at a truncation (on HalfCheetah, never)."""

    def __init__(self, num_envs: int, obs_dim: int, gamma: float, clip: float = 10.0, eps: float = 1e-8):
        self.obs_rms = RunningMeanStd((obs_dim,))
        self.ret_rms = RunningMeanStd()
        self.ret = np.zeros(num_envs)  # each env's discounted return so far in its episode
        self.gamma = gamma
        self.clip = clip
        self.eps = eps

    def observe(self, obs: np.ndarray):
        """Update the statistics with observations the agent does not act on: the last ones of ended episodes."""
        self.obs_rms.update(obs)

    def obs(self, obs: np.ndarray) -> np.ndarray:
        """Update the statistics with the observations the agent is about to see, then normalize them."""
        self.obs_rms.update(obs)
        return np.clip((obs - self.obs_rms.mean) / np.sqrt(self.obs_rms.var + self.eps), -self.clip, self.clip)

    def reward(self, reward: np.ndarray, terminated: np.ndarray) -> np.ndarray:
        """Scale the reward by the std of the discounted return (updated with this step's: gymnasium's `return * gamma
        * (1 - terminated) + reward`), then clip."""
        self.ret = self.ret * self.gamma * (1 - terminated) + reward
        self.ret_rms.update(self.ret)
        return np.clip(reward / np.sqrt(self.ret_rms.var + self.eps), -self.clip, self.clip)

    def state_dict(self):
        return dict(obs_rms=self.obs_rms.state_dict(), ret_rms=self.ret_rms.state_dict())

    def load_state_dict(self, s):
        self.obs_rms.load_state_dict(s["obs_rms"])
        self.ret_rms.load_state_dict(s["ret_rms"])


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, n_obs: int, n_actions: int):
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(n_obs, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor_mean = nn.Sequential(
            layer_init(nn.Linear(n_obs, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, n_actions), std=0.01),
        )
        self.actor_logstd = nn.Parameter(torch.zeros(1, n_actions))

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        action_mean = self.actor_mean(x)
        action_logstd = self.actor_logstd.expand_as(action_mean)
        action_std = torch.exp(action_logstd)
        probs = Normal(action_mean, action_std)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action).sum(1), probs.entropy().sum(1), self.critic(x)


def main(args: Args):
    ckpt = check_args(args)
    args.batch_size = args.num_envs * args.num_steps
    args.minibatch_size = args.batch_size // args.num_minibatches
    args.num_iterations = args.total_timesteps // args.batch_size

    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    rng = np.random.default_rng(args.seed)
    device = plumbing.pick_device(args)

    # envpool cannot snapshot its simulators: a resumed run starts new episodes, from a seed of its own
    envs = make_envs(args, seed=args.seed + (ckpt["global_step"] if ckpt else 0))
    n_obs = envs.observation_space.shape[0]
    n_actions = envs.action_space.shape[0]
    action_low = envs.action_space.low
    action_high = envs.action_space.high
    agent = Agent(n_obs, n_actions).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    get_action_and_value = agent.get_action_and_value
    get_value = agent.get_value
    if args.compile:
        get_action_and_value = torch.compile(get_action_and_value)
        get_value = torch.compile(get_value)

    obs = torch.zeros((args.num_steps, args.num_envs, n_obs)).to(device)
    actions = torch.zeros((args.num_steps, args.num_envs, n_actions)).to(device)
    logprobs = torch.zeros((args.num_steps, args.num_envs)).to(device)
    rewards = torch.zeros((args.num_steps, args.num_envs)).to(device)
    dones = torch.zeros((args.num_steps, args.num_envs)).to(device)
    values = torch.zeros((args.num_steps, args.num_envs)).to(device)

    normalizer = Normalizer(args.num_envs, n_obs, args.gamma)
    episodes = plumbing.Episodes(args.num_envs)
    global_step = 0
    start_iteration = 1
    if ckpt:
        plumbing.resume(
            ckpt,
            args.seed,
            restart=True,  # envpool cannot save its envs: they start new episodes
            agent=agent,
            optimizer=optimizer,
            normalizer=normalizer,
            torch_rng=torch.default_generator,
            device_rng=plumbing.device_generator(device),  # on a GPU, its own: what the samplers draw from
            np_rng=rng,
            episodes=episodes,  # the envs start new episodes
        )
        global_step = ckpt["global_step"]
        start_iteration = ckpt["iteration"] + 1
    next_obs, _ = envs.reset()
    next_obs = torch.Tensor(normalizer.obs(next_obs)).to(device)
    next_done = torch.zeros(args.num_envs).to(device)

    run = plumbing.Run(args, SCRIPT, device, args.num_iterations * args.batch_size, global_step)
    iteration = start_iteration - 1
    with run:
        for iteration in range(start_iteration, args.num_iterations + 1):
            t_iter = time.perf_counter()
            if args.anneal_lr:
                frac = 1.0 - (iteration - 1.0) / args.num_iterations
                optimizer.param_groups[0]["lr"] = frac * args.learning_rate

            t_env = 0.0
            t_policy = 0.0
            for step in range(0, args.num_steps):
                global_step += args.num_envs
                obs[step] = next_obs
                dones[step] = next_done

                t0 = time.perf_counter()
                with torch.no_grad():
                    action, logprob, _, value = get_action_and_value(next_obs)
                    values[step] = value.flatten()
                actions[step] = action
                logprobs[step] = logprob
                t1 = time.perf_counter()
                # the env gets the action clipped to its bounds (CleanRL's ClipAction); the batch keeps the sample
                next_obs, reward, terminated, next_done, last = env_step(
                    envs, np.clip(action.cpu().numpy(), action_low, action_high)
                )
                t_env += time.perf_counter() - t1
                t_policy += t1 - t0
                episodes.record(reward, next_done)
                rewards[step] = torch.tensor(normalizer.reward(reward, terminated)).to(device).view(-1)
                if len(last):  # before the reset's obs, as gymnasium's NormalizeObservation sees them
                    normalizer.observe(last)
                next_obs = torch.Tensor(normalizer.obs(next_obs)).to(device)
                next_done = torch.Tensor(next_done).to(device)
            t_rollout = time.perf_counter() - t_iter

            # bootstrap value if not done
            t0 = time.perf_counter()
            with torch.no_grad():
                next_value = get_value(next_obs).reshape(1, -1)
                advantages = torch.zeros_like(rewards).to(device)
                lastgaelam = 0
                for t in reversed(range(args.num_steps)):
                    if t == args.num_steps - 1:
                        nextnonterminal = 1.0 - next_done
                        nextvalues = next_value
                    else:
                        nextnonterminal = 1.0 - dones[t + 1]
                        nextvalues = values[t + 1]
                    delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                    advantages[t] = lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
                returns = advantages + values
            t_gae = time.perf_counter() - t0

            # flatten the batch
            t0 = time.perf_counter()
            b_obs = obs.reshape((-1, n_obs))
            b_logprobs = logprobs.reshape(-1)
            b_actions = actions.reshape((-1, n_actions))
            b_advantages = advantages.reshape(-1)
            b_returns = returns.reshape(-1)
            b_values = values.reshape(-1)

            # Optimizing the policy and value network
            b_inds = np.arange(args.batch_size)
            stats = []
            for _epoch in range(args.update_epochs):
                rng.shuffle(b_inds)
                for start in range(0, args.batch_size, args.minibatch_size):
                    end = start + args.minibatch_size
                    mb_inds = b_inds[start:end]

                    _, newlogprob, entropy, newvalue = get_action_and_value(b_obs[mb_inds], b_actions[mb_inds])
                    logratio = newlogprob - b_logprobs[mb_inds]
                    ratio = logratio.exp()

                    with torch.no_grad():
                        # calculate approx_kl http://joschu.net/blog/kl-approx.html
                        approx_kl = ((ratio - 1) - logratio).mean()
                        clipfrac = ((ratio - 1.0).abs() > args.clip_coef).float().mean()

                    mb_advantages = b_advantages[mb_inds]
                    if args.norm_adv:
                        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

                    # Policy loss
                    pg_loss1 = -mb_advantages * ratio
                    pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                    pg_loss = torch.max(pg_loss1, pg_loss2).mean()

                    # Value loss
                    newvalue = newvalue.view(-1)
                    if args.clip_vloss:
                        v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                        v_clipped = b_values[mb_inds] + torch.clamp(
                            newvalue - b_values[mb_inds], -args.clip_coef, args.clip_coef
                        )
                        v_loss_clipped = (v_clipped - b_returns[mb_inds]) ** 2
                        v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
                    else:
                        v_loss = 0.5 * ((newvalue - b_returns[mb_inds]) ** 2).mean()

                    entropy_loss = entropy.mean()
                    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

                    optimizer.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                    optimizer.step()
                    # one host read a minibatch, as in CleanRL (its clipfrac .item()): each read waits for a GPU
                    stats.append(torch.stack([approx_kl, clipfrac, pg_loss, v_loss, entropy_loss]).tolist())

                if args.target_kl is not None and approx_kl > args.target_kl:
                    break
            t_update = time.perf_counter() - t0

            run.log(
                global_step,
                steady=iteration - start_iteration + 1 >= args.measure_burnin,
                iteration=iteration,
                episodic_return=episodes.mean(),
                t_rollout=t_rollout,
                t_env=t_env,
                t_policy=t_policy,
                t_gae=t_gae,
                t_update=t_update,
                lr=optimizer.param_groups[0]["lr"],
                **dict(zip(("approx_kl", "clipfrac", "pg_loss", "v_loss", "entropy"), np.mean(stats, axis=0).tolist())),
            )
            if args.compile and iteration == start_iteration:
                run.compiled()
            if run.stopping:
                break
    envs.close()
    run.save(
        agent=agent,
        optimizer=optimizer,
        normalizer=normalizer,
        iteration=iteration,
        global_step=global_step,
        torch_rng=torch.default_generator,
        device_rng=plumbing.device_generator(device),  # on a GPU, its own: what the samplers draw from
        np_rng=rng,
        episodes=episodes,
    )
    run.finish(global_step, episodes.mean(), run.compile_time() if args.compile else None)


if __name__ == "__main__":
    main(plumbing.parse_args(Args))
