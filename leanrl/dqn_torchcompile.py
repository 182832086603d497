"""DQN on discrete classic control (CartPole-v1), cut into units that torch.compile and CUDA graphs wrap.

The algorithm, Q-network and defaults of dqn.py (CleanRL's). At these sizes a step costs its machinery, not its
arithmetic, so each trick removes machinery; each is in the function that holds it:

- `numpy_act` (--numpy-act): on a CPU the greedy action comes from numpy views of the Q-network's weights.
- `draw_choices`: the exploration of a chunk of steps drawn on the device at once, one transfer per chunk.
- `ReplayBuffer.add`, `ReplayBuffer.flush`: steps staged in numpy, one copy per field into the device buffer per update.
- `update`, `adam_step`: the batch gathered inside, gradients from torch.func.grad and torch.optim's functional Adam,
  so that compiled, the whole TD step is one graph (loss.backward() and optimizer.step() would each break it); lr is
  a tensor.
- `main`, the block after "The units": the units compiled (--compile) and captured in CUDA graphs (--cudagraphs);
  the update's guards are checked on the first update after each log line and skipped on the rest.

    python leanrl/dqn_torchcompile.py --compile               # CPU or GPU
    python leanrl/dqn_torchcompile.py --compile --cudagraphs  # GPU: CUDA graphs around the three units
"""

import functools
import time
from dataclasses import dataclass
from typing import Optional

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from tensordict import TensorDict
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
    num_envs: int = 1
    """the number of parallel game environments (DQN here steps one, as CleanRL's does)"""
    buffer_size: int = 10000
    """the replay memory buffer size"""
    gamma: float = 0.99
    """the discount factor gamma"""
    tau: float = 1.0
    """the target network update rate"""
    target_network_frequency: int = 500
    """the timesteps it takes to update the target network"""
    batch_size: int = 128
    """the batch size of sample from the replay memory"""
    start_e: float = 1.0
    """the starting epsilon for exploration"""
    end_e: float = 0.05
    """the ending epsilon for exploration"""
    exploration_fraction: float = 0.5
    """the fraction of `total-timesteps` it takes from start-e to go end-e"""
    learning_starts: int = 10000
    """timestep to start learning"""
    train_frequency: int = 10
    """the frequency of training"""

    compile: bool = False
    """if toggled, wrap the update unit in torch.compile, and on CUDA the act and target units too (on a CPU the act
    unit runs eagerly or in numpy: at one observation a compiled call costs more than it saves; the target copy runs
    once every --target-network-frequency steps, not worth its compile)"""
    cudagraphs: bool = False
    """if toggled, wrap the act, update and target units in CUDA graphs (tensordict's CudaGraphModule; CUDA only)"""
    numpy_act: bool = True
    """if toggled, a CPU learner acts with numpy views of the Q-network's weights instead of torch (ignored on CUDA)"""
    measure_burnin: int = 1000
    """env steps after learning_starts left out of the steady-state fps (compilation and warm-up happen there)"""
    log_every: int = 1000
    """env steps per line of metrics.jsonl"""
    log_dir: Optional[str] = None
    """where metrics.jsonl, summary.json and agent.pt go (default: runs/<env_id>__<script>__<seed>__<time>)"""
    save_model: bool = False
    """if toggled, save the networks, optimizer and replay buffer to `<log_dir>/agent.pt` at the end (and on Ctrl-C)"""
    resume: Optional[str] = None
    """path of an agent.pt written by --save-model: continue that run from where it stopped (the env's state too: with
    the same flags the resumed run goes on as if never stopped)"""
    num_threads: int = 1
    """torch intra-op threads (1 measures fastest for these small layers)"""


def check_args(args: Args) -> Optional[dict]:
    """Every flag checked before any work, a mistake refused in one line; returns the checkpoint to resume, if any."""
    # the env first: a refused env makes every other flag moot
    plumbing.check_env_id(args.env_id, "classic", "dqn")
    plumbing.positive(
        args, "total_timesteps", "buffer_size", "target_network_frequency", "batch_size", "train_frequency", "log_every"
    )
    plumbing.positive_finite(args, "learning_rate")
    plumbing.require(args, lambda v: v >= 0, "non-negative", "learning_starts")
    plumbing.unit_interval(args, "gamma", "tau", "exploration_fraction")
    plumbing.probability(args, "start_e", "end_e")
    plumbing.require(args, lambda v: v == 1, "1 (this DQN steps one env, as CleanRL's does)", "num_envs")
    if args.batch_size > args.buffer_size:
        plumbing.fail(f"--batch-size {args.batch_size} is larger than --buffer-size {args.buffer_size}")
    if args.end_e > args.start_e:
        plumbing.fail(f"--end-e {args.end_e} must not exceed --start-e {args.start_e}: epsilon anneals down")
    if args.learning_starts >= args.total_timesteps:
        plumbing.fail(
            f"--learning-starts {args.learning_starts} must be less than --total-timesteps {args.total_timesteps}"
        )
    # the replay buffer: float32 observation and next observation, an int64 action, reward and done per transition
    n_obs = plumbing.spaces(args.env_id)[0]
    plumbing.check_memory(args, "classic", replay_buffer=args.buffer_size * (2 * n_obs * 4 + 16))
    return plumbing.check_run(args, SCRIPT, same=("env_id", "buffer_size"), video=True)


def make_env(args: Args, video_dir: str):
    # One plain env, reset by hand: 112k steps/s here, against 71k for gymnasium's SyncVectorEnv of one and 23k for
    # envpool (its per-call overhead dominates at one CartPole).
    if args.capture_video:
        return gym.wrappers.RecordVideo(gym.make(args.env_id, render_mode="rgb_array"), video_dir)
    return gym.make(args.env_id)


class QNetwork(nn.Sequential):
    """CleanRL's Q-network: a 120-84 MLP with one output per action."""

    def __init__(self, n_obs: int, n_actions: int):
        super().__init__(nn.Linear(n_obs, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, n_actions))


def act(q_network, obs):
    """The greedy action; the loop calls it only on the steps that do not explore (see draw_choices)."""
    with torch.no_grad():
        return q_network(obs).argmax(-1)


def numpy_act(q_network):
    """`act` for one obs on a CPU, from numpy views of the weights (they share the Q-network's memory: every update is
    seen). At one obs a torch forward is all per-op dispatch; numpy's three GEMVs skip it, several times faster in the
    loop (doc/offpolicy.md)."""
    (w1, b1), (w2, b2), (w3, b3) = [(m.weight.detach().numpy(), m.bias.detach().numpy()) for m in list(q_network)[::2]]
    return lambda obs: int((w3 @ np.maximum(w2 @ np.maximum(w1 @ obs + b1, 0) + b2, 0) + b3).argmax())


def update(q_network, target_network, optimizer, gamma: float, fields: dict, inds):
    """A TD step on the transitions at `inds`, returns [td_loss, mean Q]. Gradients from torch.func.grad, the step from
    torch.optim's functional Adam: compiled, one graph (loss.backward() and optimizer.step() would each break it)."""
    obs, next_obs, actions, rewards, dones = (fields[k][inds] for k in fields)  # the fields' order
    with torch.no_grad():
        td_target = rewards + gamma * target_network(next_obs).max(dim=1).values * (1 - dones)
    params = {name: p.detach() for name, p in q_network.named_parameters()}

    def td_loss(params):  # the loss, and [td_loss, mean Q] as torch.func.grad's aux
        q = torch.func.functional_call(q_network, params, (obs,)).gather(1, actions.unsqueeze(1)).squeeze(1)
        loss = F.mse_loss(td_target, q)
        return loss, torch.stack([loss, q.mean()]).detach()

    grads, stats = torch.func.grad(td_loss, has_aux=True)(params)
    adam_step(optimizer, list(q_network.parameters()), [grads[name] for name in params])
    return stats


def update_target(q_params: list, target_params: list, tau: float):
    with torch.no_grad():  # target <- tau * q + (1 - tau) * target, one foreach call (tau 1: a copy)
        torch._foreach_lerp_(target_params, q_params, tau)


def make_optimizer(q_network, lr, capturable: bool):
    """torch.optim.Adam owns the state (its state_dict is checkpointed), created here: `adam_step` steps it.
    `capturable` where the learner is on CUDA: the step counters live on the device, so a step reads nothing on the
    host and CUDA graphs can replay it."""
    optimizer = torch.optim.Adam(q_network.parameters(), lr=lr, capturable=capturable)
    for p in q_network.parameters():
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


def draw_choices(args: Args, rng: torch.Generator, start: int, n: int, n_actions: int, device):
    """Steps start..start+n-1 drawn at once from the loop's generator, one transfer to the host: a random action where
    a uniform draw falls under the step's epsilon, else -1 (greedy). As in dqn.py, exploring runs no forward."""
    explore = torch.rand(n, generator=rng, device=device) < epsilon_schedule(args, start, n, device)
    random_actions = torch.randint(n_actions, (n,), generator=rng, device=device)
    return torch.where(explore, random_actions, -1).tolist()


def epsilon_schedule(args: Args, start: int, n: int = 1, device=None) -> torch.Tensor:
    """CleanRL's linear schedule from start_e to end_e over exploration_fraction of the run, for n steps at once."""
    steps = torch.arange(start, start + n, device=device)
    frac = (steps / (args.exploration_fraction * args.total_timesteps)).clamp(max=1.0)
    return args.start_e + frac * (args.end_e - args.start_e)


class ReplayBuffer:
    """A preallocated ring buffer on the learner's device (full: the oldest transition is overwritten). A step is
    written once, into numpy staging rows; they reach the device in one copy per field at `flush`, before updates."""

    def __init__(self, size: int, n_obs: int, device, stage: int):
        self.data = TensorDict(
            obs=torch.zeros(size, n_obs),
            next_obs=torch.zeros(size, n_obs),
            actions=torch.zeros(size, dtype=torch.long),
            rewards=torch.zeros(size),
            dones=torch.zeros(size),
            batch_size=[size],
            device=device,
        )
        self.fields = dict(self.data.items())  # the plain tensors: what `update` gathers from
        self.staged = {k: torch.zeros((stage,) + v.shape[1:], dtype=v.dtype).numpy() for k, v in self.fields.items()}
        self.size = size
        self.pos = 0
        self.full = False
        self.n = 0  # rows staged

    def __len__(self):  # the transitions written so far
        return self.size if self.full else self.pos

    def add(self, obs, next_obs, action: int, reward: float, done: float):
        for staged, x in zip(self.staged.values(), (obs, next_obs, action, reward, done)):  # the fields' order
            staged[self.n] = x
        self.n += 1
        if self.n == len(self.staged["obs"]):
            self.flush()

    def flush(self):
        n = self.n
        first = min(n, self.size - self.pos)  # the staged rows may wrap around the end
        for key, x in self.staged.items():
            dst = self.fields[key]
            src = torch.from_numpy(x)
            dst[self.pos : self.pos + first].copy_(src[:first], non_blocking=True)
            dst[: n - first].copy_(src[first:n], non_blocking=True)
        self.full = self.full or self.pos + n >= self.size
        self.pos = (self.pos + n) % self.size
        self.n = 0

    def state(self) -> dict:
        """The rows (the staged ones flushed in first) and where the next one goes: the checkpoint's share."""
        self.flush()
        return dict(data=self.data.to_dict(), pos=self.pos, full=self.full)

    def load(self, state: dict):
        """A checkpoint's rows, copied into this buffer's own tensors: `update` is bound to them."""
        for key, rows in state["data"].items():
            self.fields[key].copy_(rows)
        self.pos = state["pos"]
        self.full = state["full"]


def main(args: Args):
    ckpt = check_args(args)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.set_num_threads(args.num_threads)
    device = plumbing.pick_device(args)
    # the loop's random numbers come from its own generator: torch.compile restores the global one after compiling
    rng = torch.Generator(device).manual_seed(args.seed)

    env = make_env(args, f"{args.log_dir}/videos")
    n_obs = env.observation_space.shape[0]
    n_actions = env.action_space.n
    q_network = QNetwork(n_obs, n_actions).to(device)
    target_network = QNetwork(n_obs, n_actions).to(device).requires_grad_(False)
    target_network.load_state_dict(q_network.state_dict())
    rb = ReplayBuffer(args.buffer_size, n_obs, device, stage=args.train_frequency)
    lr = torch.tensor(args.learning_rate, device=device)  # a tensor: CUDA graphs capture it, changes need no re-trace
    optimizer = make_optimizer(q_network, lr, capturable=device.type == "cuda")

    # The units, then the trick: compiled with --compile, captured in CUDA graphs with --cudagraphs.
    policy = functools.partial(act, q_network)
    td_update = functools.partial(update, q_network, target_network, optimizer, args.gamma, rb.fields)
    target_update = functools.partial(
        update_target, list(q_network.parameters()), list(target_network.parameters()), args.tau
    )
    if args.compile:
        # the vector ISA the CPU reports (ATen's own check), not a test program compiled per candidate ISA: most of a
        # cold start's fixed cost on a CPU (doc/compile.md); CUDA kernels do not use it
        torch._inductor.config.cpp.vec_isa_ok = True
        # a CPU call costs its overhead, not its arithmetic: C++ wrapper code instead of Python; on CUDA no options
        td_update = torch.compile(td_update, options=dict(cpp_wrapper=True) if device.type == "cpu" else None)
        # on a CPU `act` stays eager: at one obs compiled it was slower, cpp_wrapper or not (doc/offpolicy.md); so does
        # the target copy, run once every --target-network-frequency steps: compiling it adds seconds to a cold start
        # and saves nothing a run shows (doc/compile.md)
        if device.type == "cuda":
            policy = torch.compile(policy)
            target_update = torch.compile(target_update)
    if args.cudagraphs:
        policy = CudaGraphModule(policy)
        td_update = CudaGraphModule(td_update)
        target_update = CudaGraphModule(target_update)
    # the acting choice, one callable (a numpy obs in, an int action out): numpy_act on a CPU, else the unit above
    args.numpy_act = args.numpy_act and device.type == "cpu"
    greedy = numpy_act(q_network) if args.numpy_act else lambda obs: policy(torch.from_numpy(obs).to(device)).item()

    episodes = plumbing.Episodes(1)
    # the run's parts, by the names the checkpoint holds them under
    parts = dict(
        q_network=q_network, target_network=target_network, optimizer=optimizer, buffer=rb, rng=rng, episodes=episodes
    )
    global_step = ckpt["global_step"] if ckpt else 0
    obs, _ = env.reset(seed=args.seed + global_step)
    if ckpt:
        # the envs go on where the checkpoint left them; where it could not hold them (Box2D), new episodes
        restart = not plumbing.env_saved(ckpt)
        plumbing.resume(ckpt, args.seed, restart=restart, **parts, **({} if restart else dict(env=env, obs=obs)))
        del ckpt  # its copy of the replay buffer, now in the run's own, is not held for the whole run

    run = plumbing.Run(args, SCRIPT, device, args.total_timesteps, global_step)
    clock = {}  # each unit's first call, timed: with --compile, its compilation
    compiling = args.compile
    stats = torch.zeros(args.log_every // args.train_frequency + 1, 2, device=device)
    n_updates = 0
    choices = ()
    k = 0
    t_env = 0.0
    t_policy = 0.0
    t_update = 0.0
    with run:
        while global_step < args.total_timesteps:
            t0 = time.perf_counter()
            if k == len(choices):  # the exploration of the next chunk of steps, up to the next log line
                n = min(args.log_every - global_step % args.log_every, args.total_timesteps - global_step)
                choices = draw_choices(args, rng, global_step, n, n_actions, device)
                k = 0
            action = choices[k]
            k += 1
            if action < 0:
                action = greedy(obs)
                if "act" not in clock:
                    clock["act"] = time.perf_counter() - t0
            t1 = time.perf_counter()
            next_obs, reward, terminated, truncated, _ = env.step(action)
            t_env += time.perf_counter() - t1
            t_policy += t1 - t0
            episodes.record_one(reward, terminated or truncated)
            # the transition keeps the true last obs: a truncated episode still bootstraps from it (CleanRL's rule)
            rb.add(obs, next_obs, action, reward, float(terminated))
            obs = env.reset()[0] if terminated or truncated else next_obs

            t0 = time.perf_counter()
            if global_step > args.learning_starts:
                if global_step % args.train_frequency == 0:
                    rb.flush()
                    inds = torch.randint(len(rb), (args.batch_size,), generator=rng, device=device)
                    # the first update after a log line checks the compiled code's guards, and so sees every number
                    # the loop changed (within --log-every steps); the rest skip them (doc/compile.md: what it saves)
                    with torch.compiler.set_stance(skip_guard_eval_unsafe=n_updates > 0):
                        stats[n_updates] = td_update(inds)
                    n_updates += 1
                    if "update" not in clock:
                        clock["update"] = time.perf_counter() - t0
                if global_step % args.target_network_frequency == 0:
                    t_target = time.perf_counter()
                    target_update()
                    if "update_target" not in clock:
                        clock["update_target"] = time.perf_counter() - t_target
            t_update += time.perf_counter() - t0
            global_step += 1

            if global_step % args.log_every and global_step < args.total_timesteps:
                continue
            td, qv = stats[:n_updates].mean(0).tolist() if n_updates else (None, None)  # the chunk's one host sync
            run.log(
                global_step,
                steady=global_step >= args.learning_starts + args.measure_burnin,
                iteration=global_step // args.log_every,
                episodic_return=episodes.mean(),
                epsilon=epsilon_schedule(args, global_step - 1).item(),
                t_env=t_env,
                t_policy=t_policy,
                t_update=t_update,
                td_loss=td,
                q_values=qv,
                compiled=len(clock) == 3 if args.compile else None,
            )
            if compiling and len(clock) == 3:
                run.compiled()
                compiling = False
            t_env = 0.0
            t_policy = 0.0
            t_update = 0.0
            n_updates = 0
            if run.stopping:
                break
    env.close()
    run.save(**parts, global_step=global_step, env=env, obs=obs)
    run.finish(
        global_step,
        episodes.mean(),
        compile_time=sum(clock.values()) if args.compile else None,
        compile_times=clock if args.compile else None,
    )


if __name__ == "__main__":
    main(plumbing.parse_args(Args))
