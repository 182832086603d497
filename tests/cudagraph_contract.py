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
  captured ones again);
- (d) nothing on the host: at its first call the unit runs once more on a simulated CUDA device (meta tensors: no
  data), everything it reads (inputs, its modules' parameters and buffers, its optimizers' state and lr, the tensors
  it closes over) on that device and each Adam capturable, as a CUDA run has them. An op that reads or makes a tensor
  on the host (a tensor made without `device=`, a host constant, a copy from the host) or reads a value on the host
  (`.item()`) is a violation, named with its line.

`torch.compile` runs with dynamo's eager backend: the contract is about what traces, not about Inductor's kernels.
Every function the script compiles has its graph breaks recorded too (`compiled`): where a script refuses
`--cudagraphs` on a CPU (DDP on gloo), a `--compile` run shows what its units would capture.
The findings go to `<log_dir>/contract.json` (under torchrun, `contract.<rank>.json`): per unit its calls, its
signature and its violations, the optimizers' violations, and the final lr of every optimizer, for the test to set
against the run's metrics.
"""

import atexit
import contextlib
import copy
import functools
import json
import os
import runpy
import sys
import traceback
import types
from pathlib import Path

import tensordict.nn
import torch
import torch.optim.adam as torch_adam
from tensordict import TensorDictBase
from torch._dynamo.utils import counters
from torch.overrides import TorchFunctionMode, _get_current_function_mode, _pop_mode, _push_mode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

ROOT = Path(__file__).resolve().parent.parent
LEANRL = ROOT / "leanrl"
sys.path.insert(0, str(LEANRL))
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


# CUDA's stand-in, meta (no data): on a CPU-only build autograd over FakeTensorMode's fake CUDA tensors aborts the
# process (its stream needs CUDA's device guard) and Python indexing of one raises
STAND_IN = torch.device("meta")


# what makes a tensor from nothing: on the host unless given a device
FACTORIES = {
    torch.tensor,
    torch.as_tensor,
    torch.scalar_tensor,
    torch.zeros,
    torch.ones,
    torch.empty,
    torch.empty_strided,
    torch.full,
    torch.arange,
    torch.linspace,
    torch.eye,
    torch.rand,
    torch.randn,
    torch.randint,
    torch.randperm,
}


class HostTags(TorchFunctionMode):
    """The tensors a CUDA run would hold on the host, told apart on a CPU, where every tensor is there: those made
    without a device or on "cpu" spelled out, by `.cpu()` or `torch.from_numpy`, and those computed from them alone. A
    tensor on the learner's device was given `device` (a torch.device, as the scripts pass the learner's) or moved
    there by `.to(device)`. Active for the whole run but inside the units, which it would break into graphs."""

    def __init__(self):
        super().__init__()
        self.host = WeakIdKeyDictionary()

    def on_host(self, func, args, kwargs):
        """Where `func`'s output is: True on the host, False on the learner's device, None where it stays (in place)."""
        if func is torch.Tensor.cpu:
            return True
        if func is torch.Tensor.to and len(args) > 1 and isinstance(args[1], torch.Tensor):
            return args[1] in self.host
        device = kwargs.get("device")
        if func is torch.Tensor.to:
            device = next((a for a in args[1:] if isinstance(a, (str, torch.device))), device)
        if device is not None:
            return device == "cpu"
        if func in FACTORIES:
            return True
        if getattr(func, "__name__", "").endswith("_") or "out" in kwargs:
            return None
        tensors = [x for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
        return all(x in self.host for x in tensors) if tensors else None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func == torch.Tensor.data.__set__:  # `p.data = x` (Module.to): p is now where x is
            out, args = args[0], args[1:]
        host = self.on_host(func, args, kwargs)
        for x in tree_leaves(out):
            if isinstance(x, torch.Tensor) and host is not None:
                if host:
                    self.host[x] = True
                else:
                    self.host.pop(x, None)
        return out


HOST_TAGS = HostTags()


@contextlib.contextmanager
def untagged():
    """Outside HostTags: dynamo would trace the mode into a unit's graph, and a simulated unit needs none."""
    if _get_current_function_mode() is not HOST_TAGS:
        yield
        return
    _pop_mode()
    try:
        yield
    finally:
        _push_mode(HOST_TAGS)


class OnTheHost(Exception):
    pass


class HostWatch(TorchDispatchMode):
    """Sees every op of a unit run on the stand-in device: one that reads or makes a tensor on the host is what a GPU
    would copy from the host, bake into the graph at capture, or refuse as a device mismatch. But for a scalar the
    unit makes itself (a Python number under vmap, a constant): CUDA ops take a host scalar, a constant's value is the
    capture's at every replay too."""

    def __init__(self):
        super().__init__()
        self.own_scalars = WeakIdKeyDictionary()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # lift_fresh reads the Python data of torch.tensor(...): what it makes is checked
        for x in tree_leaves((args, kwargs)) if func is not torch.ops.aten.lift_fresh.default else ():
            if isinstance(x, torch.Tensor) and x.device != STAND_IN and x not in self.own_scalars:
                raise OnTheHost(f"{func} reads a tensor on {x.device}")
        out = func(*args, **kwargs)
        for x in tree_leaves(out):
            if isinstance(x, torch.Tensor) and x.device != STAND_IN:
                if x.dim():
                    raise OnTheHost(f"{func} makes a tensor on {x.device}")
                self.own_scalars[x] = True
        return out


class StandInCopy:
    """Deep copies of a unit and its inputs as a CUDA run has them: every tensor on the stand-in device (shape, dtype,
    strides and requires_grad kept), the learner's device the stand-in, closures copied with their cells, every Adam
    capturable."""

    def __init__(self):
        self.memo = {}

    @staticmethod
    def tensor(t, memo):
        if t in HOST_TAGS.host:
            return t  # where a CUDA run has it: reading it is the violation (HostWatch raises before any write)
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=STAND_IN).requires_grad_(t.requires_grad)

    @staticmethod
    def function(fn, memo):
        if not fn.__closure__:
            return fn
        cells = tuple(types.CellType() for _ in fn.__closure__)
        new = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, cells)
        new.__kwdefaults__ = fn.__kwdefaults__
        memo[id(fn)] = new
        for cell, old in zip(cells, fn.__closure__):
            try:
                contents = old.cell_contents
            except ValueError:  # a name the enclosing function has not assigned yet: nothing to read
                continue
            cell.cell_contents = copy.deepcopy(contents, memo)
        return new

    @staticmethod
    def optimizer(opt, memo):
        new = object.__new__(type(opt))
        memo[id(opt)] = new
        new.__dict__.update(copy.deepcopy(opt.__dict__, memo))
        for group in new.param_groups:
            group["capturable"] = True
        for state in new.state.values():
            if "step" in state:  # where a capturable Adam keeps it (a CPU run's, not capturable, has it on the host)
                state["step"] = torch.zeros((), device=STAND_IN)
        return new

    def __call__(self, *objs):
        patched = [(torch.Tensor, "__deepcopy__"), (torch.nn.Parameter, "__deepcopy__")]
        saved = [getattr(cls, name) for cls, name in patched]
        dispatch = dict(copy._deepcopy_dispatch)
        try:
            for cls, name in patched:
                setattr(cls, name, self.tensor)
            copy._deepcopy_dispatch[types.FunctionType] = self.function
            copy._deepcopy_dispatch[torch.device] = lambda d, memo: STAND_IN if d == LEARNER["device"] else d
            for opt in OPTIMIZERS:
                copy._deepcopy_dispatch[type(opt)] = self.optimizer
            return copy.deepcopy(objs, self.memo)
        finally:
            for (cls, name), old in zip(patched, saved):
                setattr(cls, name, old)
            copy._deepcopy_dispatch.clear()
            copy._deepcopy_dispatch.update(dispatch)


@contextlib.contextmanager
def autocast_on_stand_in():
    """torch.autocast on the stand-in device (meta has none): the CPU's, which leaves meta tensors alone."""
    autocast = torch.autocast

    class StandInAutocast(autocast):
        def __init__(self, device_type, *args, **kwargs):
            super().__init__("cpu" if device_type == STAND_IN.type else device_type, *args, **kwargs)

    torch.autocast = StandInAutocast
    try:
        yield
    finally:
        torch.autocast = autocast


def simulate(fn, args, kwargs):
    """`fn(*args, **kwargs)` once on the stand-in device; what it did on the host, with the line, or None."""
    capturable_on = torch_adam._get_capturable_supported_devices
    torch_adam._get_capturable_supported_devices = lambda supports_xla=True: [STAND_IN.type]
    try:
        with untagged():
            fn, args, kwargs = StandInCopy()(fn, args, kwargs)
            with HostWatch(), autocast_on_stand_in():
                fn(*args, **kwargs)
    except Exception as e:  # a host tensor, a host read (.item() on meta), a device mismatch: each is one on a GPU
        frames = [f for f in traceback.extract_tb(e.__traceback__) if Path(f.filename).resolve().parent == LEANRL]
        at = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno} `{frames[-1].line}`" if frames else ""
        return f"on a simulated CUDA device, {type(e).__name__}: {str(e).strip().splitlines()[0]}{at}"
    finally:
        torch_adam._get_capturable_supported_devices = capturable_on
    return None


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
        if self.calls == 1:
            found = simulate(uncompiled(self.module), args, kwargs)
            if found:
                self.violation(found)
        inputs = [x for x in leaves([list(args), kwargs]) if isinstance(x, torch.Tensor)]
        versions = [x._version for x in inputs]
        for x in inputs:
            if x.requires_grad:
                self.violation(f"an input requires grad: {tuple(x.shape)}")
            if x.device != LEARNER["device"]:
                self.violation(f"an input on {x.device}, the learner on {LEARNER['device']}: {tuple(x.shape)}")
        rng = torch.default_generator.get_state()
        before = breaks()
        with untagged():
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


def tensordicts_on_the_learner():
    """A TensorDict given a device holds its tensors there; on a CPU it moves none, so HostTags saw no move."""
    init = tensordict.TensorDict.__init__

    @functools.wraps(init)
    def init_on_device(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if self.device is not None and kwargs.get("device") != "cpu":
            for x in self.values(include_nested=True, leaves_only=True):
                HOST_TAGS.host.pop(x, None)

    tensordict.TensorDict.__init__ = init_on_device


def host_from_numpy():
    """torch.from_numpy, which torch-function modes do not see, tags what it makes as the host's."""
    from_numpy = torch.from_numpy

    @functools.wraps(from_numpy)
    def tagged(array):
        out = from_numpy(array)
        HOST_TAGS.host[out] = True
        return out

    torch.from_numpy = tagged


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
        with untagged():
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
    tensordicts_on_the_learner()
    host_from_numpy()
    keep_cudagraphs()
    eager_backend()
    atexit.register(report, log_dir)
    sys.argv = [script, *flags]
    with HOST_TAGS:
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
