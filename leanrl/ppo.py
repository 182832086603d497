"""PPO on discrete classic control (CartPole-v1): the eager baseline.

CleanRL's `ppo.py` algorithm, network and defaults, written plainly: a Categorical policy, Python loops,
one autograd step per minibatch. It is the yardstick the accelerated scripts are measured against.

    python leanrl/ppo.py                      # 500k steps of CartPole-v1
    python leanrl/ppo.py --compile            # the same code under a naive torch.compile of the agent
"""

import time
from dataclasses import dataclass
from typing import Optional

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
from torch.distributions.categorical import Categorical

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
    """whether to capture videos of the agent performances (into `<log_dir>/videos`; needs pygame and moviepy)"""

    env_id: str = "CartPole-v1"
    """the id of the environment (discrete-action classic control or Box2D: CartPole-v1, LunarLander-v3, ...)"""
    total_timesteps: int = 500000
    """total timesteps of the experiments"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 4
    """the number of parallel game environments"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """Toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """Toggles advantages normalization"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """Toggles whether or not to use a clipped loss for the value function, as per the paper."""
    ent_coef: float = 0.01
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: Optional[float] = None
    """the target KL divergence threshold"""

    compile: bool = False
    """if toggled, wrap the agent's methods in torch.compile (the naive one-liner; see ppo_torchcompile.py)"""
    cudagraphs: bool = False
    """not in this eager baseline: CUDA graphs need the units of ppo_torchcompile.py (refused on CUDA,
    ignored without)"""
    measure_burnin: int = 3
    """iterations left out of the steady-state fps (compilation and warm-up happen there)"""
    log_dir: Optional[str] = None
    """where metrics.jsonl, summary.json and agent.pt go (default: runs/<env_id>__<script>__<seed>__<time>)"""
    save_model: bool = False
    """if toggled, save the agent and optimizer to `<log_dir>/agent.pt` at the end (and on Ctrl-C)"""
    resume: Optional[str] = None
    """path of an agent.pt written by --save-model: continue that run from where it stopped"""
    num_threads: Optional[int] = None
    """torch intra-op threads (default: torch's own, as in CleanRL: the baseline is measured as its users run it)"""


def check_args(args: Args) -> Optional[dict]:
    """Every flag checked before any work, a mistake refused in one line; returns the checkpoint to resume, if any."""
    # the env first: a refused env makes every other flag moot
    plumbing.check_env_id(args.env_id, "classic", "ppo")
    plumbing.positive(args, "total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs")
    plumbing.positive_finite(args, "learning_rate", "clip_coef", "max_grad_norm", "target_kl")
    plumbing.non_negative_finite(args, "ent_coef", "vf_coef")
    plumbing.unit_interval(args, "gamma", "gae_lambda")
    batch_size = args.num_envs * args.num_steps
    plumbing.check_minibatches(args, batch_size)
    if args.total_timesteps < batch_size:
        plumbing.fail(f"--total-timesteps {args.total_timesteps} is less than one batch of {batch_size} steps")
    if args.cudagraphs and args.cuda and torch.cuda.is_available():
        plumbing.fail("--cudagraphs needs the units of leanrl/ppo_torchcompile.py; ppo.py is the eager baseline")
    # the rollout: float32 observations and five floats (action, log-prob, reward, done, value) per env step
    plumbing.check_memory(args, "classic", rollout=batch_size * (plumbing.spaces(args.env_id)[0] + 5) * 4)
    return plumbing.check_run(args, SCRIPT, same=("env_id", "num_envs", "num_steps"), video=True, step=batch_size)


def make_env(env_id, idx, capture_video, video_dir):
    def thunk():
        if capture_video and idx == 0:
            return gym.wrappers.RecordVideo(gym.make(env_id, render_mode="rgb_array"), video_dir)
        return gym.make(env_id)

    return thunk


def make_envs(args: Args, video_dir: str):
    # Gymnasium's SyncVectorEnv steps 4 CartPoles faster than envpool, whose per-call overhead dominates at this size
    # (doc/classic_control.md). SAME_STEP autoreset is CleanRL's: the observation after a done is the reset one.
    return gym.vector.SyncVectorEnv(
        [make_env(args.env_id, i, args.capture_video, video_dir) for i in range(args.num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )


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
        self.actor = nn.Sequential(
            layer_init(nn.Linear(n_obs, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, n_actions), std=0.01),
        )

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        logits = self.actor(x)
        probs = Categorical(logits=logits)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


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

    envs = make_envs(args, f"{args.log_dir}/videos")
    n_obs = envs.single_observation_space.shape[0]
    n_actions = envs.single_action_space.n
    agent = Agent(n_obs, n_actions).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    get_action_and_value = agent.get_action_and_value
    get_value = agent.get_value
    if args.compile:
        get_action_and_value = torch.compile(get_action_and_value)
        get_value = torch.compile(get_value)

    obs = torch.zeros((args.num_steps, args.num_envs, n_obs)).to(device)
    actions = torch.zeros((args.num_steps, args.num_envs)).to(device)
    logprobs = torch.zeros((args.num_steps, args.num_envs)).to(device)
    rewards = torch.zeros((args.num_steps, args.num_envs)).to(device)
    dones = torch.zeros((args.num_steps, args.num_envs)).to(device)
    values = torch.zeros((args.num_steps, args.num_envs)).to(device)

    episodes = plumbing.Episodes(args.num_envs)
    global_step = 0
    start_iteration = 1
    next_obs, _ = envs.reset(seed=args.seed)
    next_obs = torch.Tensor(next_obs).to(device)
    next_done = torch.zeros(args.num_envs).to(device)
    if ckpt:
        # the envs go on where the checkpoint left them; where it could not hold them (Box2D), new episodes
        restart = not plumbing.env_saved(ckpt)
        plumbing.resume(
            ckpt,
            args.seed,
            restart=restart,
            agent=agent,
            optimizer=optimizer,
            torch_rng=torch.default_generator,
            device_rng=plumbing.device_generator(device),  # on a GPU, its own: what the samplers draw from
            np_rng=rng,
            episodes=episodes,
            **({} if restart else dict(env=envs, next_obs=next_obs, next_done=next_done)),
        )
        global_step = ckpt["global_step"]
        start_iteration = ckpt["iteration"] + 1

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
                next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
                t_env += time.perf_counter() - t1
                t_policy += t1 - t0
                next_done = np.logical_or(terminations, truncations)
                rewards[step] = torch.tensor(reward).to(device).view(-1)
                episodes.record(reward, next_done)
                next_obs = torch.Tensor(next_obs).to(device)
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
            b_actions = actions.reshape(-1)
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

                    _, newlogprob, entropy, newvalue = get_action_and_value(b_obs[mb_inds], b_actions.long()[mb_inds])
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
        iteration=iteration,
        global_step=global_step,
        agent=agent,
        optimizer=optimizer,
        torch_rng=torch.default_generator,
        device_rng=plumbing.device_generator(device),  # on a GPU, its own: what the samplers draw from
        np_rng=rng,
        env=envs,
        next_obs=next_obs,
        next_done=next_done,
        episodes=episodes,
    )
    run.finish(global_step, episodes.mean(), run.compile_time() if args.compile else None)


if __name__ == "__main__":
    main(plumbing.parse_args(Args))
