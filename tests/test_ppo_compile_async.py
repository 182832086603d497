"""The async-compile variants: ppo_compile_async_torchcompile.py and ppo_atari_envpool_compile_async_torchcompile.py.

`--compile --compile-async` trains eagerly while a subprocess fills Inductor's cache and a background thread compiles
from it, then swaps the compiled units in. Each compiled run here costs tens of seconds to minutes on 2 cores, so
only the runs the assertions need are made.
"""

from pathlib import Path

import pytest

from conftest import PPO_ROW_FIELDS, SMOKE, assert_rejected, read_metrics, read_summary, run_script

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
