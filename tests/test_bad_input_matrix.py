"""Every training script refuses every bad input with one line: a matrix generated from each script's `Args`.

For each script in leanrl/ (ppo*, sac*, td3*, dqn*) and each field of its `Args` dataclass, the values that field must
refuse are derived from its type and its meaning (RANGES below, matched on the field's name; a field no rule names
gets the strict default: a positive count, or a finite non-negative number), plus values of the wrong type and empty
ones, plus the pairs of flags that conflict. Each case is parsed and checked in this process, the way the script's
`main` starts (`plumbing.parse_args`, then the script's `check_args`): it must end with SystemExit(2), exactly
one line on stderr that names the flag, no traceback, and no change to an existing --log-dir. A new flag is covered
without editing this file, and a flag whose rule is wrong for it fails here until the table says what it accepts.
One subprocess per script checks that `main` runs these checks before any work.
"""

import dataclasses
import math
import re
import sys
import typing

import pytest
import torch

import plumbing
from conftest import ROOT, assert_user_error, load_script, run_script

SCRIPTS = sorted(p.stem for p in (ROOT / "leanrl").glob("*.py") if re.match(r"(ppo|sac|td3|dqn)", p.stem))

# (name pattern, lower bound, lower bound included, upper bound, upper bound included): the first match wins
INF = math.inf
RANGES = [
    (r"^seed$", 0, True, 2**31 - 1, True),  # envpool's seeds are int32
    (r"^(gamma|gae_lambda|tau)$", 0, False, 1, True),
    (r"ratio$", 0, True, 1, False),
    (r"^(start_e|end_e)$", 0, True, 1, True),
    (r"fraction$", 0, False, 1, True),
    (r"^(measure_burnin|learning_starts)$", 0, True, INF, True),
    (r"(^|_)(lr|learning_rate)$", 0, False, INF, True),
    (r"^(clip_coef|max_grad_norm|target_kl|dist_timeout)$", 0, False, INF, True),
    (r"(coef|noise|noise_clip|alpha)$", 0, True, INF, True),
]


def field_range(name: str, kind: type):
    for pattern, *bounds in RANGES:
        if re.search(pattern, name):
            return bounds
    return (1, True, INF, True) if kind is int else (0, True, INF, True)


def base_type(tp):
    """int, float, str, bool or a Literal's choices, through Optional[...]."""
    if typing.get_origin(tp) is typing.Union:
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    if typing.get_origin(tp) is typing.Literal:
        return typing.get_args(tp)
    return tp


def out_of_range(name: str, kind: type) -> list:
    lo, lo_in, hi, hi_in = field_range(name, kind)
    step = 1 if kind is int else 1e-3
    values = [lo - step if lo_in else lo]
    if hi != INF:
        values.append(hi + step if hi_in else hi)
    if kind is float:
        values += [math.nan, INF]
    return [str(v) for v in values]


def cases(module) -> list:
    """(flag, argv, what) for every bad input of this script's Args."""
    out = []
    for f in dataclasses.fields(module.Args):
        flag, kind = "--" + f.name.replace("_", "-"), base_type(f.type)
        if kind in (int, float):
            out += [(flag, [flag, v], f"{v} out of range") for v in out_of_range(f.name, kind)]
            out += [(flag, [flag, v], f"{v!r}: wrong type") for v in ("x", "") + (("1.5",) if kind is int else ())]
        elif isinstance(kind, tuple):
            out.append((flag, [flag, "nosuch"], "not a choice"))
        elif typing.get_origin(kind) is tuple:  # one value per member (the seeds scripts): the single flag's range
            item = typing.get_args(kind)[0]
            members = module.Args.num_seeds  # as many values as members, so that only the value is wrong
            for v in out_of_range(f.name.removesuffix("s"), item) + ["x"]:
                out.append((flag, [flag, *[v] * members], f"{v} for every member"))
            out.append((flag, ["--num-seeds", "2", flag, "0.5"], "one value for two members"))
        elif f.name == "env_id":
            out.append((flag, [flag, "NoSuchEnv-v9"], "unknown env"))
        elif f.name == "log_dir":
            out.append((flag, [flag, "/proc/leanrl/run"], "a folder that cannot be created"))
        elif f.name == "resume":
            out.append((flag, [flag, "/nonexistent/agent.pt"], "no such file"))
    return out


def conflicts(module) -> list:
    """(flag, argv, what): pairs of flags that are fine alone and wrong together, where the script has both."""
    names = {f.name for f in dataclasses.fields(module.Args)}
    out = []
    if {"num_envs", "num_steps", "num_minibatches"} <= names:
        out.append(
            (
                "--num-minibatches",
                ["--num-envs", "2", "--num-steps", "3", "--num-minibatches", "4"],
                "a minibatch count that does not divide the batch",
            )
        )
        out.append(
            (
                "--num-minibatches",
                ["--num-envs", "2", "--num-steps", "3", "--num-minibatches", "6"],
                "one-row minibatches: their advantage std is NaN under --norm-adv",
            )
        )
        out.append(
            (
                "--total-timesteps",
                ["--num-envs", "4", "--num-steps", "8", "--num-minibatches", "4", "--total-timesteps", "16"],
                "less than one batch",
            )
        )
    if {"batch_size", "buffer_size"} <= names:
        out.append(("--batch-size", ["--buffer-size", "100", "--batch-size", "200"], "a batch larger than the buffer"))
    if {"learning_starts", "total_timesteps"} <= names:
        out.append(
            ("--learning-starts", ["--total-timesteps", "1000", "--learning-starts", "1000"], "no step left to learn")
        )
    if {"start_e", "end_e"} <= names:
        out.append(("--end-e", ["--start-e", "0.1", "--end-e", "0.5"], "epsilon that grows"))
    return out


@pytest.fixture(scope="module", params=SCRIPTS)
def script(request):
    return request.param, load_script(request.param)


def check(module, argv, log_dir, capsys, monkeypatch):
    """Parse `argv` and check it as the script's main does first; returns (exit code, stderr lines)."""
    monkeypatch.setattr(sys, "argv", [module.__name__, "--log-dir", str(log_dir), *argv])
    capsys.readouterr()
    try:
        module.check_args(plumbing.parse_args(module.Args))
        code = 0
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    return code, err


def test_defaults_pass_the_checks(script, tmp_path, capsys, monkeypatch):
    """The control: the checks do not refuse a good command line (else every case below would pass vacuously), on a
    machine the defaults fit on (Atari DQN's default buffer alone is 6.6 GiB)."""
    name, module = script
    monkeypatch.setattr(plumbing.memory, "available_memory", lambda: 64 * 2**30)
    code, err = check(module, [], tmp_path / "run", capsys, monkeypatch)
    assert code == 0, err


def test_every_bad_input_is_refused_with_one_line(script, tmp_path, capsys, monkeypatch):
    """The whole matrix of one script; the failure lists every hole at once, not the first."""
    name, module = script
    log_dir = tmp_path / "run"
    log_dir.mkdir()
    (log_dir / "metrics.jsonl").write_text("kept\n")
    holes = []
    for flag, argv, what in cases(module) + conflicts(module):
        code, err = check(module, argv, log_dir, capsys, monkeypatch)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        if code != 2 or len(lines) != 1 or "Traceback" in err or flag not in lines[0]:
            holes.append(f"{' '.join(argv)} ({what}): exit {code}, stderr {err.strip()[-300:]!r}")
    assert sorted(p.name for p in log_dir.iterdir()) == ["metrics.jsonl"]
    assert (log_dir / "metrics.jsonl").read_text() == "kept\n"
    assert not holes, (
        f"{name}: {len(holes)} of {len(cases(module) + conflicts(module))} bad inputs not refused:\n" + "\n".join(holes)
    )


def test_resume_of_another_script_names_it(script, tmp_path, capsys, monkeypatch):
    """A checkpoint that another script wrote is refused with one line naming that script."""
    name, module = script
    other = next(s for s in SCRIPTS if s != name)
    ckpt = tmp_path / "agent.pt"
    torch.save(dict(script=other, args={}), ckpt)
    code, err = check(module, ["--resume", str(ckpt)], tmp_path / "run", capsys, monkeypatch)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and "--resume" in lines[0] and f"{other}.py" in lines[0], err


@pytest.mark.parametrize("name", SCRIPTS)
def test_main_checks_before_any_work(name, tmp_path):
    """The same checks run first when the script is started as a user starts it: one bad flag, one line, exit 2,
    nothing written."""
    log_dir = tmp_path / "run"
    assert_user_error(
        run_script(f"{name}.py", "--total-timesteps", "-1", log_dir=log_dir, check=False, timeout=120),
        "--total-timesteps",
    )
    assert not log_dir.exists() or not any(log_dir.iterdir())


def test_the_env_id_is_checked_before_the_budget_flags(script, tmp_path, capsys, monkeypatch):
    """A refused env id is said first: a user who also got a budget flag wrong (a negative --total-timesteps) does not
    fix it only to learn then that the env is refused (issue 59)."""
    name, module = script
    code, err = check(
        module, ["--env-id", "NoSuchEnv-v9", "--total-timesteps", "-1"], tmp_path / "run", capsys, monkeypatch
    )
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and "--env-id NoSuchEnv-v9" in lines[0], err


@pytest.mark.parametrize("name", [s for s in SCRIPTS if "continuous_action" in s])
@pytest.mark.parametrize("env_id", ["Pendulum-v1", "MountainCarContinuous-v0", "HalfCheetah-v4"])
def test_a_continuous_script_takes_every_box_action_env(name, env_id, tmp_path, capsys, monkeypatch):
    """CleanRL's continuous scripts take any Box-action env; envpool 1.2.5 ships Pendulum-v1 and
    MountainCarContinuous-v0 beside MuJoCo's (issue 59: they were refused for having continuous actions)."""
    code, err = check(load_script(name), ["--env-id", env_id], tmp_path / "run", capsys, monkeypatch)
    assert code == 0, err


def test_an_inductor_cache_dir_that_is_a_file_is_refused_before_any_work(script, tmp_path, capsys, monkeypatch):
    """TORCHINDUCTOR_CACHE_DIR naming a file: --compile would die in its first compile with a traceback, after the log
    dir was made (issue 59); it is one line before any work, naming the variable."""
    name, module = script
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "file"))
    code, err = check(module, ["--compile"], tmp_path / "run", capsys, monkeypatch)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and "TORCHINDUCTOR_CACHE_DIR" in lines[0], err
    assert not (tmp_path / "run").exists()
