"""Pruned PPO: ppo_pruned_torchcompile.py (classic control) and ppo_atari_envpool_pruned_torchcompile.py.

The surgery is checked against an independent reference: the units a pruning step removed are found by matching
the pruned weights against the original ones, the original agent with those units zeroed must give the pruned
agent's outputs, and for magnitude importance the removed units must be the ones of smallest L2 group norm,
computed here from the weights. Compiling costs tens of seconds per process, so the classic script runs with
--compile three times (pruning at iteration 2, so the units are traced, pruned, then traced again: once shared by the
smoke tests, once against the eager run; and the learning run, as doc/learning.md runs it) and the Atari script runs
eagerly.
"""

import copy
import dataclasses

import pytest
import torch
import torch.nn as nn

from conftest import (
    SMOKE,
    assert_rejected,
    load_script,
    read_metrics,
    read_summary,
    run_script,
    smoke_fixture,
)

CLASSIC, ATARI = "ppo_pruned_torchcompile.py", "ppo_atari_envpool_pruned_torchcompile.py"
# prune within the smoke budget of 4 iterations: before iterations 2 and 3, each taking half the 0.5 ratio
SOON = ("--prune-ratio", "0.5", "--prune-start", "2", "--prune-every", "1")
RUNS = [
    (CLASSIC, SOON + ("--prune-steps", "1", "--compile", "--cudagraphs")),  # traced, pruned, traced again
    (CLASSIC, SOON + ("--prune-steps", "2", "--save-model")),
    (CLASSIC, SOON + ("--prune-steps", "2", "--prune-mode", "mask", "--prune-importance", "random")),
    # eager: the classic run shows the re-trace (a CNN compile costs ~40 s); two env pools, each acting with the copy
    # that takes the pruned shapes
    (ATARI, SOON + ("--prune-steps", "1", "--split-envs", "--num-envs", "2", "--num-steps", "32")),
    (ATARI, SOON + ("--prune-steps", "2", "--prune-mode", "mask")),
]


# CartPole-v1's solved mark, the low end of the baseline's final returns at 500k steps in doc/learning.md (474.9-500)
FINAL = 475


def n_params(*shapes):
    """Parameters of conv/linear layers given as (out, in, kernel area)."""
    return sum(o * i * k + o for o, i, k in shapes)


# half of every hidden layer gone, heads intact: CartPole (4 obs, 2 actions) at 64 x 2, Breakout (4 actions)
PARAMS = {
    CLASSIC: (
        n_params((64, 4, 1), (64, 64, 1), (1, 64, 1), (64, 4, 1), (64, 64, 1), (2, 64, 1)),
        n_params((32, 4, 1), (32, 32, 1), (1, 32, 1), (32, 4, 1), (32, 32, 1), (2, 32, 1)),
    ),
    ATARI: (
        n_params((32, 4, 64), (64, 32, 16), (64, 64, 9), (512, 64 * 49, 1), (4, 512, 1), (1, 512, 1)),
        n_params((16, 4, 64), (32, 16, 16), (32, 32, 9), (256, 32 * 49, 1), (4, 256, 1), (1, 256, 1)),
    ),
}


smoke = smoke_fixture(RUNS)


@pytest.mark.parametrize("script,flags", RUNS, ids=[f"{s[:-3]}{' '.join(f[6:])}" for s, f in RUNS])
def test_smoke_prunes_and_reports_sizes(smoke, script, flags):
    proc, log_dir = smoke[script, flags]
    rows, summary = read_metrics(log_dir), read_summary(log_dir)
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4] and rows[-1]["fps"] > 0
    assert all(r["entropy"] > 0 and r["v_loss"] >= 0 for r in rows)
    assert summary["prune_steps_done"] == int(flags[flags.index("--prune-steps") + 1])
    assert (summary["compile_time"] is not None) == ("--compile" in flags)
    before, after = PARAMS[script]
    assert summary["prune_params_before"] == before
    assert summary["prune_macs_after"] < summary["prune_macs_before"] or "mask" in flags
    if "mask" in flags:  # the same units zeroed, nothing smaller: the masks even add their own bytes
        assert summary["prune_params_after"] == before and summary["prune_macs_after"] == summary["prune_macs_before"]
        assert summary["prune_bytes_after"] > summary["prune_bytes_before"]
    else:
        assert summary["prune_params_after"] == after
        assert summary["prune_bytes_after"] < summary["prune_bytes_before"] / 2
    # removed or zeroed, the same share of the weights goes
    assert summary["prune_sparsity"] == pytest.approx(1 - after / before)
    if "--cudagraphs" in flags:
        assert "--cudagraphs ignored" in proc.stderr
    if script == CLASSIC:  # the annealed lr over the share of the widths left: 1, then 0.75 and 0.5 (steps 2 and 3)
        steps = int(flags[flags.index("--prune-steps") + 1])
        for r in rows:
            left = 1 - 0.5 * min(r["iteration"] - 1, steps) / steps
            assert r["lr"] == pytest.approx((1 - (r["iteration"] - 1) / 4) * 2.5e-4 / left), r["iteration"]
    if script == ATARI:
        assert summary["flags"]["split_envs"] == ("--split-envs" in flags or torch.cuda.is_available())


def test_resume_after_pruning(smoke, tmp_path):
    """The checkpoint holds the pruned shapes; the resumed run replays the pruning history to load it."""
    flags = RUNS[1][1]
    _, first = smoke[CLASSIC, flags]
    ckpt = torch.load(first / "agent.pt", weights_only=True)
    assert ckpt["agent"]["actor.2.weight"].shape == (32, 32)
    run_script(
        CLASSIC,
        "--num-envs",
        "1",
        "--num-steps",
        "64",
        "--total-timesteps",
        "384",
        "--num-threads",
        "1",
        *flags,
        "--resume",
        str(first / "agent.pt"),
        log_dir=tmp_path,
    )
    rows, summary = read_metrics(tmp_path), read_summary(tmp_path)
    assert [r["iteration"] for r in rows] == [5, 6] and summary["prune_params_after"] == PARAMS[CLASSIC][1]


def test_compiled_matches_eager_through_pruning_steps(tmp_path):
    """--compile against the eager run of the same seed, with steps at iterations 2 and 3: after each, the units are
    built and traced again and Adam's moments, cut at the kept neurons, carried over. Random ranking draws from the
    loop's generator, so the same neurons go in both runs: the losses agree up to floating-point noise, which a weight
    or Adam moment lost in the rebuild would exceed by orders of magnitude."""
    flags = (*SMOKE, "--num-threads", "1", *SOON, "--prune-steps", "2", "--prune-importance", "random")
    run_script(CLASSIC, *flags, log_dir=tmp_path / "eager")
    run_script(CLASSIC, *flags, "--compile", log_dir=tmp_path / "compiled")
    keys = ("pg_loss", "v_loss", "entropy", "approx_kl", "clipfrac")
    for e, c in zip(read_metrics(tmp_path / "eager"), read_metrics(tmp_path / "compiled"), strict=True):
        assert {k: c[k] for k in keys} == pytest.approx({k: e[k] for k in keys}, rel=1e-4, abs=1e-4), c["iteration"]
    assert read_summary(tmp_path / "compiled")["prune_params_after"] == PARAMS[CLASSIC][1]


# ---- the surgery, in process --------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["classic", "atari"])
def family(request):
    """(module, Agent factory, example inputs, chains): chains(agent) lists, for each path through the agent, the
    prunable layers in order, the heads that read the last one, and how many input columns one output unit of each
    layer becomes in the layer that reads it (49 across the flatten: 7x7 positions per channel)."""
    if request.param == "classic":
        m = load_script("ppo_pruned_torchcompile")
        return (
            m,
            lambda: m.Agent(4, 2),
            (torch.randn(64, 4), torch.randint(0, 2, (64,))),
            lambda a: [
                ([a.actor[0], a.actor[2]], [a.actor[4]], [1, 1]),
                ([a.critic[0], a.critic[2]], [a.critic[4]], [1, 1]),
            ],
        )
    m = load_script("ppo_atari_envpool_pruned_torchcompile")
    example = (torch.randint(0, 256, (8, 4, 84, 84), dtype=torch.uint8), torch.randint(0, 4, (8,)))
    return (
        m,
        lambda: m.Agent(4),
        example,
        lambda a: [([a.network[0], a.network[2], a.network[4], a.network[7]], [a.actor, a.critic], [1, 1, 49, 1])],
    )


def outputs(agent, example):
    return [t.detach() for t in agent.forward(*example)[-3:]]


def kept_units(old: nn.Module, new: nn.Module, kept_in: torch.Tensor) -> torch.Tensor:
    """Which of `old`'s output units survive in `new`: each row of the pruned weight is found among the original
    rows (restricted to the surviving inputs). Independent of how the pruner chose them."""
    rows = old.weight.detach()[:, kept_in].flatten(1)
    match = (new.weight.detach().flatten(1)[:, None] == rows[None]).all(-1)
    assert (match.sum(1) == 1).all(), "a pruned row is not an original row"
    return match.float().argmax(1)


def group_norms(layer: nn.Module, readers: list) -> torch.Tensor:
    """Magnitude importance written out: per output unit, the squared L2 norm of its weights in, plus that of the
    weights that read it (all the input columns it becomes in each reader)."""
    n = layer.weight.shape[0]
    norm = layer.weight.detach().flatten(1).pow(2).sum(1)
    for r in readers:
        norm = norm + r.weight.detach().pow(2).reshape(r.weight.shape[0], n, -1).sum((0, 2))
    return norm


@pytest.mark.parametrize("importance", ["magnitude", "random"])
def test_pruning_step_equals_zeroing_the_removed_units(family, importance):
    """One structural step (a quarter of each hidden layer: step 1 of 2 towards 0.5): the pruned agent computes
    what the unpruned one computes with the removed units zeroed; Adam's moments follow the kept units."""
    m, make_agent, example, chains = family
    torch.manual_seed(0)
    agent = make_agent()
    with torch.no_grad():  # orthogonal init gives every row the same norm: magnitude would rank float noise
        for p in agent.parameters():
            p.mul_(torch.rand_like(p) + 0.5)
    reference, zeroed = copy.deepcopy(agent), copy.deepcopy(agent)
    args = m.Args(prune_ratio=0.5, prune_steps=2, prune_importance=importance)
    pruner = m.make_pruner(agent, example, args, torch.Generator())
    optimizer = torch.optim.Adam(agent.parameters())
    for p in agent.parameters():  # moments with recognizable values
        optimizer.state[p] = dict(step=torch.tensor(7.0), exp_avg=torch.randn_like(p), exp_avg_sq=torch.rand_like(p))
    old_moments = {name: optimizer.state[p] for name, p in agent.named_parameters()}
    # both scripts cut the optimizer's state in place and point it at the new Parameters
    assert m.prune_step(pruner, optimizer, structural=True) is None
    assert [id(p) for p in optimizer.param_groups[0]["params"]] == [id(p) for p in agent.parameters()]

    names = {layer: name for name, layer in agent.named_modules()}
    for (layers, heads, spread), (ref_layers, ref_heads, _), (zero_layers, _, _) in zip(
        chains(agent), chains(reference), chains(zeroed)
    ):
        kept_in = torch.arange(ref_layers[0].weight.shape[1])
        for i, (layer, old) in enumerate(zip(layers + heads, ref_layers + ref_heads)):
            n = old.weight.shape[0]
            if i < len(layers):
                kept = kept_units(old, layer, kept_in)
                assert len(kept) == int(n * 0.75)
                removed = torch.tensor(sorted(set(range(n)) - set(kept.tolist())))
                if importance == "magnitude":
                    readers = ref_layers[i + 1 : i + 2] or ref_heads
                    assert set(removed.tolist()) == set(group_norms(old, readers).argsort()[: len(removed)].tolist())
                with torch.no_grad():
                    zero_layers[i].weight[removed] = 0.0
                    zero_layers[i].bias[removed] = 0.0
            else:  # a head keeps its outputs
                kept = torch.arange(n)
            for pname in ("weight", "bias"):
                p = getattr(layer, pname)
                state, old_state = optimizer.state[p], old_moments[f"{names[layer]}.{pname}"]
                assert state["step"] == 7.0
                for key in ("exp_avg", "exp_avg_sq"):
                    want = old_state[key][kept][:, kept_in] if pname == "weight" else old_state[key][kept]
                    assert state[key].shape == p.shape and torch.equal(state[key], want)
            if i < len(layers):
                kept_in = (kept[:, None] * spread[i] + torch.arange(spread[i])).flatten()
    assert set(optimizer.state) == set(agent.parameters())
    for got, want in zip(outputs(agent, example), outputs(zeroed, example)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(outputs(agent, example)[2], outputs(reference, example)[2])  # the cut did change it


def test_mask_mode_zeroes_what_structural_removes_and_masks_survive_updates():
    m = load_script("ppo_pruned_torchcompile")
    args = m.Args(prune_ratio=0.5, prune_steps=2, prune_importance="random")
    example = (torch.randn(64, 4), torch.randint(0, 2, (64,)))
    torch.manual_seed(0)
    cut = m.Agent(4, 2)
    masked = copy.deepcopy(cut)
    rng = torch.Generator()
    cut_pruner = m.make_pruner(cut, example, args, rng)
    masked_pruner = m.make_pruner(masked, example, dataclasses.replace(args, prune_mode="mask"), rng)
    m.add_masks(masked)
    lr = torch.tensor(1e-2)
    cut_opt, masked_opt = m.make_optimizer(cut, lr, False), m.make_optimizer(masked, lr, False)
    for pruner, opt, structural in ((cut_pruner, cut_opt, True), (masked_pruner, masked_opt, False)):
        rng.manual_seed(1)  # the same random ranking for both
        m.prune_step(pruner, opt, structural)
    for got, want in zip(outputs(masked, example), outputs(cut, example)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)

    m.prune_step(masked_pruner, masked_opt, False)  # step 2: the masked units rank last, so half is masked now
    hidden = [masked.actor[0], masked.actor[2], masked.critic[0], masked.critic[2]]
    assert [int((layer.weight.abs().sum(1) == 0).sum()) for layer in hidden] == [32] * 4
    assert [int((layer.parametrizations.bias[0].mask == 0).sum()) for layer in hidden] == [32] * 4  # biases start at 0

    before = [layer.weight.detach().clone() for layer in hidden]
    g = torch.Generator().manual_seed(2)
    batch = [
        torch.randn(256, 4, generator=g),
        torch.randint(0, 2, (256,), generator=g),
        -torch.rand(256, generator=g),
        torch.randn(256, generator=g),
        torch.randn(256, generator=g),
        torch.randn(256, generator=g),
    ]
    for _ in range(3):
        m.update(masked, masked_opt, args, *batch, torch.arange(256))
    for layer, old in zip(hidden, before):
        mask = layer.parametrizations.weight[0].mask
        assert torch.all(layer.weight[mask == 0] == 0)  # the functional update trains through the masks
        assert not torch.equal(layer.weight[mask == 1], old[mask == 1])


def test_learns_cartpole_while_pruning_half(tmp_path):
    """What doc/learning.md judges: the return at the end of the budget. CartPole-v1 with half of every hidden layer
    pruned away on the default schedule, `--compile` as LEARN=1 runs it, seed 1, the default 500k steps: the mean
    return of the last 20 episodes when the run ends is at least FINAL, where the baseline's seeds end on that page (a
    run that solved CartPole and lost it again fails)."""
    run_script(CLASSIC, "--compile", "--seed", "1", "--num-threads", "1", log_dir=tmp_path, timeout=900)
    summary = read_summary(tmp_path)
    assert summary["global_step"] == 499712 and summary["prune_steps_done"] == 1
    assert summary["prune_params_after"] == PARAMS[CLASSIC][1]
    assert summary["final_return"] >= FINAL, f"final mean return {summary['final_return']}"


BAD_INPUT = [
    (CLASSIC, ["--prune-ratio", "1.5"], ["--prune-ratio", "[0, 1)"]),
    (CLASSIC, ["--hidden-depth", "0"], ["--hidden-depth"]),
    (ATARI, ["--prune-steps", "0"], ["--prune-steps"]),
]


@pytest.mark.parametrize("script,flags,words", BAD_INPUT, ids=[f"{s[:-3]} {' '.join(f)}" for s, f, _ in BAD_INPUT])
def test_bad_input(script, flags, words, log_dir):
    assert_rejected(script, flags, words, log_dir)
