import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ["--num-envs", "1", "--num-steps", "64", "--total-timesteps", "256"]


def run_script(script: str, *flags: str, log_dir: Path, timeout: float = 600, check: bool = True):
    """Run leanrl/<script> as a user would; returns the CompletedProcess."""
    cmd = [sys.executable, str(ROOT / "leanrl" / script), "--log-dir", str(log_dir), *flags]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stderr[-4000:]}")
    return proc


def read_metrics(log_dir: Path) -> list:
    with open(log_dir / "metrics.jsonl") as f:
        return [json.loads(line) for line in f]


def read_summary(log_dir: Path) -> dict:
    with open(log_dir / "summary.json") as f:
        return json.load(f)


def load_script(name: str):
    """Import leanrl/<name>.py as a module, to test its units directly."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "leanrl" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # torch.compile looks the module up by name
    spec.loader.exec_module(module)
    return module


def assert_user_error(proc, *words: str):
    """A user mistake: exit 2, exactly one line on stderr that names the problem, no traceback."""
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for w in words:
        assert w.lower() in lines[0].lower(), lines[0]


def assert_rejected(script: str, flags, words, log_dir: Path):
    """Running `script` with `flags` is a user mistake: it stops before any work, with the one-line error."""
    proc = run_script(script, *flags, log_dir=log_dir, check=False, timeout=300)
    assert_user_error(proc, *words)
    assert not (log_dir / "metrics.jsonl").exists()


def smoke_runs(runs, tmp_path_factory) -> dict:
    """Each (script, flags) of `runs` once, with the smoke flags on one thread: {(script, flags): (proc, log_dir)}.
    Module-scoped fixtures share these runs between tests: a compiled run costs tens of seconds."""
    out = {}
    for script, flags in runs:
        log_dir = tmp_path_factory.mktemp("smoke") / "run"
        out[script, flags] = run_script(script, *SMOKE, "--num-threads", "1", *flags, log_dir=log_dir), log_dir
    return out


@pytest.fixture
def log_dir(tmp_path):
    return tmp_path / "run"
