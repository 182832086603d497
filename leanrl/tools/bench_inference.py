"""What each trick buys a policy's forward pass: the acting step of every family's network (sample an action, its
log-probability and the state value) timed under each compiler mode, CUDA graphs, bf16, int8 and 50% pruning, at
batch sizes 1 to 1024. Writes doc/inference_table.md and doc/inference.png.

    python leanrl/tools/bench_inference.py                                     # everything this machine can run
    python leanrl/tools/bench_inference.py --families classic-64x2 --batch-sizes 1 64 --repeats 20

Each cell builds its network fresh (same seed), applies the configuration, calls it once (that call compiles;
its time minus the median is the compile time), warms up, then reports the median of repeated single calls.
The networks are the training scripts' own (parameter names and shapes, so eval_compressed.py loads their
checkpoints into them); the compression methods here are the ones eval_compressed.py applies to trained agents.
"""

import copy
import io
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Literal, Optional

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # plumbing/ is in leanrl/, one up
import plumbing

FAMILIES = ("classic-64x2", "classic-4x512", "atari", "continuous")
CONFIGS = (
    "eager",
    "compile-default",
    "compile-reduce-overhead",
    "compile-max-autotune-no-cudagraphs",
    "compile-max-autotune",
    "cudagraphs",
    "bf16",
    "int8-dynamic",
    "int8-static",
    "pruned50",
)


@dataclass
class Args:
    """What each trick buys a policy's forward pass: every family's acting step under each configuration."""

    families: tuple[Literal[FAMILIES], ...] = FAMILIES
    """the policy networks: classic control MLP at 64x2 and 4x512 (CartPole, 4 obs, 2 actions), the Nature CNN
    (Atari, 4x84x84 uint8, 4 actions), the continuous-control MLP (64x64 tanh, Gaussian head, 17 obs, 6 actions)"""
    configs: tuple[Literal[CONFIGS], ...] = CONFIGS
    """what to time: eager; torch.compile modes; CUDA graphs (tensordict CudaGraphModule, CUDA only); bf16 weights,
    torchao dynamic int8 (Linear layers), PT2E static int8 (X86InductorQuantizer) and 50% structured pruning, each
    of these four under torch.compile (default mode)"""
    batch_sizes: tuple[int, ...] = (1, 8, 64, 256, 1024)
    """observations per forward pass (the number of envs acting at once)"""
    repeats: int = 100
    """timed calls per cell (after the compiling call and the warm-up); the cell reports their median"""
    warmup: int = 5
    """untimed calls after the first one (CUDA graphs capture, the allocator settles)"""
    max_seconds: float = 3.0
    """stop timing a cell after this many seconds once it has 5 timed calls (large CNN batches on a CPU)"""
    table: str = "doc/inference_table.md"
    """where the markdown table goes"""
    plot: str = "doc/inference.png"
    """where the plot goes"""
    num_threads: Optional[int] = None
    """torch intra-op threads (default: the training scripts', 1 for the MLPs and 2 for the CNN)"""
    cuda: bool = True
    """if toggled, run on CUDA when available"""
    seed: int = 1
    """seed of the networks' initialisation and the sample observations"""
    cold_compile: bool = False
    """disable Inductor's on-disk caches, so that every cell's compile time is a first compile (by default a graph
    compiled before on this machine loads from the cache in a fraction of the time)"""


def check_args(args: Args):
    if not args.families or not args.configs or not args.batch_sizes:
        plumbing.fail("--families, --configs and --batch-sizes each need at least one value")
    if min(args.batch_sizes) <= 0:
        plumbing.fail(f"--batch-sizes must be positive, got {' '.join(map(str, args.batch_sizes))}")
    for name in ("repeats", "max_seconds", "num_threads"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            plumbing.fail(f"--{name.replace('_', '-')} must be positive, got {value}")
    if args.warmup < 0:
        plumbing.fail(f"--warmup must be zero or more, got {args.warmup}")


# ---- the networks: the training scripts' architectures, parameter for parameter ----


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


def mlp(n_in: int, n_out: int, width: int, depth: int, out_std: float) -> nn.Sequential:
    layers = []
    for i in range(depth):
        layers += [layer_init(nn.Linear(n_in if i == 0 else width, width)), nn.Tanh()]
    return nn.Sequential(*layers, layer_init(nn.Linear(width, n_out), std=out_std))


class ClassicAgent(nn.Module):
    """ppo_torchcompile.py's Agent (64x2 tanh actor and critic) at any width and depth; forward gives the logits
    and the value. Inputs are cast to the weights' dtype, so the bf16/fp16 copies take fp32 observations."""

    gaussian = False

    def __init__(self, n_obs: int, n_actions: int, width: int = 64, depth: int = 2):
        super().__init__()
        self.critic = mlp(n_obs, 1, width, depth, 1.0)
        self.actor = mlp(n_obs, n_actions, width, depth, 0.01)

    def forward(self, obs):
        x = obs.to(self.critic[0].weight.dtype)
        return self.actor(x), self.critic(x).squeeze(-1)


class AtariAgent(nn.Module):
    """ppo_atari_envpool_torchcompile.py's Agent: the Nature CNN on uint8 frames, a linear actor and critic."""

    gaussian = False

    def __init__(self, n_actions: int):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)),
            nn.ReLU(),
        )
        self.actor = layer_init(nn.Linear(512, n_actions), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1)

    def forward(self, obs):
        hidden = self.network(obs.to(self.network[0].weight.dtype) / 255.0)
        return self.actor(hidden), self.critic(hidden).squeeze(-1)


class ContinuousAgent(nn.Module):
    """CleanRL's ppo_continuous_action.py Agent: 64x64 tanh critic and actor mean, a state-independent log-std."""

    gaussian = True

    def __init__(self, n_obs: int, n_actions: int):
        super().__init__()
        self.critic = mlp(n_obs, 1, 64, 2, 1.0)
        self.actor_mean = mlp(n_obs, n_actions, 64, 2, 0.01)
        self.actor_logstd = nn.Parameter(torch.zeros(1, n_actions))

    def forward(self, obs):
        x = obs.to(self.critic[0].weight.dtype)
        return self.actor_mean(x), self.actor_logstd, self.critic(x).squeeze(-1)


class Policy(nn.Module):
    """The acting step around a network (or its compressed copy): sample an action, its log-probability, the value.
    Discrete actions by the Gumbel-max trick (exact Categorical sampling, no Distribution object, compiles whole);
    `deterministic` takes the mode instead (argmax, or the Gaussian mean)."""

    def __init__(self, net: nn.Module, gaussian: bool, deterministic: bool = False):
        super().__init__()
        self.net = net
        self.gaussian = gaussian
        self.deterministic = deterministic

    def forward(self, obs):
        if self.gaussian:
            mean, logstd, value = self.net(obs)
            mean = mean.float()
            logstd = logstd.float()
            action = mean if self.deterministic else mean + logstd.exp() * torch.randn_like(mean)
            z = (action - mean) * (-logstd).exp()
            logprob = (-0.5 * z * z - logstd - 0.5 * math.log(2 * math.pi)).sum(-1)
            return action, logprob, value.float()
        logits, value = self.net(obs)
        logp = logits.float().log_softmax(-1)
        scores = logp if self.deterministic else logp - (-torch.rand_like(logp).log()).log()
        action = scores.argmax(-1)
        return action, logp.gather(-1, action.unsqueeze(-1)).squeeze(-1), value.float()


def make_network(family: str) -> nn.Module:
    return {
        "classic-64x2": lambda: ClassicAgent(4, 2),
        "classic-4x512": lambda: ClassicAgent(4, 2, 512, 4),
        "atari": lambda: AtariAgent(4),
        "continuous": lambda: ContinuousAgent(17, 6),
    }[family]()


def sample_obs(family: str, batch: int, generator: torch.Generator) -> torch.Tensor:
    if family == "atari":
        return torch.randint(0, 256, (batch, 4, 84, 84), dtype=torch.uint8, generator=generator)
    return torch.randn(batch, 17 if family == "continuous" else 4, generator=generator)


# ---- post-training compression, shared with eval_compressed.py ----


def heads(net: nn.Module) -> list:
    """The output layers: pruning keeps their outputs (the action count, the value)."""
    names = ("actor", "critic", "actor_mean")
    return [m[-1] if isinstance(m, nn.Sequential) else m for n, m in net.named_children() if n in names]


def to_dtype(net: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Half-precision weights (bf16 or fp16): half the bytes to read; the forward casts the inputs to match."""
    return copy.deepcopy(net).to(dtype)


def int8_dynamic(net: nn.Module) -> nn.Module:
    """torchao's dynamic int8: int8 weights (per channel), activations quantized per token at run time. Linear
    layers only; convolutions stay fp32. Its int8 kernels come from torch.compile (eager runs a slow reference)."""
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    out = copy.deepcopy(net)
    quantize_(out, Int8DynamicActivationInt8WeightConfig())
    return out


def int8_static(net: nn.Module, calibration: torch.Tensor) -> nn.Module:
    """PT2E static int8 with the X86InductorQuantizer: int8 weights and activations (convolutions and Linear
    layers), activation ranges calibrated on `calibration` observations. Compile it with inductor's freezing on
    (torch._inductor.config.freezing, global: the per-call option fails here): inductor then folds the
    quantize/dequantize pairs into int8 (oneDNN) kernels."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

    batch = torch.export.Dim("batch", min=1, max=1 << 16)
    exported = torch.export.export(copy.deepcopy(net).eval(), (calibration[:2],), dynamic_shapes=({0: batch},))
    quantizer = X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(exported.module(), quantizer)
    with torch.no_grad():
        for chunk in calibration.split(256):
            prepared(chunk)
    quantized = convert_pt2e(prepared)
    # convert_pt2e leaves the fp32 weights it replaced by int8 ones registered: drop what the graph no longer reads
    read = {node.target for node in quantized.graph.nodes if node.op == "get_attr"}
    for name in [n for n in quantized.state_dict() if n not in read]:
        prefix, _, leaf = name.rpartition(".")
        delattr(quantized.get_submodule(prefix), leaf)
    return quantized


def prune_structured(net: nn.Module, ratio: float, example: torch.Tensor) -> nn.Module:
    """Torch-Pruning's structured magnitude pruning: removes the `ratio` of hidden channels/units with the smallest
    L2 norm from every layer (dependencies across layers followed), so the layers really shrink; heads keep their
    outputs."""
    import torch_pruning as tp

    out = copy.deepcopy(net)
    with torch.enable_grad():  # Torch-Pruning traces the layers' dependencies through autograd
        pruner = tp.pruner.MagnitudePruner(
            out,
            example_inputs=example,
            pruning_ratio=ratio,
            ignored_layers=heads(out),
            importance=tp.importance.MagnitudeImportance(p=2),
        )
        pruner.step()
    return out


def serialized_size(net: nn.Module) -> int:
    """Bytes of the model's state_dict as torch.save writes it: what a checkpoint of it weighs."""
    buffer = io.BytesIO()
    torch.save(net.state_dict(), buffer)
    return len(buffer.getvalue())


# ---- the benchmark ----


def skip_reason(config: str, device: torch.device) -> Optional[str]:
    if config in ("cudagraphs", "compile-max-autotune") and device.type != "cuda":
        return (
            "CUDA graphs need a CUDA device"
            if config == "cudagraphs"
            else "its CUDA graphs need a CUDA device; without them it is compile-max-autotune-no-cudagraphs"
        )
    if config == "int8-static" and device.type != "cpu":
        return "the X86InductorQuantizer targets x86 CPUs"
    if config == "bf16" and device.type == "cpu" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return "this CPU has no native bf16 (AVX512-BF16 or AMX)"
    return None


def build(config: str, net: nn.Module, gaussian: bool, obs: torch.Tensor, calibration: torch.Tensor):
    """The acting callable for one configuration."""
    if config == "eager":
        return Policy(net, gaussian)
    if config.startswith("compile-"):
        return torch.compile(Policy(net, gaussian), mode=config[len("compile-") :])
    if config == "cudagraphs":
        from tensordict.nn import CudaGraphModule

        return CudaGraphModule(Policy(net, gaussian), warmup=2)
    if config == "int8-static":
        return torch.compile(Policy(int8_static(net, calibration), gaussian))
    compressed = {
        "bf16": lambda: to_dtype(net, torch.bfloat16),
        "int8-dynamic": lambda: int8_dynamic(net),
        "pruned50": lambda: prune_structured(net, 0.5, obs),
    }[config]()
    return torch.compile(Policy(compressed, gaussian))


def time_cell(fn, obs, args: Args, device: torch.device):
    """(median seconds per call, compile seconds): the first call compiles, then warm-up, then timed calls."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    with torch.no_grad():
        t0 = time.perf_counter()
        fn(obs)
        sync()
        first = time.perf_counter() - t0
        for _ in range(args.warmup):
            fn(obs)
        sync()
        times = []
        start = time.perf_counter()
        while len(times) < args.repeats and (len(times) < 5 or time.perf_counter() - start < args.max_seconds):
            t0 = time.perf_counter()
            fn(obs)
            sync()
            times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    return median, max(first - median, 0.0)


def run(args: Args, device: torch.device, done) -> dict:
    """{family: {config: {batch: (median s, compile s)} or skip reason (str)}}; done(results) after each family."""
    results = {}
    for family in args.families:
        torch.set_num_threads(args.num_threads or (2 if family == "atari" else 1))
        gen = torch.Generator().manual_seed(args.seed)
        calibration = sample_obs(family, 256, gen).to(device)
        results[family] = {}
        for config in args.configs:
            reason = skip_reason(config, device)
            if reason:
                results[family][config] = reason
                continue
            cells = results[family][config] = {}
            for batch in args.batch_sizes:
                torch._dynamo.reset()  # each cell compiles from scratch: no recompile limit, its own compile time
                torch._inductor.config.freezing = config == "int8-static"
                torch._inductor.config.force_disable_caches = args.cold_compile
                torch.manual_seed(args.seed)
                net = make_network(family).to(device).eval()
                obs = sample_obs(family, batch, gen).to(device)
                fn = build(config, net, net.gaussian, obs, calibration)
                cells[batch] = time_cell(fn, obs, args, device)
                print(
                    f"{family:14s} {config:36s} batch {batch:5d}: {cells[batch][0] * 1e6:10.1f} us, "
                    f"compile {cells[batch][1]:.1f} s",
                    file=sys.stderr,
                )
        done(results)
    return results


def speedup(t, base):
    return f"{(base / t - 1) * 100:+.0f}%" if base else "-"


def write_table(args: Args, results: dict, device: torch.device, loads: tuple, path: str):
    info = plumbing.machine_info(device)
    lines = [
        "# Inference: the acting forward pass",
        "",
        "Written by `python leanrl/tools/bench_inference.py`. One acting step (sample an action, its log-probability "
        "and the value) per call; median of up to "
        f"{args.repeats} timed calls after {args.warmup} warm-up calls (fewer for cells slower than "
        f"{args.max_seconds:g} s in all). Speed-up is eager time / time - 1 (+100% = twice as fast). bf16, "
        "int8-dynamic, int8-static and pruned50 run under torch.compile (default mode; int8-static with "
        "freezing=True); int8-dynamic is torchao's Int8DynamicActivationInt8WeightConfig on the Linear layers "
        "only (the CNN's convolutions stay fp32), int8-static is PT2E with the X86InductorQuantizer on "
        "convolutions and Linear layers, calibrated on 256 random sample observations; pruned50 is "
        "Torch-Pruning's structured L2-magnitude pruning of 50% of the hidden units and channels, heads kept.",
        "",
        f"Hardware: {info['cpu']}, GPU: {info['gpu'] or 'none'}, device {device}, torch {torch.__version__}. "
        f"Load average (1 min) {loads[0]:.2f} at the start, {loads[1]:.2f} at the end. Compile times: "
        + (
            "first compiles (`--cold-compile`: Inductor's caches disabled)."
            if args.cold_compile
            else "Inductor's on-disk cache on, so a graph this machine compiled before loads from it: warm-cache times "
            "(`--cold-compile` for first compiles)."
        ),
        "",
    ]
    for family, configs in results.items():
        threads = args.num_threads or (2 if family == "atari" else 1)
        lines += [
            f"## {family} ({threads} thread{'s' if threads > 1 else ''})",
            "",
            "| configuration | "
            + " | ".join(f"batch {b}: us (speed-up)" for b in args.batch_sizes)
            + " | compile s (per batch size) |",
            "|---|" + "---:|" * len(args.batch_sizes) + "---|",
        ]
        eager = configs.get("eager") if isinstance(configs.get("eager"), dict) else {}
        skipped = []
        for config, cells in configs.items():
            if isinstance(cells, str):
                skipped.append(f"`{config}` ({cells})")
                continue
            row = [
                f"{cells[b][0] * 1e6:.1f} ({speedup(cells[b][0], eager.get(b, (None,))[0])})" for b in args.batch_sizes
            ]
            lines.append(
                f"| `{config}` | "
                + " | ".join(row)
                + " | "
                + " / ".join(f"{cells[b][1]:.1f}" for b in args.batch_sizes)
                + " |"
            )
        if skipped:
            lines += ["", "Skipped here: " + "; ".join(skipped) + "."]
        lines.append("")
    lines += [f"![inference times]({os.path.relpath(args.plot, os.path.dirname(path) or '.')})", ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def write_plot(results: dict, path: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4.5 * len(results), 4), squeeze=False)
    for ax, (family, configs) in zip(axes[0], results.items()):
        for i, (config, cells) in enumerate(configs.items()):
            if isinstance(cells, dict):
                batches = sorted(cells)
                ax.plot(batches, [cells[b][0] * 1e6 for b in batches], marker="o", color=f"C{i}", label=config)
        ax.set(xscale="log", yscale="log", xlabel="batch size", ylabel="us per acting call", title=family)
        ax.grid(alpha=0.3, which="both")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(args: Args):
    check_args(args)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    for path in (args.table, args.plot):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    start_load = os.getloadavg()[0]

    def write(results):  # after every family: a long run leaves its finished families written
        write_table(args, results, device, (start_load, os.getloadavg()[0]), args.table)
        write_plot(results, args.plot)

    run(args, device, write)
    print(f"wrote {args.table} and {args.plot}", file=sys.stderr)


if __name__ == "__main__":
    main(plumbing.parse_args(Args))
