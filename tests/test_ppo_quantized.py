"""Quantized-inference PPO: ppo_quantized_torchcompile.py (int8 MLP policy) and
ppo_atari_envpool_quantized_torchcompile.py (int8 Nature CNN policy on a CPU, bf16 on CUDA or by flag).

The smoke runs are shared by the assertions through a module-scoped fixture (compiling costs tens of seconds per
process); the unit tests import the scripts and check the quantized copies against their fp32 agents.
"""

import copy
import inspect
import signal

import numpy as np
import pytest
import torch

from conftest import (
    assert_rejected,
    load_script,
    read_metrics,
    read_summary,
    run_ids,
    run_script,
    script_fixture,
    smoke_fixture,
)

CLASSIC, ATARI = "ppo_quantized_torchcompile.py", "ppo_atari_envpool_quantized_torchcompile.py"
# (script, extra flags): each script once compiled and once eager with --cudagraphs (ignored on CPU); a third Atari
# run acts with the bf16 copy for each of two env pools; the classic compiled run also writes a checkpoint
RUNS = [
    (CLASSIC, ("--compile", "--quant-async", "--save-model")),
    (CLASSIC, ("--cudagraphs", "--quant-every", "2")),
    (ATARI, ("--cudagraphs", "--quant-async")),
    (ATARI, ("--compile", "--quant-async")),
    (ATARI, ("--quant-method", "bf16", "--quant-every", "2", "--split-envs", "--num-envs", "2", "--num-steps", "32")),
]
QUANT_FIELDS = (
    "quant_method",
    "quant_every",
    "quant_async",
    "policy_bytes_fp32",
    "policy_bytes_quant",
    "policy_latency_fp32_us",
    "policy_latency_quant_us",
)


classic = script_fixture("ppo_quantized_torchcompile")
atari = script_fixture("ppo_atari_envpool_quantized_torchcompile")


smoke = smoke_fixture(RUNS)


def rebuilt_at(flags) -> list:
    """The iterations (1-4) whose row carries a t_quant: sync rebuilds are logged where they run; an async rebuild
    is started at one boundary and logged at the next, where it is swapped in (the first copy is always built in
    line)."""
    every = int(flags[flags.index("--quant-every") + 1]) if "--quant-every" in flags else 1
    due = [i for i in range(1, 5) if (i - 1) % every == 0]
    return [1] + [i + 1 for i in due[1:] if i < 4] if "--quant-async" in flags else due


@pytest.mark.parametrize("script,flags", RUNS, ids=run_ids(RUNS))
def test_smoke(smoke, script, flags):
    proc, log_dir = smoke[script, flags]
    rows, summary = read_metrics(log_dir), read_summary(log_dir)
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4] and rows[-1]["global_step"] == 256
    for r in rows:
        assert all(np.isfinite(r[k]) for k in ("pg_loss", "v_loss", "entropy", "approx_kl", "t_policy", "t_swap"))
    assert [r["iteration"] for r in rows if r["t_quant"] is not None] == rebuilt_at(flags)
    assert all(r["t_quant"] > 0 for r in rows if r["t_quant"] is not None)
    assert rows[0]["fps"] is None and rows[-1]["fps"] > 0
    assert set(QUANT_FIELDS) <= set(summary), set(QUANT_FIELDS) - set(summary)
    assert summary["quant_async"] == ("--quant-async" in flags)
    if script == ATARI:  # auto picks int8 on this CPU
        assert summary["quant_method"].startswith("bf16" if "bf16" in flags else "int8"), summary["quant_method"]
        assert summary["flags"]["split_envs"] == ("--split-envs" in flags or torch.cuda.is_available())
    assert 0 < summary["policy_bytes_quant"] < summary["policy_bytes_fp32"]
    assert summary["policy_latency_fp32_us"] > 0 and summary["policy_latency_quant_us"] > 0
    assert (summary["compile_time"] is not None) == ("--compile" in flags)
    said = [ln for ln in proc.stderr.splitlines() if "--cudagraphs" in ln]
    assert len(said) == ("--cudagraphs" in flags) and all("ignored" in ln for ln in said), proc.stderr
    if "--save-model" in flags:  # with the loop's own generator, for --resume
        assert "rng" in torch.load(log_dir / "agent.pt", weights_only=True)


def kl(logp, logq):
    return (logp.exp() * (logp - logq)).sum(-1)


@pytest.mark.parametrize("width,depth", [(64, 2), (512, 4)])
def test_int8_policy_close_to_fp32(classic, width, depth):
    """On the same observations the int8 actor's action distribution stays within KL 1e-3 (mean) and 1e-2 (max) of
    the fp32 one. The output layer is rescaled to give logits of a trained policy (spread of several nats), not the
    near-uniform ones of CleanRL's 0.01-std init, where any copy would pass."""
    torch.manual_seed(0)
    agent = classic.Agent(4, 2, width, depth)
    torch.nn.init.orthogonal_(agent.actor[-1].weight, 3.0)
    obs = torch.randn(1024, 4) * torch.tensor([1.0, 1.5, 0.1, 1.5])  # CartPole's ranges
    quantized = classic.quantize_actor(copy.deepcopy(agent.actor), obs[:4])
    with torch.no_grad():
        logp, logq = agent.actor(obs).log_softmax(-1), quantized(obs).log_softmax(-1)
    assert logp.exp().max(-1).values.mean() > 0.7  # the distributions are far from uniform
    d = kl(logp, logq)
    assert d.mean() < 1e-3 and d.max() < 1e-2, (d.mean(), d.max())
    # the behaviour log-probs of a whole rollout in one batch are those of the steps one by one: activations are
    # quantized per row, so a row's numbers do not depend on its batch
    actions = torch.randint(0, 2, (64,))
    batched = classic.behaviour_logprob(quantized, obs[:64], actions)
    single = torch.cat([classic.behaviour_logprob(quantized, obs[i : i + 1], actions[i : i + 1]) for i in range(64)])
    torch.testing.assert_close(batched, single, rtol=0, atol=1e-5)


@pytest.mark.parametrize("method,dtype,value_tol", [("int8", torch.qint8, 0.05), ("bf16", torch.bfloat16, 0.02)])
def test_cnn_policy_close_to_fp32(atari, method, dtype, value_tol):
    """The Atari rollout policy (int8 trunk calibrated on 8 of the frames, or bf16 trunk) against the fp32 agent on
    the same frames: KL below 1e-3 (mean) and 1e-2 (max), values within 5% (int8; observed ~2%) or 2% (bf16) of their
    scale; heads rescaled as in the MLP test."""
    torch.manual_seed(0)
    agent = atari.Agent(4)
    torch.nn.init.orthogonal_(agent.actor.weight, 3.0)
    obs = torch.randint(0, 256, (32, 4, 84, 84), dtype=torch.uint8)
    quantized = atari.quantize_policy(copy.deepcopy(agent), obs[:8], method)
    with torch.no_grad():
        hidden = agent.trunk(obs)
        logp, value = agent.actor(hidden).log_softmax(-1), agent.critic(hidden).squeeze(-1)
        qhidden = quantized.trunk(obs)
        logq, qvalue = quantized.actor(qhidden).log_softmax(-1), quantized.critic(qhidden).squeeze(-1)
    weights = [v for v in quantized.network.state_dict().values() if isinstance(v, torch.Tensor) and v.numel() >= 1024]
    assert weights and all(v.dtype == dtype for v in weights), [v.dtype for v in weights]
    assert logp.exp().max(-1).values.mean() > 0.5
    d = kl(logp, logq)
    assert d.mean() < 1e-3 and d.max() < 1e-2, (d.mean(), d.max())
    assert (qvalue - value).abs().max() < value_tol * value.abs().max()


@pytest.mark.parametrize("background", [False, True], ids=["sync", "async"])
def test_requantizer_acts_with_the_snapshot_it_was_given(classic, background):
    """The copy that acts comes from the weights at the boundary where its rebuild started, not from weights the
    update changed afterwards (async: it is swapped in one boundary later, and sync copies are installed at once)."""
    torch.manual_seed(0)
    agent = classic.Agent(4, 2)
    x = torch.randn(8, 4)
    requant = classic.Requantizer(agent.actor, x[:1], every=1, background=background)
    outputs, boundary_weights = [], []
    for age in range(3):
        boundary_weights.append(copy.deepcopy(agent.actor))
        requant.refresh(age)
        outputs.append(requant.current(x))
        with torch.no_grad():  # the update moves the trained weights in place after the boundary
            agent.actor[0].weight.add_(0.5)
    requant.close()
    references = [classic.quantize_actor(w, x[:1])(x) for w in boundary_weights]
    expected = [references[0], references[0], references[1]] if background else references
    for out, ref in zip(outputs, expected):
        torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("script", [CLASSIC[:-3], ATARI[:-3]])
def test_gae_and_the_value_clip_take_the_fp32_critics_values(script, tmp_path, monkeypatch):
    """One rule for both scripts (doc/quantized.md): the low-precision copy acts and its log-probs are stored, but the
    values GAE subtracts and the value clip is centred on are those of the fp32 critic the update trains. A one-
    iteration run, in process, eager: its first minibatch, caught on its way into `update` (before any Adam step),
    carries values equal to the fp32 agent's own values of its observations (an int8 critic's differ by ~3e-3 here)."""
    m = load_script(script)
    update = m.update
    caught = []

    def spy(*args):
        bound = inspect.signature(update).bind(*args).arguments
        inds = bound.get("inds", slice(None))
        if not caught:
            with torch.no_grad():
                caught.append((bound["values"][inds].clone(), bound["agent"].get_value(bound["obs"][inds])))
        return update(*args)

    monkeypatch.setattr(m, "update", spy)
    monkeypatch.setattr(signal, "signal", lambda *_: None)  # the run's Ctrl-C handlers stay out of pytest's process
    m.main(m.Args(num_envs=1, num_steps=64, total_timesteps=64, num_threads=1, log_dir=str(tmp_path / "run")))
    stored, fp32 = caught[0]
    assert fp32.abs().max() > 0
    torch.testing.assert_close(stored, fp32, rtol=0, atol=1e-5)


def test_learns_cartpole(tmp_path):
    """Acting with the int8 copy, CartPole-v1 is solved (mean of the last 20 episodes >= 475) within 500k steps."""
    log_dir = tmp_path / "learn"
    run_script(CLASSIC, "--compile", "--seed", "1", log_dir=log_dir, timeout=900)
    rows = read_metrics(log_dir)
    assert rows[-1]["global_step"] <= 500000
    best = max(r["episodic_return"] or 0 for r in rows)
    assert best >= 475, f"best mean return {best}"


BAD_INPUT = [
    (CLASSIC, ["--quant-every", "0"], ["--quant-every"]),
    (CLASSIC, ["--hidden-depth", "-1"], ["--hidden-depth"]),
    (ATARI, ["--quant-every", "two"], ["--quant-every"]),
    (ATARI, ["--quant-method", "int4"], ["--quant-method"]),
    (ATARI, ["--env-id", "CartPole-v1"], ["classic-control"]),
]


@pytest.mark.parametrize("script,flags,words", BAD_INPUT, ids=[f"{s[:-3]} {' '.join(f)}" for s, f, _ in BAD_INPUT])
def test_bad_input(script, flags, words, log_dir):
    assert_rejected(script, flags, words, log_dir)
