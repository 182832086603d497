"""What post-training compression does to a trained agent: its score, its speed and its size.

    python leanrl/tools/eval_compressed.py runs/<run>/agent.pt                    # a --save-model checkpoint
    python leanrl/tools/eval_compressed.py runs/<run>/agent.pt --episodes 20      # Atari: fewer, longer episodes

Loads the agent of any leanrl script's `--save-model` checkpoint (the family and the network's size come from the
parameter names and shapes, the env from the checkpoint's args, or --env-id), then for each compression method
(fp32 as trained; fp16 and bf16 weights; torchao dynamic int8; PT2E static int8 calibrated on observations the
fp32 agent met in the env; structured pruning with Torch-Pruning and unstructured L1 mask pruning made permanent,
at several ratios) writes to doc/compression_table.md:
- the mean return over --episodes episodes in the family's envpool env (the full game score for Atari), one
  episode per env, all envs stepping together; actions sampled from the policy unless --deterministic;
- the forward time of the acting step for a batch of --batch observations (median over --passes calls);
- the size of the serialized model: the bytes torch.save writes for its state_dict.
Everything runs on the CPU, compiled with torch.compile unless --no-compile (the int8 kernels come from the compiler;
eager int8 runs reference code).
"""

import copy
import os
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Literal, Optional

import envpool
import numpy as np
import torch
import torch.nn as nn
import tyro
from bench_inference import (
    AtariAgent,
    ClassicAgent,
    Policy,
    int8_dynamic,
    int8_static,
    prune_structured,
    serialized_size,
    to_dtype,
)
from torch.nn.utils import prune

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # plumbing/ is in leanrl/, one up
import plumbing

# envpool's gymnasium spaces warn at every env creation that their float64 bounds became float32
warnings.filterwarnings("ignore", message=".*precision lowered by casting")

METHODS = ("fp32", "fp16", "bf16", "int8-dynamic", "int8-static", "structured", "unstructured")


@dataclass
class Args:
    """What post-training compression does to a trained agent: its score, its speed and its size."""

    checkpoint: tyro.conf.Positional[str]
    """an agent.pt written by a leanrl script's --save-model"""
    env_id: Optional[str] = None
    """the env to evaluate on (default: the one the checkpoint was trained on)"""
    methods: tuple[Literal[METHODS], ...] = METHODS
    """the compression methods; fp32 (the agent as trained) is always evaluated, as the reference"""
    structured_ratios: tuple[float, ...] = (0.25, 0.5, 0.75)
    """fractions of the hidden units/channels that structured pruning removes (one row each)"""
    unstructured_ratios: tuple[float, ...] = (0.5, 0.75, 0.9)
    """fractions of every layer's weights that unstructured pruning zeroes (one row each)"""
    episodes: int = 100
    """episodes per method: one per env, all envs stepping together"""
    deterministic: bool = False
    """act with the policy's mode (argmax) instead of sampling from it"""
    batch: int = 100
    """observations per timed forward pass"""
    passes: int = 500
    """timed forward passes per method (the table reports their median)"""
    calibration: int = 1024
    """observations (from the fp32 agent's episodes) that static int8 calibrates its activation ranges on"""
    compile: bool = True
    """run every method under torch.compile (static int8 with inductor's freezing); --no-compile: eager"""
    table: str = "doc/compression_table.md"
    """where the markdown table goes"""
    num_threads: Optional[int] = None
    """torch intra-op threads (default: the training scripts', 1 for classic control and 2 for Atari)"""
    seed: int = 1
    """seed of the envs and the sampled actions"""


def check_args(args: Args):
    for name in ("episodes", "batch", "passes", "calibration", "num_threads"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            plumbing.fail(f"--{name.replace('_', '-')} must be positive, got {value}")
    for name in ("structured_ratios", "unstructured_ratios"):
        if any(not 0 < r < 1 for r in getattr(args, name)):
            plumbing.fail(f"--{name.replace('_', '-')} must lie strictly between 0 and 1")
    if not os.path.isfile(args.checkpoint):
        plumbing.fail(f"{args.checkpoint}: no such file")


def load_agent(args: Args):
    """(agent, family, env_id, script) from the checkpoint: the family and sizes from the parameter names and
    shapes, so any script's checkpoint of a known architecture loads."""
    try:
        ckpt = torch.load(args.checkpoint, weights_only=True, map_location="cpu")
        saved = ckpt.get("args", {})
    except Exception as e:  # a corrupt or foreign file is a user mistake, not a crash
        plumbing.fail(f"{args.checkpoint}: not a checkpoint written by --save-model ({type(e).__name__})")
    script = ckpt.get("script") or saved.get("exp_name", "unknown script")
    if "agent" not in ckpt and "script" in ckpt:  # an off-policy script's: its networks are not an actor-critic
        plumbing.fail(
            f"{args.checkpoint} was written by {script}.py: this tool evaluates the PPO scripts' classic-control and "
            f"Atari agents, not {script.split('_')[0].upper()}'s networks"
        )
    if "agent" not in ckpt:
        plumbing.fail(f"{args.checkpoint}: not a checkpoint written by --save-model (no agent in it)")
    if saved.get("num_seeds"):
        plumbing.fail(
            f"{args.checkpoint} was written by {script}.py and holds its {saved['num_seeds']} agents stacked: this "
            "tool evaluates one agent, as the scripts without --num-seeds save it"
        )
    state = ckpt["agent"]
    keys = set(state)
    env_id = args.env_id or saved.get("env_id")
    if env_id is None:
        plumbing.fail(f"{args.checkpoint} does not say which env it was trained on; pass --env-id")
    if "network.0.weight" in keys:
        family = "atari"
        agent = AtariAgent(state["actor.weight"].shape[0])
    elif "actor.0.weight" in keys:
        depth = sum(1 for k in keys if k.startswith("actor.") and k.endswith(".weight")) - 1
        width, n_obs = state["actor.0.weight"].shape
        agent = ClassicAgent(n_obs, state[f"actor.{2 * depth}.weight"].shape[0], width, depth)
        family = "classic_control"
    else:
        plumbing.fail(
            f"{args.checkpoint}: no classic-control or Atari agent in it (continuous control is not supported yet)"
        )
    try:
        agent.load_state_dict(state)
    except RuntimeError:
        plumbing.fail(f"{args.checkpoint}: its agent does not match the {family} architecture of the leanrl scripts")
    spec = envpool.registration.registry.specs.get(env_id)
    if spec is None or family not in spec[0]:
        plumbing.fail(
            f"--env-id {env_id}: not an envpool {family.replace('_', '-')} env, which this {family} agent needs"
        )
    env_shape = make_envs(env_id, family, 1, 0).observation_space.shape
    agent_shape = (agent.network[0].in_channels, 84, 84) if family == "atari" else (agent.actor[0].in_features,)
    if env_shape != agent_shape:
        plumbing.fail(f"{env_id} gives observations of shape {env_shape}; the checkpoint's agent takes {agent_shape}")
    return agent.eval(), family, env_id, script


def make_envs(env_id: str, family: str, num_envs: int, seed: int):
    # Atari as in training (CleanRL's settings: a lost life ends the training episode, rewards clipped); the score
    # counted is the full game's, unclipped, from info["reward"] until info["terminated"]
    extra = dict(episodic_life=True, reward_clip=True) if family == "atari" else {}
    return envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, seed=seed, **extra)


def play(policy, env_id: str, family: str, args: Args, record: Optional[list] = None) -> list:
    """One episode in each of --episodes envs: their returns. `record` collects the observations seen."""
    envs = make_envs(env_id, family, args.episodes, args.seed)
    obs, _ = envs.reset()
    returns = np.zeros(args.episodes)
    done = np.zeros(args.episodes, dtype=bool)
    with torch.no_grad():
        while not done.all():
            obs_t = torch.from_numpy(obs)
            if record is not None and sum(len(x) for x in record) < args.calibration:
                record.append(obs_t.clone())
            obs, reward, terminated, truncated, info = envs.step(policy(obs_t)[0].numpy())
            if family == "atari":  # envpool gives info["terminated"] as int32
                reward = info["reward"]
                terminated = info["terminated"].astype(bool)
            returns += np.where(done, 0.0, reward)
            done |= terminated | truncated
    envs.close()
    return returns.tolist()


def unstructured(net: nn.Module, ratio: float) -> nn.Module:
    """L1 mask pruning of every Linear and Conv weight, made permanent: the zeros stay in dense tensors, so the
    model is no smaller and no faster without a sparse kernel; the row shows what the zeros cost in score."""
    out = copy.deepcopy(net)
    for module in out.modules():
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            prune.l1_unstructured(module, "weight", amount=ratio)
            prune.remove(module, "weight")
    return out


def compressed(agent: nn.Module, args: Args, calibration: torch.Tensor) -> dict:
    """{row name: builder of the compressed network} for the chosen methods, in the table's order."""
    rows = {"fp32": lambda: agent}
    for method in args.methods:
        if method in ("fp16", "bf16"):
            dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[method]
            rows[method] = lambda dtype=dtype: to_dtype(agent, dtype)
        elif method == "int8-dynamic":
            rows[method] = lambda: int8_dynamic(agent)
        elif method == "int8-static":
            rows[method] = lambda: int8_static(agent, calibration)
        elif method == "structured":
            for r in args.structured_ratios:
                rows[f"structured-{r:.0%}"] = lambda r=r: prune_structured(agent, r, calibration[:2])
        elif method == "unstructured":
            for r in args.unstructured_ratios:
                rows[f"unstructured-{r:.0%}"] = lambda r=r: unstructured(agent, r)
    return rows


def zero_fraction(net: nn.Module) -> float:
    """Fraction of exact zeros among the float weights of Linear and Conv layers (int8 ones are not counted)."""
    weights = [
        m.weight
        for m in net.modules()
        if isinstance(m, (nn.Linear, nn.Conv2d))
        and m.weight.is_floating_point()
        and type(m.weight) in (torch.Tensor, nn.Parameter)
    ]
    return sum(int((w == 0).sum()) for w in weights) / max(sum(w.numel() for w in weights), 1)


def acting(net: nn.Module, args: Args):
    """The acting step; compiled, one static-shape graph per batch size (the envs' and the timing batch)."""
    policy = Policy(net, gaussian=False, deterministic=args.deterministic)
    return torch.compile(policy, dynamic=False) if args.compile else policy


def forward_time(fn, obs: torch.Tensor, passes: int) -> float:
    with torch.no_grad():
        for _ in range(3):  # compiles for this batch size, then warms up
            fn(obs)
        times = []
        for _ in range(passes):
            t0 = time.perf_counter()
            fn(obs)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(args: Args):
    check_args(args)
    agent, family, env_id, script = load_agent(args)
    torch.set_num_threads(args.num_threads or (2 if family == "atari" else 1))
    torch.manual_seed(args.seed)

    seen = []
    reference = play(acting(agent, args), env_id, family, args, record=seen)
    calibration = torch.cat(seen)[: args.calibration]
    timing_obs = calibration[torch.randperm(len(calibration))[: args.batch]]
    if len(timing_obs) < args.batch:  # short episodes: repeat what was seen
        copies = (args.batch + len(timing_obs) - 1) // len(timing_obs)
        timing_obs = timing_obs.repeat(copies, *[1] * (timing_obs.dim() - 1))[: args.batch]
    start_load = os.getloadavg()[0]
    rows = []
    for name, build in compressed(agent, args, calibration).items():
        torch._dynamo.reset()  # each method compiles from scratch
        torch._inductor.config.freezing = name == "int8-static"  # see bench_inference.int8_static
        net = build()
        fn = acting(net, args)
        returns = reference if name == "fp32" else play(fn, env_id, family, args)
        size = serialized_size(net)
        rows.append(
            dict(
                method=name,
                mean=float(np.mean(returns)),
                std=float(np.std(returns)),
                time=forward_time(fn, timing_obs, args.passes),
                size=size,
                zeros=zero_fraction(net),
            )
        )
        r = rows[-1]
        print(
            f"{name:18s} return {r['mean']:8.1f} +- {r['std']:6.1f}  forward {r['time'] * 1e6:9.1f} us  "
            f"{r['size'] / 1e6:7.3f} MB",
            file=sys.stderr,
        )
    write_table(args, rows, env_id, script, (start_load, os.getloadavg()[0]))
    print(f"wrote {args.table}", file=sys.stderr)


def write_table(args: Args, rows: list, env_id: str, script: str, loads: tuple):
    info = plumbing.machine_info(torch.device("cpu"))
    base = rows[0]
    lines = [
        f"## {env_id}",
        "",
        f"Written by `python leanrl/tools/eval_compressed.py {args.checkpoint}`: the agent of `{script}` on {env_id}, "
        f"{args.episodes} episodes per method (one per env, all stepping together), actions "
        f"{'taken as the mode (argmax)' if args.deterministic else 'sampled from the policy'}; forward time of "
        f"the acting step (action, log-probability, value) for a batch of {args.batch} observations, median of "
        f"{args.passes} passes, {'torch.compile' if args.compile else 'eager'}, "
        f"{torch.get_num_threads()} thread(s); size = bytes of the state_dict as torch.save writes it.",
        "",
        f"Hardware: {info['cpu']}, torch {torch.__version__}. Load average (1 min) {loads[0]:.2f} at the "
        f"start, {loads[1]:.2f} at the end.",
        "",
        "| method | mean return (std) | forward us (batch "
        f"{args.batch}) | speed-up vs fp32 | size MB | size bytes | zero weights |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| `{r['method']}` | {r['mean']:.1f} ({r['std']:.1f}) | {r['time'] * 1e6:.1f} | "
            f"{(base['time'] / r['time'] - 1) * 100:+.0f}% | {r['size'] / 1e6:.3f} | {r['size']} | "
            f"{r['zeros']:.0%} |"
        )
    # one section per env: a run replaces its env's section and keeps the others (CartPole and Atari in one file)
    sections = {}
    if os.path.isfile(args.table):
        with open(args.table) as f:
            for part in f.read().split("\n## ")[1:]:
                sections[part.split("\n", 1)[0]] = "## " + part.rstrip("\n")
    sections[env_id] = "\n".join(lines)
    os.makedirs(os.path.dirname(args.table) or ".", exist_ok=True)
    with open(args.table, "w") as f:
        f.write("# Post-training compression of trained agents\n\n" + "\n\n".join(sections.values()) + "\n")


if __name__ == "__main__":
    main(plumbing.parse_args(Args))
