"""Atari DQN: dqn_atari_envpool.py (eager baseline) and dqn_atari_envpool_torchcompile.py."""

from unittest import mock

import envpool
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
    # the checkpoint holds the replay buffer: 300 steps wrapped the 200 slots once, the next write goes to slot 100
    buffer = ckpt["buffer"]
    assert (buffer["full"], buffer["pos"]) == (True, 100)
    assert buffer["data"]["frames"].shape == (200, 84, 84) and buffer["next_frame"].shape == (84, 84)
    assert set(buffer["data"]["actions"].tolist()) <= {-1, 0, 1, 2, 3}


def play(fill, steps=400, seed=3):
    """Random play in Breakout through the scripts' own envpool settings; `fill` gets every step's newest frame, action
    and envpool outputs as the scripts' loops give them to ReplayBuffer.add. Returns the obs stack envpool gave for each
    step, in order."""
    base = load_script("dqn_atari_envpool")
    env = base.make_env(base.Args(), seed=seed)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset()
    kept = []
    for _ in range(steps):
        action = int(rng.integers(4))
        next_obs, reward, terminated, truncated, info = env.step(np.array([action]))
        kept.append(obs[0].copy())
        fill(obs[0, -1], action, reward[0], terminated[0], truncated[0], info["lives"][0], info["terminated"][0])
        obs = next_obs
    return kept


def check_stacks(kept, size, sampleable, stack_of):
    """Every sampleable slot's rebuilt obs is the stack envpool gave for the step written there last, and its next obs
    the next step's."""
    for slot in sampleable:
        j = max(k for k in range(len(kept)) if k % size == slot)  # the newest step written to that slot
        assert np.array_equal(stack_of(slot), kept[j]), slot
        assert np.array_equal(stack_of((slot + 1) % size), kept[j + 1]), slot


@pytest.mark.parametrize("size", [64, 4096], ids=["wrapped", "not-full"])
def test_buffer_rebuilds_envpool_stacks(tc, size):
    """Single frames in, the 4-frame stacks envpool gave out, across life losses, game overs and the wrap-around; a
    batch never holds a reset step's slot (action -1)."""
    rb = tc.ReplayBuffer(size, "cpu", stage=4)
    kept = play(rb.add, steps=600)
    rb.flush()
    resets = set(torch.nonzero(rb.fields["actions"] < 0).view(-1).tolist())
    assert resets  # random Breakout loses lives within 600 steps: the stacks crossed episode ends
    inds = rb.sample_indices(50_000, torch.Generator().manual_seed(0))
    sampleable = sorted(set(inds.tolist()))
    if size == 64:  # the newest slot and the 3 oldest are left out
        assert rb.full and set(sampleable) == {(rb.pos + 3 + k) % size for k in range(size - 4)} - resets
    else:
        assert set(sampleable) == set(range(rb.pos - 1)) - resets
    check_stacks(kept, size, sampleable, lambda slot: tc.stacks(rb.fields, torch.tensor([slot]))[0].numpy())


def test_baseline_buffer_rebuilds_envpool_stacks(base):
    rb = base.ReplayBuffer(64, "cpu")
    kept = play(rb.add, steps=300)
    first, count = rb.sampleable()
    check_stacks(
        kept,
        64,
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


def raw_play(steps: int, seed: int = 3, time_limit: int = 90) -> tuple:
    """Random play in Breakout through the scripts' own envpool settings (make_env) with a time limit of `time_limit`
    steps a game, so that games end by truncation as well as by losing all lives. Returns the lives at the reset and
    envpool's raw output of every step, with the obs it was taken from."""
    base = load_script("dqn_atari_envpool")
    make = envpool.make
    with mock.patch.object(envpool, "make", lambda *a, **k: make(*a, max_episode_steps=time_limit, **k)):
        env = base.make_env(base.Args(), seed=seed)
    rng = np.random.default_rng(seed)
    obs, info = env.reset()
    raw = []
    for _ in range(steps):
        action = int(rng.integers(4))
        next_obs, reward, terminated, truncated, out = env.step(np.array([action]))
        raw.append((obs[0].copy(), action, reward[0], terminated[0], truncated[0], out, next_obs[0].copy()))
        obs = next_obs
    return info["lives"][0], raw


def cleanrl_transitions(lives: int, raw: list) -> list:
    """What CleanRL's dqn_atari.py stores for the same play. Its gymnasium vector env resets inside the step that ended
    a life, a game or the time limit, so every transition is a step its agent took: obs, action, clipped reward, done =
    the termination (EpisodicLifeEnv: a life lost or the game over; a truncation bootstraps) and, unless done, the next
    obs (real_next_obs: at a truncation the last obs, not the reset's). Envpool's step after such an end only resets
    (no-ops and FIRE, the action ignored, reward 0): no transition. Each as (obs, action, reward, done, next obs) with
    the stacks as bytes."""
    out = []
    resetting = False
    for obs, action, reward, terminated, truncated, info, next_obs in raw:
        lost = 0 < info["lives"][0] < lives
        lives = info["lives"][0]
        if not resetting:
            done = bool(info["terminated"][0] or lost)
            out.append((obs.tobytes(), action, float(reward), done, None if done else next_obs.tobytes()))
        resetting = bool(terminated or truncated)
    return out


def as_transitions(batch: dict) -> set:
    """A batch (obs, next_obs, actions, rewards, dones) as the set of its distinct transitions, cleanrl_transitions'
    form."""
    rows = zip(batch["obs"], batch["actions"].tolist(), batch["rewards"].tolist(), batch["dones"].tolist())
    return {
        (o.numpy().tobytes(), a, r, bool(d), None if d else n.numpy().tobytes())
        for (o, a, r, d), n in zip(rows, batch["next_obs"])
    }


@pytest.mark.parametrize("size", [64, 1024], ids=["wrapped", "not-full"])
@pytest.mark.parametrize("name", ["dqn_atari_envpool", "dqn_atari_envpool_torchcompile"])
def test_buffer_holds_cleanrl_transitions(name, size):
    """600 steps of random Breakout with 90-step games (life losses, game overs and truncations), fed to the replay
    buffer as the script's loop feeds it, then sampled (50,000 draws, every slot a batch may hold): each sampled
    transition is one CleanRL stores for that play (cleanrl_transitions, built from envpool's raw outputs: no reset
    step, truncations not done and bootstrapping from the last obs), and every transition CleanRL stored is drawn
    (all but the newest, whose next obs may not be written yet; once the ring wrapped, the newest 31 of them)."""
    module = load_script(name)
    lives, raw = raw_play(600)
    expected = cleanrl_transitions(lives, raw)
    assert sum(t[3] for t in expected) >= 4 and sum(r[4] for r in raw) >= 2  # lives lost, games truncated
    rb = module.ReplayBuffer(size, "cpu", stage=4) if "torchcompile" in name else module.ReplayBuffer(size, "cpu")
    for obs, action, reward, terminated, truncated, info, _ in raw:  # as main calls it
        rb.add(obs[-1], action, reward, terminated, truncated, info["lives"][0], info["terminated"][0])
    g = torch.Generator().manual_seed(0)
    if "torchcompile" in name:  # the batch `update` gathers
        rb.flush()
        inds = torch.tensor(sorted(set(rb.sample_indices(50_000, g).tolist())))
        f = rb.fields
        batches = [
            dict(
                obs=module.stacks(f, inds),
                next_obs=module.stacks(f, (inds + 1) % size),
                **{k: f[k][inds] for k in ("actions", "rewards", "dones")},
            )
        ]
    else:
        batches = [rb.sample(1000, g) for _ in range(50)]
    sampled = set().union(*map(as_transitions, batches))
    foreign = sorted(t[1:4] for t in sampled - set(expected))
    assert foreign == [], (
        f"{len(foreign)} of {len(sampled)} sampled are not CleanRL's, (action, reward, done): {foreign}"
    )
    newest = expected[:-1] if size == 1024 else expected[-32:-1]
    missed = len(set(newest) - sampled)
    assert missed == 0, f"{missed} of CleanRL's {len(set(newest))} newest transitions never sampled"


BAD_INPUT = [
    (["--env-id", "CartPole-v1"], ["classic-control", "dqn.py"]),
    (["--env-id", "HalfCheetah-v4"], ["continuous-action", "no DQN script"]),
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


@pytest.mark.parametrize("name", ["dqn_atari_envpool", "dqn_atari_envpool_torchcompile"])
def test_a_resumed_run_frees_the_checkpoint_it_loaded(name, tmp_path, monkeypatch):
    """The checkpoint's replay buffer (a million frames: 7 GB at the defaults) is copied into the run's own buffer on
    resume; the loaded copy must not stay alive for the whole run beside it (issue 59). A weak reference to the
    loaded frames is dead by the time the resumed run starts its loop."""
    import gc
    import weakref

    import plumbing
    from test_dqn import run_in_process

    module = load_script(name)
    first = ["--log-dir", str(tmp_path / "first"), "--save-model"]
    run_in_process(module, monkeypatch, *TINY[2:], "--total-timesteps", "200", *first)
    loaded, alive = [], []
    load_checkpoint, run_init = plumbing.load_checkpoint, plumbing.Run.__init__

    def recording_load(*args, **kwargs):
        ckpt = load_checkpoint(*args, **kwargs)
        loaded.append(weakref.ref(ckpt["buffer"]["data"]["frames"]))
        return ckpt

    def checking_init(self, *args, **kwargs):
        gc.collect()
        alive.append(loaded[0]() is not None)
        run_init(self, *args, **kwargs)

    monkeypatch.setattr(plumbing.life, "load_checkpoint", recording_load)
    monkeypatch.setattr(plumbing.Run, "__init__", checking_init)
    resume = ["--resume", str(tmp_path / "first" / "agent.pt"), "--log-dir", str(tmp_path / "resumed")]
    run_in_process(module, monkeypatch, *TINY[2:], "--total-timesteps", "250", *resume)
    assert alive == [False]
