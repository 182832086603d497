"""The async-compile variants: ppo_compile_async_torchcompile.py and ppo_atari_envpool_compile_async_torchcompile.py.

`--compile --compile-async` trains eagerly while a subprocess fills Inductor's cache and a background thread compiles
from it, then swaps the compiled units in. Each compiled run here costs tens of seconds to minutes on 2 cores, so
only the runs the assertions need are made.
"""

import copy
import sys
from pathlib import Path

import pytest
import torch

from conftest import (
    PPO_ROW_FIELDS,
    ROOT,
    SMOKE,
    assert_rejected,
    load_script,
    read_metrics,
    read_summary,
    run_command,
    run_script,
)

CLASSIC, ATARI = "ppo_compile_async_torchcompile.py", "ppo_atari_envpool_compile_async_torchcompile.py"
SCRIPTS = (CLASSIC, ATARI)
ROW_FIELDS = PPO_ROW_FIELDS | {"compiled"}


def assert_async_compile_matches_eager(script: str, tmp_path: Path, tol: float, compared: int = 4, extra=()):
    """`--compile --compile-async`, swapped in at iteration 2 of the 4 smoke iterations, against the eager run of the
    same seed (both with the `extra` flags): the first `compared` iterations' losses agree within `tol` (relative and
    absolute). Only floating-point noise may differ (compiled kernels sum in another order; even eager matmuls differ
    in the last bits with the memory layout of their inputs); a random number drawn by the background compile, or
    training state it touched, would change the actions taken and the losses by orders of magnitude more. Returns the
    async run's process and summary, for the caller's own checks."""
    flags = (*SMOKE, "--num-threads", "1", *extra)
    run_script(script, *flags, log_dir=tmp_path / "eager")
    proc = run_script(
        script, *flags, "--compile", "--compile-async", "--compile-swap-iteration", "2", log_dir=tmp_path / "async"
    )
    eager, swapped = read_metrics(tmp_path / "eager"), read_metrics(tmp_path / "async")
    summary = read_summary(tmp_path / "async")
    assert [r["compiled"] for r in swapped] == [False, True, True, True]
    assert summary["swap_iteration"] == 2 and summary["compile_time"] > 0
    assert summary["time_to_compiled"] > swapped[0]["time"]
    assert "swapped in at iteration 2" in proc.stderr
    assert (tmp_path / "async" / "compile_async.log").exists()  # the compile subprocess ran, and said what it did
    keys = ("pg_loss", "v_loss", "entropy", "approx_kl", "clipfrac")
    for e, a in zip(eager[:compared], swapped[:compared], strict=True):
        assert {k: a[k] for k in keys} == pytest.approx({k: e[k] for k in keys}, rel=tol, abs=tol), a["iteration"]
    return proc, summary


def learner(family: str):
    """(module, agent, optimizer, args, update(agent, optimizer, batch), a minibatch) for `family`, as main
    builds them, at a size that runs eagerly in a blink."""
    torch.manual_seed(0)
    if family == "classic":
        m = load_script("ppo_compile_async_torchcompile")
        args = m.Args(num_envs=2, num_steps=8, num_minibatches=2)
        agent = m.Agent(4, 2)
        lr = torch.tensor(args.learning_rate)
        optimizer = m.make_optimizer(agent, lr, capturable=False)
        n = 16
        batch = [torch.randn(n, 4), torch.randint(0, 2, (n,))] + [torch.randn(n) for _ in range(4)]

        def step(agent, optimizer, batch):
            return m.update(agent, optimizer, args, *batch, torch.arange(n))

    else:
        m = load_script("ppo_atari_envpool_compile_async_torchcompile")
        args = m.Args(num_envs=2, num_steps=8, num_minibatches=2, split_envs=False)
        agent = m.Agent(4)
        lr = torch.tensor(args.learning_rate)
        optimizer = torch.optim.Adam(agent.parameters(), lr=lr, eps=1e-5, capturable=False)
        n = 8
        batch = [torch.randint(0, 256, (n, 4, 84, 84), dtype=torch.uint8), torch.randint(0, 4, (n,))]
        batch += [torch.randn(n) for _ in range(4)]

        def step(agent, optimizer, batch):
            return m.update(agent, optimizer, args, *batch)

    args.batch_size = args.num_envs * args.num_steps
    args.minibatch_size = args.batch_size // args.num_minibatches
    return m, agent, optimizer, args, step, batch


def twin_units(m, family: str, twin, args):
    """What compile_in_background builds around `twin` and warms up, in process."""
    device = torch.device("cpu")
    if family == "classic":
        units = m.compile_units(twin, args, device)
        m.warm_up(units, args, device, 4, 2)
        return units
    return m.warm_up(m.compile_units(twin, args, device, 1), args, device, (4, 84, 84), 4)


def state_of(agent, optimizer) -> list:
    return [p.detach().clone() for p in agent.parameters()] + [
        v.clone() for p in agent.parameters() for v in optimizer.state[p].values()
    ]


@pytest.mark.parametrize("updates_before", [0, 2], ids=["no-update-yet", "after-updates"])
@pytest.mark.parametrize("family", ["classic", "atari"])
def test_the_compiled_twin_takes_over_the_training_state(family, updates_before):
    """The design both scripts share: the background thread compiles the units around a twin of the learner
    (`compile_units`: its own agent, optimizer and lr) and warms them up, which trains the twin on zeros and must leave
    the loop's learner alone; at the swap `load_units` copies the training state into the twin. Then one more update
    of each learner gives the same parameters and Adam state, bit for bit: parameters, moments, step counts and lr
    all handed over (the swap at iteration 1, before any update, included: Atari's Adam has no state yet then).
    force_eager runs the compiled units' own Python, so nothing compiles here."""
    m, agent, optimizer, args, step, batch = learner(family)
    twin = copy.deepcopy(agent)  # as compile_in_background does when the run starts
    lr = optimizer.param_groups[0]["lr"]
    lr.fill_(1e-3)  # the loop anneals its lr tensor: the twin's must follow
    for _ in range(updates_before):
        step(agent, optimizer, batch)
    before = state_of(agent, optimizer)
    with torch.compiler.set_stance("force_eager"):
        units = twin_units(m, family, twin, args)
        assert all(torch.equal(a, b) for a, b in zip(state_of(agent, optimizer), before, strict=True))
        assert not set(map(id, units["agent"].parameters())) & set(map(id, agent.parameters()))
        m.load_units(units, agent, optimizer)
        step(agent, optimizer, batch)
        units["update_minibatch"](*batch, *([torch.arange(len(batch[0]))] if family == "classic" else []))
    assert units["lr"] == lr
    for a, b in zip(state_of(agent, optimizer), state_of(units["agent"], units["optimizer"]), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("script", SCRIPTS)
def test_compile_async_swap_matches_eager(script, tmp_path):
    """Also the smoke test of each script: the eager run and the swapped run both write every row field."""
    _, summary = assert_async_compile_matches_eager(script, tmp_path, tol=1e-4)
    for run in ("eager", "async"):
        rows = read_metrics(tmp_path / run)
        assert [r["global_step"] for r in rows] == [64, 128, 192, 256]
        assert all(ROW_FIELDS <= r.keys() for r in rows)
    assert not any(r["compiled"] for r in read_metrics(tmp_path / "eager"))
    assert summary["global_step"] == 256 and not summary["interrupted"]


def test_compile_async_run_ending_before_the_compile_exits_cleanly(log_dir):
    """A run shorter than the background compile: it trains eagerly to the end, writes everything and exits 0
    without waiting for the compile."""
    proc = run_script(CLASSIC, *SMOKE, "--compile", "--compile-async", "--save-model", log_dir=log_dir)
    summary = read_summary(log_dir)
    assert proc.returncode == 0 and summary["global_step"] == 256 and (log_dir / "agent.pt").exists()
    if summary["swap_iteration"] is None:  # the usual case: a 4-iteration run beats even a warm-cache compile
        assert not any(r["compiled"] for r in read_metrics(log_dir)) and summary["compile_time"] is None


# runs a script with torch.compiler.set_stance watched: each stance that skips guards, entered with a background
# compile pending (main's `pending`) or not
STANCE_PROBE = """
import runpy, sys, torch
sys.path.insert(0, sys.argv[2])
seen = []
real = torch.compiler.set_stance
def set_stance(*args, skip_guard_eval_unsafe=False, **kwargs):
    if skip_guard_eval_unsafe:
        seen.append(sys._getframe(1).f_locals.get("pending") is not None)
    return real(*args, skip_guard_eval_unsafe=skip_guard_eval_unsafe, **kwargs)
torch.compiler.set_stance = set_stance
script = sys.argv[1]
sys.argv = [script, *sys.argv[3:]]
try:
    runpy.run_path(script, run_name="__main__")
finally:
    print("skips while compiling", sum(seen), "after", len(seen) - sum(seen))
"""


def test_compile_async_skips_no_guard_while_the_twin_compiles(tmp_path):
    """torch.compiler.set_stance is process-wide: an eager update under skip_guard_eval_unsafe while the background
    thread compiled the twin's units made that compile raise ("Recompilation triggered with skip_guard_eval_unsafe
    stance"), and every cold-cache CartPole run of `--compile --compile-async` died at the swap. The loop skips guards
    only once no compile is pending: here none while it is, and some after the swap at iteration 2."""
    script = ROOT / "leanrl" / CLASSIC
    flags = [*SMOKE, "--compile", "--compile-async", "--compile-swap-iteration", "2", "--log-dir", tmp_path / "run"]
    proc = run_command([sys.executable, "-c", STANCE_PROBE, script, ROOT / "leanrl", *flags], tmp_path / "probe", 600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("skips while compiling")]
    while_compiling, after = (int(word) for word in line.split()[3::2])
    assert while_compiling == 0 and after > 0, line


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize(
    "flags,words",
    [
        (["--compile-async"], ["need --compile"]),
        (["--compile-cache-only"], ["need --compile"]),
        (["--compile", "--compile-swap-iteration", "2"], ["needs --compile-async"]),
        (["--compile", "--compile-async", "--compile-swap-iteration", "0"], ["iteration >= 1"]),
    ],
)
def test_compile_async_flags_need_their_partner(script, flags, words, log_dir):
    assert_rejected(script, flags, words, log_dir)


@pytest.mark.parametrize("script", ["ppo_torchcompile.py", "ppo_atari_envpool_torchcompile.py"])
def test_base_scripts_carry_no_async_flag(script, log_dir):
    """The trick lives only in its own scripts: the base scripts reject its flag as unknown."""
    assert_rejected(script, ["--compile", "--compile-async"], ["unrecognized", "--compile-async"], log_dir)
