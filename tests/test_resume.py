"""Stop a run, resume it, and compare it with the run that was never stopped: every training script.

Each script runs under tests/resume_probe.py, same seed: stopped (as by Ctrl-C) at a log line, with its checkpoint;
resumed from that checkpoint; and, where the envs are gymnasium's classic control, uninterrupted. The resumed run, as
its loop starts, must hold what the uninterrupted one held at the step of the stop: every optimizer's parameters and
state, every replay buffer's rows and position (the tensors an update has bound included). Up to its stop the first
run is an uninterrupted one, so what it held there stands for it; where a third run is made, it must hold the same.
Classic control's state is in the checkpoint, so there the resumed run must also end where the uninterrupted one
ends, every tensor of the final checkpoint equal. envpool cannot snapshot its emulators: a resumed run plays fresh
games, so only its start is compared, and what describes the game in flight (a buffer's steps since the game's
reset) is left out; the continuous family's normalizer is checked by its own resume test.

Eager runs (no --compile): the same ops in the same order, so equal means bit for bit.
"""

import os
import re
import sys

import pytest
import torch

from conftest import ROOT, SMOKE, Child, read_metrics

SCRIPTS = sorted(p.name for p in (ROOT / "leanrl").glob("*.py") if p.name != "plumbing.py")
PPO = [*SMOKE[:4], "--total-timesteps", "640", "--num-threads", "1"]  # 10 iterations of 64 steps
OFFPOLICY = ["--learning-starts", "200", "--batch-size", "32", "--log-every", "200", "--measure-burnin", "100"]
# per family (the first prefix that matches): the flags, the step the first run stops at (after some updates)
FAMILIES = [
    ("ppo", PPO, 128),
    ("sac", [*OFFPOLICY, "--total-timesteps", "1000", "--buffer-size", "1000", "--num-threads", "1"], 400),
    ("td3", [*OFFPOLICY, "--total-timesteps", "1000", "--buffer-size", "1000", "--num-threads", "1"], 400),
    (
        "dqn_atari",
        ["--total-timesteps", "400", "--learning-starts", "100", "--log-every", "50", "--measure-burnin", "50"]
        + ["--buffer-size", "400", "--batch-size", "8", "--num-threads", "1"],
        200,
    ),
    (
        "dqn",
        ["--total-timesteps", "800", "--learning-starts", "200", "--log-every", "100", "--measure-burnin", "100"]
        + ["--target-network-frequency", "50", "--num-threads", "1"],
        400,
    ),
]
PRUNE_TWICE = ["--prune-ratio", "0.5", "--prune-start", "2", "--prune-every", "1", "--prune-steps", "2"]
# the scripts on gymnasium's classic control: the checkpoint holds the envs' state, so a resume is exact to the end
EXACT = {"ppo.py", "dqn.py"} | {s for s in SCRIPTS if s.startswith(("ppo_torchcompile", "dqn_torchcompile"))}
EXACT |= {
    f"ppo_{trick}_torchcompile.py" for trick in ("quantized", "pruned", "ddp", "compile_async", "teacher_student")
}


def flags_of(script: str) -> tuple:
    flags, stop = next((f, k) for family, f, k in FAMILIES if script.startswith(family))
    return [*flags, "--seed", "1", *(PRUNE_TWICE if "pruned" in script else ())], stop


def probe(script: str, mode: str, out, *flags, log_dir):
    env = dict(os.environ, PROBE=mode, PROBE_OUT=str(out))
    cmd = [sys.executable, ROOT / "tests" / "resume_probe.py", ROOT / "leanrl" / script, *flags, "--log-dir", log_dir]
    return Child(cmd, log_dir, env).result(600, check=False)


def rows_in_use(name: str, snap: dict) -> slice:
    """The rows of a store that hold data: a ring buffer's up to its position (all once full), staged rows up to
    their count; all rows of anything else."""
    store = name.split(".", 1)[0]
    if ".staged." in name:
        return slice(0, int(snap[f"{store}.n"]))
    if f"{store}.pos" in snap and not bool(snap.get(f"{store}.full", False)):
        size = int(snap[f"{store}.size"]) if f"{store}.size" in snap else None
        x = snap[name]
        if size is not None and x.dim() > 0 and x.shape[0] == size:
            return slice(0, int(snap[f"{store}.pos"]))
    return slice(None)


# a buffer's attributes that describe the game in flight, which a resumed run on envpool ends and restarts
IN_FLIGHT = re.compile(r"ReplayBuffer\d+\.(age|lives|resetting|new_game|pending)")


def assert_same_state(resumed: dict, straight: dict):
    resumed = {k: v for k, v in resumed.items() if not IN_FLIGHT.fullmatch(k)}
    straight = {k: v for k, v in straight.items() if not IN_FLIGHT.fullmatch(k)}
    assert resumed.keys() == straight.keys(), set(resumed) ^ set(straight)
    assert any(k.startswith("optimizer") for k in resumed), "no optimizer found"
    differ = []
    for name in sorted(straight):
        rows = rows_in_use(name, straight)
        a, b = resumed[name], straight[name]
        if b.dim() == 0:
            a, b = a.reshape(1), b.reshape(1)
        if a.shape != b.shape or not torch.equal(a[rows], b[rows]):
            differ.append(name)
    assert not differ, f"the resumed run starts from another state than the uninterrupted one: {differ}"


def tensors_of(x, prefix="") -> dict:
    if isinstance(x, torch.Tensor):
        return {prefix: x}
    if isinstance(x, dict):
        return {k: v for key, value in x.items() for k, v in tensors_of(value, f"{prefix}.{key}").items()}
    if isinstance(x, (list, tuple)):
        return {k: v for i, value in enumerate(x) for k, v in tensors_of(value, f"{prefix}.{i}").items()}
    return {}


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_resumed_run_starts_where_the_uninterrupted_one_was(script, tmp_path):
    flags, stop = flags_of(script)
    first = probe(script, f"stop:{stop}", tmp_path / "first.pt", *flags, "--save-model", log_dir=tmp_path / "first")
    assert first.returncode == 130, first.stderr[-3000:]  # stopped as by Ctrl-C, after its checkpoint
    ckpt = tmp_path / "first" / "agent.pt"
    # DDP's ranks agree to stop in the next iteration's all-reduce, an iteration later
    stop = torch.load(ckpt, weights_only=True)["global_step"]
    assert read_metrics(tmp_path / "first")[-1]["global_step"] == stop

    save = ["--save-model"] if script in EXACT else []
    resumed = probe(script, "resumed", tmp_path / "resumed.pt", *flags, *save, "--resume", ckpt, log_dir=tmp_path / "r")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    if script not in EXACT:
        # up to its stop the first run is the uninterrupted one: what it held there is what a run never stopped holds
        assert_same_state(torch.load(tmp_path / "resumed.pt"), torch.load(tmp_path / "first.pt"))
        return
    straight = probe(script, f"at:{stop}", tmp_path / "straight.pt", *flags, *save, log_dir=tmp_path / "s")
    assert straight.returncode == 0, straight.stderr[-3000:]
    assert_same_state(torch.load(tmp_path / "resumed.pt"), torch.load(tmp_path / "straight.pt"))
    # the first run, up to its stop, was that uninterrupted run: it held the same there
    assert_same_state(torch.load(tmp_path / "first.pt"), torch.load(tmp_path / "straight.pt"))

    # the envs resume too: the two runs end alike, every tensor of their checkpoints equal
    a = tensors_of(torch.load(tmp_path / "r" / "agent.pt", weights_only=True))
    b = tensors_of(torch.load(tmp_path / "s" / "agent.pt", weights_only=True))
    assert a.keys() == b.keys()
    differ = [k for k in b if a[k].shape != b[k].shape or not torch.equal(a[k], b[k])]
    assert not differ, f"the resumed run ends elsewhere than the uninterrupted one: {differ}"
