"""Atari DQN: dqn_atari_envpool.py (eager baseline) and dqn_atari_envpool_torchcompile.py."""

import numpy as np
import pytest
import torch

from conftest import assert_rejected, load_script, run_ids, script_fixture, smoke_fixture
from test_dqn import check_dqn_smoke

SCRIPTS = ["dqn_atari_envpool.py", "dqn_atari_envpool_torchcompile.py"]
# a tiny budget and buffer: 300 steps, learning from step 100, fps from step 150; 200 frames of buffer (the default
# million would allocate 7.1 GB)
TINY = [
    "--total-timesteps",
    "300",
    "--learning-starts",
    "100",
    "--measure-burnin",
    "50",
    "--log-every",
    "50",
    "--buffer-size",
    "200",
    "--batch-size",
    "8",
    "--target-network-frequency",
    "50",
    "--num-threads",
    "1",
]
RUNS = [(s, f) for s in SCRIPTS for f in ((), ("--compile",))]


tc = script_fixture("dqn_atari_envpool_torchcompile")
base = script_fixture("dqn_atari_envpool")


smoke = smoke_fixture(RUNS, [*TINY, "--save-model"])  # each script once per flag, shared by the tests below


@pytest.mark.parametrize("script,flags", RUNS, ids=run_ids(RUNS))
def test_smoke(smoke, script, flags):
    ckpt = check_dqn_smoke(smoke[script, flags], script, flags, every=50)[3]
    assert "buffer" not in ckpt  # 1M frames are 7.1 GB: a resumed run refills the buffer instead


def play(fill, steps=400, seed=3):
    """Random play in Breakout through the scripts' own envpool settings; `fill(frame, action, reward, done, game_over)`
    gets every step as the scripts' loops give it. Returns the obs stacks envpool gave for the steps the buffer keeps
    (not the reset steps after a game over), in order, with their done flags."""
    base = load_script("dqn_atari_envpool")
    env = base.make_env(base.Args(), seed=seed)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset()
    kept, resetting = [], False
    for _ in range(steps):
        action = int(rng.integers(4))
        next_obs, reward, terminated, truncated, info = env.step(np.array([action]))
        game_over = bool(info["terminated"][0] or truncated[0])
        done = bool(terminated[0] or truncated[0])
        if not resetting:
            kept.append((obs[0].copy(), done))
        fill(obs[0, -1], action, reward[0], done, game_over)
        resetting = game_over
        obs = next_obs
    return kept


def check_stacks(kept, size, pos, sampleable, stack_of):
    """Every sampleable slot's rebuilt obs is envpool's stack, and its next obs too unless the step ended a life or a
    game."""
    n = len(kept)
    for slot in sampleable:
        j = max(k for k in range(n) if k % size == slot)  # the newest transition written to that slot
        obs, done = kept[j]
        assert np.array_equal(stack_of(slot), obs), slot
        if not done:
            assert np.array_equal(stack_of((slot + 1) % size), kept[j + 1][0]), slot


@pytest.mark.parametrize("size", [64, 4096], ids=["wrapped", "not-full"])
def test_buffer_rebuilds_envpool_stacks(tc, size):
    """Single frames in, the 4-frame stacks envpool gave out, across life losses, game overs and the wrap-around."""
    rb = tc.ReplayBuffer(size, "cpu", stage=4)
    kept = play(rb.add, steps=600)
    rb.flush()
    assert any(d for _, d in kept)  # random Breakout loses lives within 600 steps: the stacks crossed episode ends
    inds = rb.sample_indices(50_000, torch.Generator().manual_seed(0))
    sampleable = sorted(set(inds.tolist()))
    if size == 64:
        assert rb.full and len(sampleable) == size - 4  # the newest slot and the 3 oldest are left out
        assert not {rb.pos, (rb.pos + 1) % size, (rb.pos + 2) % size, (rb.pos - 1) % size} & set(sampleable)
    else:
        assert sampleable == list(range(rb.pos - 1))
    check_stacks(kept, size, rb.pos, sampleable, lambda slot: tc.stacks(rb.fields, torch.tensor([slot]))[0].numpy())


def test_baseline_buffer_rebuilds_envpool_stacks(base):
    rb = base.ReplayBuffer(64, "cpu")
    kept = play(rb.add, steps=300)
    first, count = rb.sampleable()
    check_stacks(
        kept,
        64,
        rb.pos,
        [(first + k) % 64 for k in range(count)],
        lambda slot: rb.stacks(torch.tensor([slot]))[0].numpy(),
    )
    batch = rb.sample(16, generator=torch.Generator().manual_seed(0))
    assert batch["obs"].shape == batch["next_obs"].shape == (16, 4, 84, 84) and batch["obs"].dtype == torch.uint8


def test_update_gathers_the_stacks_dqn_atari_envpool_samples(tc, base):
    """The torchcompile update's batch (stacks rebuilt inside `update`) is the baseline's rb.sample for the same
    slots."""
    rb, brb = tc.ReplayBuffer(64, "cpu", stage=1), base.ReplayBuffer(64, "cpu")
    play(lambda *a: (rb.add(*a), brb.add(*a)), steps=200)
    inds = rb.sample_indices(32, torch.Generator().manual_seed(0))
    assert torch.equal(tc.stacks(rb.fields, inds), brb.stacks(inds))
    assert torch.equal(tc.stacks(rb.fields, (inds + 1) % 64), brb.stacks((inds + 1) % 64))


BAD_INPUT = [
    (["--env-id", "CartPole-v1"], ["classic-control", "dqn.py"]),
    (["--env-id", "HalfCheetah-v4"], ["MuJoCo", "no DQN script"]),
    (["--env-id", "NoSuchGame-v5"], ["unknown env id"]),
    (["--batch-size", "64", "--buffer-size", "32"], ["--batch-size", "--buffer-size"]),
    (["--capture-video"], ["envpool renders no frames"]),
]


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("flags,words", BAD_INPUT[:2] + BAD_INPUT[3:4], ids=lambda x: " ".join(x))
def test_bad_input(script, flags, words, log_dir):
    assert_rejected(script, flags, words, log_dir)


@pytest.mark.parametrize("flags,words", BAD_INPUT[2:3] + BAD_INPUT[4:], ids=lambda x: " ".join(x))
def test_bad_input_torchcompile(flags, words, log_dir):
    assert_rejected("dqn_atari_envpool_torchcompile.py", flags, words, log_dir)


@pytest.mark.parametrize("name", ["dqn_atari_envpool", "dqn_atari_envpool_torchcompile"])
@pytest.mark.parametrize(
    "field,value",
    [
        ("gamma", 0.0),
        ("tau", 2.0),
        ("learning_rate", -1.0),
        ("buffer_size", 0),
        ("end_e", 1.5),
        ("train_frequency", 0),
        ("learning_starts", -1),
    ],
)
def test_check_args_names_the_flag(name, field, value, capsys):
    module = load_script(name)
    with pytest.raises(SystemExit) as e:
        module.check_args(module.Args(**{field: value}))
    assert e.value.code == 2 and f"--{field.replace('_', '-')}" in capsys.readouterr().err
