"""Runs a training script with a probe on its run plumbing, for tests/test_resume.py.

    PROBE=stop:K PROBE_OUT=FILE python tests/resume_probe.py leanrl/<script>.py <flags>   # stopped at step K
    PROBE=resumed PROBE_OUT=FILE python tests/resume_probe.py ... --resume agent.pt        # as it resumes
    PROBE=at:K PROBE_OUT=FILE python tests/resume_probe.py ...                              # as it logs step K

`stop:K` stops the run as Ctrl-C would, at its log line of step K (the checkpoint is written there, deterministically),
and snapshots it there as `at:K` does (at the next log line too where DDP's ranks stop an iteration later);
`resumed` snapshots the learner as the resumed run starts its loop, its checkpoint loaded; `at:K` snapshots it at the
log line of step K, where a run that was never stopped holds what the checkpoint holds. The snapshot (torch.save into
PROBE_OUT) is what the next updates will read: every optimizer's parameters and state (the lr aside: the loop sets it
at each iteration), and every replay buffer of the script (its `ReplayBuffer` objects, every tensor, array and number
they hold, the plain tensors an update has bound included; a buffer that stages rows on the host is flushed first, as
it would be before its next update).
"""

import gc
import os
import runpy
import sys
from pathlib import Path

import numpy as np
import torch
from tensordict import TensorDictBase

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "leanrl"))
import plumbing  # noqa: E402

STORES = ("ReplayBuffer",)
OPTIMIZERS = []


def tensors(prefix: str, x, out: dict):
    """The tensors, arrays and numbers under `x`, flattened into `out` by name."""
    if isinstance(x, torch.Tensor):
        out[prefix] = x.detach().cpu().clone()
    elif isinstance(x, np.ndarray):
        out[prefix] = torch.from_numpy(np.array(x))
    elif isinstance(x, TensorDictBase):
        for key, value in x.flatten_keys(".").items():
            tensors(f"{prefix}.{key}", value, out)
    elif isinstance(x, dict):
        for key, value in x.items():
            tensors(f"{prefix}.{key}", value, out)
    elif isinstance(x, (bool, int, float)):
        out[prefix] = torch.tensor(x)


def snapshot() -> dict:
    out = {}
    for i, optimizer in enumerate(OPTIMIZERS):
        params = [p for group in optimizer.param_groups for p in group["params"]]
        for j, p in enumerate(params):
            tensors(f"optimizer{i}.param{j}", p, out)
            tensors(f"optimizer{i}.param{j}.state", optimizer.state.get(p, {}), out)
    found = {}
    for obj in gc.get_objects():
        name = type(obj).__name__
        if name in STORES and type(obj).__module__ == "__main__":
            if hasattr(obj, "flush"):  # rows staged on the host belong to the buffer: into its tensors first
                obj.flush()
            n = found.setdefault(name, 0)
            found[name] += 1
            for attr, value in vars(obj).items():
                tensors(f"{name}{n}.{attr}", value, out)
    return out


def save(snap: dict, out: str):
    """Into `out` whole: a DDP run's ranks each write theirs (the same learner), and whichever writes last, the file
    is one rank's complete snapshot."""
    tmp = f"{out}.{os.getpid()}"
    torch.save(snap, tmp)
    os.replace(tmp, out)


def main():
    script, *flags = sys.argv[1:]
    mode, _, step = os.environ["PROBE"].partition(":")
    out = os.environ["PROBE_OUT"]
    init = torch.optim.Optimizer.__init__

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        OPTIMIZERS.append(self)

    torch.optim.Optimizer.__init__ = recording_init
    run_init = plumbing.Run.__init__
    run_log = plumbing.Run.log

    def probed_init(self, *args, **kwargs):
        run_init(self, *args, **kwargs)
        if mode == "resumed":
            save(snapshot(), out)

    def probed_log(self, global_step, *args, **kwargs):
        row = run_log(self, global_step, *args, **kwargs)
        # a stopped run snapshots each log line from step K on: the last is the one its checkpoint was saved at
        if (mode == "at" and global_step == int(step)) or (mode == "stop" and global_step >= int(step)):
            save(snapshot(), out)
        if mode == "stop" and global_step == int(step):
            self.stop.set = True  # as Ctrl-C at this log line: the loop stops here and saves its checkpoint
        return row

    plumbing.Run.__init__ = probed_init
    plumbing.Run.log = probed_log
    sys.argv = [script, *flags]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
