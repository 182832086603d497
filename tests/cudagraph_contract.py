"""Runs a training script on the CPU as a GPU would run it under `--cudagraphs`, and checks the CUDA-graph contract.

    python tests/cudagraph_contract.py leanrl/<script>.py --cudagraphs [--compile] <flags...> --log-dir DIR

Without CUDA a script drops `--cudagraphs`; here it keeps it, and every tensordict `CudaGraphModule` the script builds
is a `Recorder`: it calls the unit as `CudaGraphModule` would (the first call warms up, the second captures, the rest
replay), and at every call from the capture on it checks what a CUDA graph needs (DESIGN.md, "The CUDA-graph
contract"):

- (a) one input signature: the shapes, dtypes and devices of the tensors, and the other arguments' values, of the
  capture;
- (b) the unit traces whole under dynamo: no graph break (a host sync, a Python branch on a tensor's value, an
  unsupported call) but the three that LeanRL's update idiom has by construction and that a capture spans:
  `optimizer.zero_grad()`, `loss.backward()` and the grad-mode switch inside `optimizer.step()`;
- (c) the tensors on the learner's device: the inputs, the outputs, the parameters and every Adam's state, with
  `capturable` as the learner's device asks (on CUDA, so that the step counters stay on the device; elsewhere not)
  and each step counter where that puts it;
- and what else a replay assumes: no input requires grad, no input is written in place (a replay writes the graph's
  own copy), no output requires grad, no random number is drawn from torch's global generator (a replay would draw the
  captured ones again).

`torch.compile` runs with dynamo's eager backend: the contract is about what traces, not about Inductor's kernels.
Every function the script compiles has its graph breaks recorded too (`compiled`): where a script refuses
`--cudagraphs` on a CPU (DDP on gloo), a `--compile` run shows what its units would capture.
The findings go to `<log_dir>/contract.json` (under torchrun, `contract.<rank>.json`): per unit its calls, its
signature and its violations, the optimizers' violations, and the final lr of every optimizer, for the test to set
against the run's metrics.
"""

import atexit
import functools
import json
import os
import runpy
import sys
from pathlib import Path

import tensordict.nn
import torch
from tensordict import TensorDictBase
from torch._dynamo.utils import counters

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "leanrl"))
import plumbing  # noqa: E402

# the graph breaks of LeanRL's update idiom (zero_grad, backward, step): a CUDA graph captures across them, and none
# of them reads a value on the host
IDIOM_BREAKS = (
    "`Optimizer.zero_grad` should not be traced",
    "Tensor.backward()",
    "User-inserted graph break. Message: None",  # torch.optim's _use_grad around step(), and nowhere in leanrl
    "Attempt to trace generator",  # torch 2.11: a generator frame run eagerly between the idiom's graphs, not a break
)

COMPILE = torch.compile  # torch's, before eager_backend() patches it
UNITS = []
COMPILED = []
OPTIMIZERS = []
OPTIMIZER_VIOLATIONS = []
LEARNER = {"device": None}


def unit_name(fn) -> str:
    while True:
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif hasattr(fn, "_torchdynamo_orig_callable"):
            fn = fn._torchdynamo_orig_callable
        elif hasattr(fn, "__wrapped__"):  # torch.compile's wrapper of a partial
            fn = fn.__wrapped__
        else:
            return getattr(fn, "__qualname__", type(fn).__name__)


def uncompiled(fn):
    """The function under a torch.compile wrapper (the script's --compile), to trace it ourselves."""
    return getattr(fn, "_torchdynamo_orig_callable", fn)


def leaves(x) -> list:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, TensorDictBase):
        return [v for _, v in sorted(x.flatten_keys(".").items())]
    if isinstance(x, (list, tuple)):
        return [leaf for item in x for leaf in leaves(item)]
    if isinstance(x, dict):
        return [leaf for key in sorted(x) for leaf in leaves(x[key])]
    return [x]


def signature(args, kwargs) -> list:
    return [
        ("tensor", tuple(x.shape), str(x.dtype), str(x.device)) if isinstance(x, torch.Tensor) else ("value", repr(x))
        for x in leaves([list(args), kwargs])
    ]


def breaks() -> dict:
    """dynamo's graph breaks so far, by reason (a tensor-valued branch is counted as unimplemented)."""
    out = {}
    for key in ("graph_break", "unimplemented"):
        for reason, n in counters[key].items():
            out[reason] = out.get(reason, 0) + n
    return out


class Recorder:
    """tensordict's CudaGraphModule, as a CPU can check it: same arguments, same calls, and the contract's checks."""

    def __init__(self, module, warmup: int = 2, in_keys=None, out_keys=None, device=None):
        self.module = module  # as CudaGraphModule has it: the pruned scripts wrap it again after each surgery
        self.name = unit_name(module)
        self.fn = COMPILE(uncompiled(module), backend="eager")
        self.warmup = warmup
        self.calls = 0
        self.captured = None
        self.violations = []
        self.idiom_breaks = []
        UNITS.append(self)

    def violation(self, what: str):
        if what not in self.violations:
            self.violations.append(what)

    def __call__(self, *args, **kwargs):
        self.calls += 1
        capture_on = self.calls >= self.warmup
        if capture_on:
            sig = signature(args, kwargs)
            if self.captured is None:
                self.captured = sig
            elif sig != self.captured:
                self.violation(
                    f"call {self.calls} has another input signature than the capture: {sig} vs {self.captured}"
                )
        inputs = [x for x in leaves([list(args), kwargs]) if isinstance(x, torch.Tensor)]
        versions = [x._version for x in inputs]
        for x in inputs:
            if x.requires_grad:
                self.violation(f"an input requires grad: {tuple(x.shape)}")
            if x.device != LEARNER["device"]:
                self.violation(f"an input on {x.device}, the learner on {LEARNER['device']}: {tuple(x.shape)}")
        rng = torch.default_generator.get_state()
        before = breaks()
        out = self.fn(*args, **kwargs)
        after = breaks()
        for reason, n in after.items():
            if n > before.get(reason, 0):
                what = " / ".join(line.strip() for line in reason.splitlines()[:2])
                if not any(ok in reason for ok in IDIOM_BREAKS):
                    self.violation("graph break: " + what)
                elif what not in self.idiom_breaks:
                    self.idiom_breaks.append(what)
        if not torch.equal(rng, torch.default_generator.get_state()):
            self.violation("draws random numbers from torch's global generator")
        for x, v in zip(inputs, versions):
            if x._version != v:
                self.violation(f"writes an input in place: {tuple(x.shape)}")
        for x in leaves(out):
            if isinstance(x, torch.Tensor) and x.requires_grad:
                self.violation(f"an output requires grad: {tuple(x.shape)}")
            if isinstance(x, torch.Tensor) and x.device != LEARNER["device"]:
                self.violation(f"an output on {x.device}, the learner on {LEARNER['device']}")
        if capture_on:
            OPTIMIZER_VIOLATIONS.extend(v for v in optimizer_violations() if v not in OPTIMIZER_VIOLATIONS)
        return out


def optimizer_violations() -> list:
    """Every Adam's parameters and state on the learner's device, capturable as that device asks (CUDA graphs replay
    the step with its counters on the device; elsewhere they stay on the host, as torch.optim keeps them)."""
    device = LEARNER["device"]
    capturable = device.type == "cuda"
    out = []
    for n, optimizer in enumerate(OPTIMIZERS):
        for group in optimizer.param_groups:
            if group.get("capturable") != capturable:
                out.append(
                    f"optimizer {n}: capturable={group.get('capturable')}, the learner on {device} asks {capturable}"
                )
            if isinstance(group["lr"], torch.Tensor) and group["lr"].device != device:
                out.append(f"optimizer {n}: lr on {group['lr'].device}, the learner on {device}")
            for p in group["params"]:
                if p.device != device:
                    out.append(f"optimizer {n}: a parameter on {p.device}, the learner on {device}")
                state = optimizer.state.get(p, {})
                step = state.get("step")
                want = device if capturable else torch.device("cpu")
                if isinstance(step, torch.Tensor) and step.device != want:
                    out.append(
                        f"optimizer {n}: a step counter on {step.device}, capturable={capturable} puts it on {want}"
                    )
                for key in ("exp_avg", "exp_avg_sq"):
                    if key in state and state[key].device != p.device:
                        out.append(f"optimizer {n}: {key} on {state[key].device}, its parameter on {p.device}")
    return out


def record_optimizers():
    init = torch.optim.Optimizer.__init__

    @functools.wraps(init)
    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        OPTIMIZERS.append(self)

    torch.optim.Optimizer.__init__ = recording_init


def keep_cudagraphs():
    """The learner's device as the script picks it, with --cudagraphs kept on."""
    pick = plumbing.pick_device

    def pick_device(args):
        wanted = args.cudagraphs
        device = pick(args)
        args.cudagraphs = wanted
        LEARNER["device"] = device
        return device

    plumbing.pick_device = pick_device


class Compiled:
    """A torch.compile'd function of the script's, run with dynamo's eager backend, its graph breaks recorded: a run
    without --cudagraphs (DDP on gloo refuses them) still shows what its compiled units would capture."""

    def __init__(self, fn):
        self._torchdynamo_orig_callable = fn  # as torch.compile's wrapper has it: a Recorder unwraps it
        self.name = unit_name(fn)
        self.fn = COMPILE(fn, backend="eager")
        self.breaks = []
        COMPILED.append(self)

    def __call__(self, *args, **kwargs):
        before = breaks()
        out = self.fn(*args, **kwargs)
        for reason, n in breaks().items():
            what = " / ".join(line.strip() for line in reason.splitlines()[:2])
            if n > before.get(reason, 0) and not any(ok in reason for ok in IDIOM_BREAKS) and what not in self.breaks:
                self.breaks.append(what)
        return out


def eager_backend():
    def compile_eager(model=None, **kwargs):
        if model is None:
            return lambda fn: compile_eager(fn, **kwargs)
        return Compiled(model)

    torch.compile = compile_eager


def report(log_dir: str):
    # a seeds script's optimizer holds one lr per member
    lrs = [torch.as_tensor(g["lr"]).reshape(-1).tolist() for optimizer in OPTIMIZERS for g in optimizer.param_groups]
    finals = [float(lr) for group in lrs for lr in group]
    units = [
        dict(name=u.name, calls=u.calls, signature=u.captured, violations=u.violations, idiom_breaks=u.idiom_breaks)
        for u in UNITS
    ]
    rank = os.environ.get("RANK", "0") if os.environ.get("WORLD_SIZE", "1") != "1" else ""
    with open(os.path.join(log_dir, f"contract{rank and '.' + rank}.json"), "w") as f:
        json.dump(
            dict(
                units=units,
                compiled={c.name: c.breaks for c in COMPILED},
                optimizers=OPTIMIZER_VIOLATIONS,
                optimizer_lr=finals,
                device=str(LEARNER["device"]),
            ),
            f,
            indent=1,
        )


def main():
    script, *flags = sys.argv[1:]
    log_dir = flags[flags.index("--log-dir") + 1]
    tensordict.nn.CudaGraphModule = Recorder
    record_optimizers()
    keep_cudagraphs()
    eager_backend()
    atexit.register(report, log_dir)
    sys.argv = [script, *flags]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
