"""PPO on discrete classic control (CartPole-v1), cut into units that torch.compile and CUDA graphs wrap.

The algorithm, network and defaults of ppo.py (CleanRL's). Its tricks, each in the function that holds it
(doc/classic_control.md measures each):

- `act`: a rollout step only samples, argmax(logits + Gumbel noise), exact Categorical sampling without a Distribution;
  the log-probabilities and values come from one batched forward per iteration (`Agent.forward`).
- `main`, the acting choice just before the compile block: where the rollout acts, chosen once. A CPU learner acts
  with its own actor and a CUDA learner with a host copy of it (--host-actor, `host_copy`, and `refresh` in the loop: a
  4-row step of a 64-unit MLP costs less on the CPU than GPU launches), through numpy views of the weights
  (--numpy-act, `numpy_policy`) or eagerly (`torch_step`): the rollout's `step`, bound once after the block. A CUDA
  learner with --no-host-actor acts with the policy unit, the one case where the block compiles and graphs it.
- `rollout`: the env's outputs and the actions are staged in numpy and reach the buffers in one copy per iteration.
- `update`, `adam_step`: torch.func.grad and torch.optim's functional Adam, so that compiled, forward, backward,
  clipping and the Adam step are one graph (loss.backward() and optimizer.step() would each break it).
- `gae`: the recursion over numpy rows: as fast as compiled torch ops, with nothing to compile.
- `main`, the block after "The units": the units compiled (--compile) and captured in CUDA graphs (--cudagraphs),
  as in LeanRL's file; lr is a tensor changed in place (no recompilation); the update's guards are checked on an
  iteration's first minibatch and skipped on the rest, so a number the loop changes is never frozen.

    python leanrl/ppo_torchcompile.py --compile               # CPU or GPU
    python leanrl/ppo_torchcompile.py --compile --cudagraphs  # GPU: CUDA graphs around the learner's units
"""

import copy
import functools
import time
from dataclasses import dataclass
from typing import Optional

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
from tensordict import from_module
from tensordict.nn import CudaGraphModule
from torch.optim.adam import adam

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
    """if toggled, wrap the units in torch.compile: `update`, and on CUDA `evaluate`, `get_value` (once an iteration
    each: on a CPU not worth their compile) and the policy step where it acts there (--no-host-actor; a policy acting on
    the host, a CPU learner's or --host-actor's, acts in numpy or eagerly: main's acting choice); `gae` runs in numpy,
    with nothing to compile"""
    cudagraphs: bool = False
    """if toggled, wrap the units that run on CUDA in CUDA graphs (tensordict's CudaGraphModule; CUDA only)"""
    host_actor: bool = True
    """with the learner on CUDA, act in the rollout with a host copy of the actor, refreshed after each iteration's
    updates (one copy of ~20 KB): a 4-row step of a 64-unit MLP costs less on the CPU than GPU launches. A CPU
    learner acts with its own actor (no copy)"""
    numpy_act: bool = True
    """if toggled, a policy that acts on the CPU (a CPU learner's, or the --host-actor copy) acts through numpy views of
    the actor's weights: at 4 rows a torch forward is all per-op dispatch"""
    measure_burnin: int = 3
    """iterations left out of the steady-state fps (compilation and warm-up happen there)"""
    log_dir: Optional[str] = None
    """where metrics.jsonl, summary.json and agent.pt go (default: runs/<env_id>__<script>__<seed>__<time>)"""
    save_model: bool = False
    """if toggled, save the agent and optimizer to `<log_dir>/agent.pt` at the end (and on Ctrl-C)"""
    resume: Optional[str] = None
    """path of an agent.pt written by --save-model: continue that run from where it stopped"""
    num_threads: int = 1
    """torch intra-op threads (1 measures fastest for these 64-unit layers)"""


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
    # the rollout: float32 observations and five floats (action, log-prob, reward, done, value) per env step
    plumbing.check_memory(args, "classic", rollout=batch_size * (plumbing.spaces(args.env_id)[0] + 5) * 4)
    return plumbing.check_run(args, SCRIPT, same=("env_id", "num_envs", "num_steps"), video=True, step=batch_size)


def make_envs(args: Args, video_dir: str):
    # Gymnasium's SyncVectorEnv steps 4 CartPoles faster than envpool, whose per-call overhead dominates at this size
    # (doc/classic_control.md). SAME_STEP autoreset is CleanRL's: the observation after a done is the reset one.
    # copy=False hands back the env's own obs array (rollout copies it before the next step) instead of a deepcopy.
    def make(idx):
        if args.capture_video and idx == 0:
            return gym.wrappers.RecordVideo(gym.make(args.env_id, render_mode="rgb_array"), video_dir)
        return gym.make(args.env_id)

    return gym.vector.SyncVectorEnv(
        [functools.partial(make, i) for i in range(args.num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        copy=False,
    )


class Agent(nn.Module):
    @staticmethod
    def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
        torch.nn.init.orthogonal_(layer.weight, std)
        torch.nn.init.constant_(layer.bias, bias_const)
        return layer

    def __init__(self, n_obs: int, n_actions: int):
        super().__init__()
        self.critic = nn.Sequential(
            self.layer_init(nn.Linear(n_obs, 64)),
            nn.Tanh(),
            self.layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            self.layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            self.layer_init(nn.Linear(n_obs, 64)),
            nn.Tanh(),
            self.layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            self.layer_init(nn.Linear(64, n_actions), std=0.01),
        )

    def get_value(self, x):
        return self.critic(x).squeeze(-1)

    def forward(self, x, action):
        """Log-probability and entropy of `action`, and the state value: what the loss needs."""
        logp = self.actor(x).log_softmax(-1)
        entropy = -(logp.exp() * logp).sum(-1)
        return logp.gather(-1, action.unsqueeze(-1)).squeeze(-1), entropy, self.critic(x).squeeze(-1)


def act(actor, x, gumbel):
    """One rollout step: argmax(logits + Gumbel noise), exact Categorical sampling. Acting needs nothing else: the
    rollout's log-probabilities and values come from one batched forward afterwards (same numbers)."""
    return (actor(x) + gumbel).argmax(-1)


def numpy_policy(actor: nn.Sequential):
    """`act` on the CPU from numpy views of the actor's weights. The views share the weights' memory, so every update,
    refresh and resume is seen without a copy; a few small GEMMs in numpy cost a third of a torch forward."""
    layers = [(m.weight.detach().numpy(), m.bias.detach().numpy()) for m in actor if isinstance(m, nn.Linear)]

    def policy(obs: np.ndarray, gumbel: np.ndarray) -> np.ndarray:
        x = obs
        for w, b in layers[:-1]:
            x = np.tanh(x @ w.T + b)
        w, b = layers[-1]
        return (x @ w.T + b + gumbel).argmax(-1)

    return policy


def host_copy(module: nn.Module, device: torch.device) -> nn.Module:
    """A copy of `module` on `device` to act with: storage of its own, no autograd; `refresh` keeps it current."""
    return copy.deepcopy(module).requires_grad_(False).to(device)


def refresh(acting: nn.Module, learner: nn.Module):
    """The learner's parameters into its acting copy, in one transfer (~20 KB), copied in place: views of the copy's
    weights (`numpy_policy`) stay valid."""
    flat = nn.utils.parameters_to_vector(learner.parameters()).to(next(acting.parameters()).device)
    params = list(acting.parameters())
    with torch.no_grad():
        torch._foreach_copy_(params, [x.view_as(p) for x, p in zip(flat.split([p.numel() for p in params]), params)])


def torch_step(policy, device, obs: np.ndarray, gumbel) -> np.ndarray:
    """A torch policy step as the rollout calls it: numpy observations in, moved to `device` where the policy acts (a
    no-op on the host), the step's row of the rollout's noise already there, numpy actions out."""
    return policy(torch.from_numpy(obs).to(device, non_blocking=True), gumbel).cpu().numpy()


def rollout(envs, step, act_device, numpy_act: bool, next_obs, next_done, buf, n_actions: int, rng):
    """num_steps steps of every env into `buf`, acting with `step` (main's acting choice: numpy observations and the
    step's row of the noise in, numpy actions out) on `act_device`, a numpy step with `numpy_act`; returns the last
    obs/done, the rewards and the dones after each step (numpy, for the loop's episode statistics) and the time split.
    The env's outputs and the actions are staged in numpy and reach `buf` in one copy per iteration each."""
    num_steps = buf["obs"].shape[0]
    device = buf["obs"].device
    obs = np.empty((num_steps,) + next_obs.shape, np.float32)
    dones = np.empty(buf["dones"].shape, np.float32)
    rewards = np.empty(buf["rewards"].shape, np.float32)
    ended = np.empty(buf["rewards"].shape, bool)
    actions = np.empty(buf["actions"].shape, np.int64)
    t_env = 0.0
    t_policy = 0.0
    # one draw per rollout from the loop's generator, brought to where the policy acts in one transfer (a numpy step
    # reads a view of it)
    gumbel = -torch.empty(buf["dones"].shape + (n_actions,), device=device).exponential_(generator=rng).log()
    gumbel = gumbel.to(act_device)
    if numpy_act:
        gumbel = gumbel.numpy()
    for t in range(num_steps):
        obs[t] = next_obs
        dones[t] = next_done
        t0 = time.perf_counter()
        actions[t] = step(next_obs, gumbel[t])
        t1 = time.perf_counter()
        next_obs, reward, terminations, truncations, _ = envs.step(actions[t])
        t_env += time.perf_counter() - t1
        t_policy += t1 - t0
        next_done = terminations | truncations
        rewards[t] = reward
        ended[t] = next_done
    for key, x in (("obs", obs), ("actions", actions), ("dones", dones), ("rewards", rewards)):
        buf[key].copy_(torch.from_numpy(x), non_blocking=True)
    return next_obs, next_done, rewards, ended, t_env, t_policy


def gae(next_value, next_done, rewards, dones, values, gamma: float, gae_lambda: float):
    """CleanRL's GAE: deltas and discounts at once in torch, the recursion over numpy rows on the host (the same
    numbers). As torch ops the loop is slower eager, and compiling it cost far more of a cold start than it saved
    (doc/classic_control.md)."""
    nextnonterminal = 1.0 - torch.cat([dones[1:], next_done.unsqueeze(0)])
    nextvalues = torch.cat([values[1:], next_value.unsqueeze(0)])
    deltas = (rewards + gamma * nextvalues * nextnonterminal - values).cpu().numpy()
    discounts = (gamma * gae_lambda * nextnonterminal).cpu().numpy()
    advantages = np.empty_like(deltas)
    lastgaelam = np.zeros_like(deltas[0])
    for t in range(deltas.shape[0] - 1, -1, -1):
        lastgaelam = deltas[t] + discounts[t] * lastgaelam
        advantages[t] = lastgaelam
    advantages = torch.from_numpy(advantages).to(values.device)
    return advantages, advantages + values


def ppo_loss(params, agent, args, obs, actions, logprobs, advantages, returns, values):
    newlogprob, entropy, newvalue = torch.func.functional_call(agent, params, (obs, actions))
    logratio = newlogprob - logprobs
    ratio = logratio.exp()
    approx_kl = ((ratio - 1) - logratio).mean()  # http://joschu.net/blog/kl-approx.html
    clipfrac = ((ratio - 1.0).abs() > args.clip_coef).float().mean()
    if args.norm_adv:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    pg_loss = torch.max(
        -advantages * ratio, -advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
    ).mean()
    if args.clip_vloss:
        v_clipped = values + torch.clamp(newvalue - values, -args.clip_coef, args.clip_coef)
        v_loss = 0.5 * torch.max((newvalue - returns) ** 2, (v_clipped - returns) ** 2).mean()
    else:
        v_loss = 0.5 * ((newvalue - returns) ** 2).mean()
    entropy_loss = entropy.mean()
    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
    return loss, torch.stack([approx_kl, clipfrac, pg_loss, v_loss, entropy_loss]).detach()


def update(agent, optimizer, args, obs, actions, logprobs, advantages, returns, values, inds):
    """One minibatch step. Returns [approx_kl, clipfrac, pg_loss, v_loss, entropy, grad_norm].
    Gradients from torch.func.grad and the step from torch.optim's functional Adam, on the optimizer's own state:
    compiled, this whole function is one graph (loss.backward() and optimizer.step() would each break it)."""
    params = {name: p.detach() for name, p in agent.named_parameters()}
    grads, stats = torch.func.grad(ppo_loss, has_aux=True)(
        params, agent, args, obs[inds], actions[inds], logprobs[inds], advantages[inds], returns[inds], values[inds]
    )
    plist = list(agent.parameters())
    for p, name in zip(plist, params):
        p.grad = grads[name]
    # per-tensor norms fuse; foreach does not
    grad_norm = nn.utils.clip_grad_norm_(plist, args.max_grad_norm, foreach=False)
    adam_step(optimizer, plist, [p.grad for p in plist])
    return torch.cat([stats, grad_norm.unsqueeze(0)])


def make_optimizer(agent, lr, capturable: bool):
    """torch.optim.Adam owns the state (its state_dict is checkpointed), created here: `adam_step` steps it.
    `capturable` where the learner is on CUDA: the step counters live on the device, so a step reads nothing on the
    host and CUDA graphs can replay it."""
    optimizer = torch.optim.Adam(agent.parameters(), lr=lr, eps=1e-5, capturable=capturable)
    for p in agent.parameters():
        step = torch.zeros((), device=p.device if capturable else "cpu")
        optimizer.state[p] = dict(step=step, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
    return optimizer


def adam_step(optimizer, params: list, grads: list):
    """torch.optim.Adam's step in its functional form, on the optimizer's own state (see make_optimizer): with the
    gradients from torch.func.grad, a compiled update is one graph, which beats LeanRL's loss.backward() and
    optimizer.step() compiled (doc/compile.md)."""
    state = [optimizer.state[p] for p in params]
    # the lr is the param group's, the tensor the loop anneals in place. CleanRL's float assignment works on a CPU
    # (compiled code re-traces once, at the first new value, then takes every value); on CUDA it is refused: a CUDA
    # graph would replay the float it captured
    group = optimizer.param_groups[0]
    if group["capturable"] and not torch.is_tensor(group["lr"]):
        raise TypeError("on CUDA the lr must stay the optimizer's tensor, annealed in place: lr.fill_(lrnow)")
    with torch.no_grad():
        adam(
            params,
            grads,
            [s["exp_avg"] for s in state],
            [s["exp_avg_sq"] for s in state],
            [],
            [s["step"] for s in state],
            foreach=False,
            capturable=group["capturable"],
            amsgrad=False,
            beta1=group["betas"][0],
            beta2=group["betas"][1],
            lr=group["lr"],
            weight_decay=0.0,
            eps=group["eps"],
            maximize=False,
        )


def main(args: Args):
    ckpt = check_args(args)
    args.batch_size = args.num_envs * args.num_steps
    args.minibatch_size = args.batch_size // args.num_minibatches
    args.num_iterations = args.total_timesteps // args.batch_size

    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.set_num_threads(args.num_threads)
    device = plumbing.pick_device(args)

    envs = make_envs(args, f"{args.log_dir}/videos")
    # the loop's random numbers (exploration, minibatches) come from its own generator: torch.compile restores torch's
    # global generator after compiling a function, which would replay numbers the loop drew before the compile
    rng = torch.Generator(device).manual_seed(args.seed)
    n_obs = envs.single_observation_space.shape[0]
    n_actions = envs.single_action_space.n
    agent = Agent(n_obs, n_actions).to(device)
    # the inference copy: the learner's storage as plain tensors without requires_grad (tensordict >= 0.14 would
    # otherwise keep Parameters of its own, requires_grad and all, and only swap their data)
    agent_inference = Agent(n_obs, n_actions).to(device)
    from_module(agent).data.to_module(agent_inference, preserve_module_state=False)
    lr = torch.tensor(args.learning_rate, device=device)  # changed in place: compiled code is not re-traced
    optimizer = make_optimizer(agent, lr, capturable=device.type == "cuda")

    # The acting choice. A CUDA learner acts with a host copy of its actor (--host-actor, refreshed by the loop: a 4-row
    # step of this MLP costs less on the CPU than GPU launches) or on the device, the one case the block compiles the
    # policy unit; a CPU learner with its own actor. On the host a step reads numpy views of the weights (--numpy-act: a
    # 4-row torch forward is all dispatch) or runs eagerly (compiled, it and the env evict each other's caches).
    act_device = torch.device("cpu") if args.host_actor else device
    acting = agent_inference.actor if act_device == device else host_copy(agent.actor, act_device)
    numpy_act = args.numpy_act and act_device.type == "cpu"

    # The units, compiled (--compile) and captured in CUDA graphs (--cudagraphs; CUDA only: pick_device drops it)
    policy = functools.partial(act, acting)
    evaluate = agent_inference.forward
    get_value = agent_inference.get_value
    update_minibatch = functools.partial(update, agent, optimizer, args)
    if args.compile:
        # the vector ISA the CPU reports (ATen's own check), not a test program compiled per candidate ISA: most of a
        # cold start's fixed cost on a CPU (doc/compile.md); CUDA kernels do not use it
        torch._inductor.config.cpp.vec_isa_ok = True
        # at these sizes a compiled call costs its overhead, not its arithmetic: C++ wrapper code instead of Python,
        # and inductor's own GEMMs where they beat a library call (max_autotune), make a CPU minibatch update faster
        # (doc/copying.md); on CUDA max_autotune would spend minutes autotuning Triton GEMMs for these tiny layers
        options = dict(cpp_wrapper=True, max_autotune=True) if device.type == "cpu" else {}
        if act_device.type == "cuda":
            policy = torch.compile(policy, options=options)
        # evaluate and get_value run once an iteration: on a CPU compiling them adds seconds to a cold start and buys
        # no fps (doc/compile.md); on CUDA each is one graph instead of dozens of kernel launches
        if device.type == "cuda":
            evaluate = torch.compile(evaluate, options=options)
            get_value = torch.compile(get_value, options=options)
        update_minibatch = torch.compile(update_minibatch, options=options)
    if args.cudagraphs:
        if act_device.type == "cuda":
            policy = CudaGraphModule(policy)
        evaluate = CudaGraphModule(evaluate)
        get_value = CudaGraphModule(get_value)
        update_minibatch = CudaGraphModule(update_minibatch)
    # the rollout's step: numpy observations and the step's row of the noise in, numpy actions out
    step = numpy_policy(acting) if numpy_act else functools.partial(torch_step, policy, act_device)

    shape = (args.num_steps, args.num_envs)
    buf = dict(
        obs=torch.zeros(shape + (n_obs,), device=device),
        actions=torch.zeros(shape, dtype=torch.long, device=device),
        **{k: torch.zeros(shape, device=device) for k in ("logprobs", "rewards", "dones", "values")},
    )
    stats = torch.zeros(args.update_epochs * args.num_minibatches, 6, device=device)
    episodes = plumbing.Episodes(args.num_envs)
    parts = dict(agent=agent, optimizer=optimizer, rng=rng, episodes=episodes)  # what a checkpoint holds, envs aside
    next_obs, _ = envs.reset(seed=args.seed)
    next_done = np.zeros(args.num_envs, dtype=bool)
    if ckpt:
        # the envs go on where the checkpoint left them; where it could not hold them (Box2D), new episodes
        restart = not plumbing.env_saved(ckpt)
        env_parts = {} if restart else dict(env=envs, next_obs=next_obs, next_done=next_done)
        plumbing.resume(ckpt, args.seed, restart=restart, **parts, **env_parts)
    global_step = ckpt["global_step"] if ckpt else 0
    start_iteration = ckpt["iteration"] + 1 if ckpt else 1

    iteration = start_iteration - 1
    with plumbing.Run(args, SCRIPT, device, args.num_iterations * args.batch_size, global_step) as run:
        for iteration in range(start_iteration, args.num_iterations + 1):
            t_iter = time.perf_counter()
            if args.anneal_lr:
                lr.fill_((1.0 - (iteration - 1.0) / args.num_iterations) * args.learning_rate)
            if act_device != device:  # a host copy: the last updates' (or the resumed checkpoint's) parameters
                refresh(acting, agent.actor)
            next_obs, next_done, rewards, ended, t_env, t_policy = rollout(
                envs, step, act_device, numpy_act, next_obs, next_done, buf, n_actions, rng
            )
            episodes.record_steps(rewards, ended)
            global_step += args.batch_size
            t_rollout = time.perf_counter() - t_iter

            t0 = time.perf_counter()
            last_obs = torch.from_numpy(next_obs).to(device)
            last_done = torch.from_numpy(next_done).to(device).float()
            logprobs, _, values = evaluate(buf["obs"], buf["actions"])  # the rollout's, in one batched call
            buf["logprobs"].copy_(logprobs)
            buf["values"].copy_(values)
            advantages, returns = gae(
                get_value(last_obs), last_done, buf["rewards"], buf["dones"], buf["values"], args.gamma, args.gae_lambda
            )
            t_gae = time.perf_counter() - t0

            t0 = time.perf_counter()
            batch = [
                x.flatten(0, 1)
                for x in (buf["obs"], buf["actions"], buf["logprobs"], advantages, returns, buf["values"])
            ]
            n = 0
            for _epoch in range(args.update_epochs):
                perm = torch.randperm(args.batch_size, device=device, generator=rng).view(args.num_minibatches, -1)
                for inds in perm:
                    # the iteration's first update checks the compiled code's guards, and so sees every number the loop
                    # changed (a float lr, a schedule); the rest skip them (doc/compile.md: what it saves)
                    with torch.compiler.set_stance(skip_guard_eval_unsafe=n > 0):
                        stats[n] = update_minibatch(*batch, inds)
                    n += 1
                if args.target_kl is not None and stats[n - 1, 0] > args.target_kl:  # a host sync, only when asked
                    break
            t_update = time.perf_counter() - t0

            losses = stats[:n].mean(0).tolist()  # the one host sync of the iteration
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
                lr=lr.item(),
                **dict(zip(("approx_kl", "clipfrac", "pg_loss", "v_loss", "entropy", "grad_norm"), losses)),
            )
            if args.compile and iteration == start_iteration:
                run.compiled()
            if run.stopping:
                break
    envs.close()
    run.save(iteration=iteration, global_step=global_step, **parts, env=envs, next_obs=next_obs, next_done=next_done)
    run.finish(global_step, episodes.mean(), run.compile_time() if args.compile else None)


if __name__ == "__main__":
    main(plumbing.parse_args(Args))
