"""The helper every test starts its subprocesses with (conftest.Child): it never blocks on a full pipe, and every wait
ends by its deadline with the child and all its descendants killed."""

import os
import sys
import time

import pytest

from conftest import Child, process_tree, run_command


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_output_larger_than_a_pipe_does_not_block(tmp_path):
    """A child that writes 1 MiB to each stream (a pipe holds 64 KiB) runs to its end, and all of it is kept."""
    code = "import sys; sys.stdout.write('o' * 2**20); sys.stderr.write('e' * 2**20)"
    proc = run_command([sys.executable, "-c", code], tmp_path / "big", timeout=60, check=True)
    assert len(proc.stdout) == len(proc.stderr) == 2**20


def test_deadline_kills_the_whole_tree_and_fails(tmp_path):
    """A hung child, with a grandchild in a session of its own (as torchrun starts its ranks): the wait fails at its
    deadline naming what it waited for, and neither process is left running."""
    code = (
        "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], "
        "start_new_session=True); time.sleep(600)"
    )
    child = Child([sys.executable, "-c", code], tmp_path / "hung")
    tree = child.wait_until(
        lambda: len(process_tree(child.pid)) == 2 and process_tree(child.pid), 60, "the grandchild to start"
    )
    with pytest.raises(pytest.fail.Exception, match="killed after 1s waiting for the metrics"):
        child.wait_until(lambda: False, 1, "the metrics")
    deadline = time.monotonic() + 10  # SIGKILL is delivered asynchronously
    while any(alive(pid) for pid in tree) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in tree), [pid for pid in tree if alive(pid)]


def test_exit_before_the_condition_fails_at_once(tmp_path):
    child = Child([sys.executable, "-c", "import sys; print('bye', file=sys.stderr); sys.exit(3)"], tmp_path / "quits")
    with pytest.raises(pytest.fail.Exception, match="exited 3 before the metrics(.|\n)*bye"):
        child.wait_until(lambda: False, 60, "the metrics")
    assert child.proc.returncode == 3 and not os.path.exists(f"/proc/{child.pid}/stat") or not alive(child.pid)


def test_a_condition_that_holds_as_the_child_exits_is_not_a_failure(tmp_path):
    """The child exits between a check of the condition and the check of its exit (the condition `it has exited`
    itself, as `wait` polls it): the condition holds by then, so the wait returns instead of failing."""
    child = Child([sys.executable, "-c", "pass"], tmp_path / "quick")
    checks = []

    def condition():
        checks.append(child.exited())
        if len(checks) == 1:  # the child runs as this check is made, and has exited by the next line of the wait
            while not child.exited():
                time.sleep(0.01)
            return False
        return child.exited()

    assert child.wait_until(condition, 60, "it to exit")
    assert child.kill() == 0
