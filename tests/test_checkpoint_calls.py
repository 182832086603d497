"""Checkpointing out of the algorithm's way (issue 50, item 4): read from each training script's syntax tree, `main`
restores a checkpoint with one call (`plumbing.resume`) and writes one with one call (`run.save`), and reads nothing
else of the checkpoint but the loop's counters. The parts' states (a module's state_dict, an optimizer's, the
generators', the envs', the episodes', a buffer's) are the plumbing's to take and put back, by type; that a resumed
run goes on as the uninterrupted one does is tests/test_resume.py's to show."""

import ast

import pytest

from conftest import ROOT

SCRIPTS = sorted(p.name for p in (ROOT / "leanrl").glob("*.py") if p.name != "plumbing.py")
# what `main` may read of the checkpoint itself: the loop's counters, a DDP rank's own parts, the pruning trick's record
COUNTERS = {"global_step", "iteration", "ranks", "pruning"}
# the plumbing's per-part helpers, which `resume` and `Run.save` call
PER_PART = {"load_optimizer", "restore_rngs", "set_vector_env_state", "set_env_state", "vector_env_state", "env_state"}


def calls(main: ast.FunctionDef, owner: str, name: str) -> list:
    return [
        node
        for node in ast.walk(main)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == name
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == owner
    ]


@pytest.mark.parametrize("script", SCRIPTS)
def test_one_resume_call_and_one_save_call(script):
    tree = ast.parse((ROOT / "leanrl" / script).read_text())
    main = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main")
    found = []
    if len(calls(main, "plumbing", "resume")) != 1:
        found.append(f"{len(calls(main, 'plumbing', 'resume'))} plumbing.resume calls, not 1")
    if len(calls(main, "run", "save")) != 1:
        found.append(f"{len(calls(main, 'run', 'save'))} run.save calls, not 1")
    found += [f"plumbing.{name}" for name in sorted(PER_PART | {"save_checkpoint"}) if calls(main, "plumbing", name)]
    for node in ast.walk(main):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "ckpt":
            key = node.slice.value if isinstance(node.slice, ast.Constant) else ast.unparse(node.slice)
            if key not in COUNTERS:
                found.append(f'ckpt["{key}"] read in main')
        loads = (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "load_state_dict"
        )
        if loads and "ckpt" in ast.unparse(node):  # a target network copied from its network is the algorithm's
            found.append(f"{ast.unparse(node)} in main")
    assert not found, f"{script}: " + "; ".join(found)


EAGER = [s for s in SCRIPTS if "torchcompile" not in s and not s.startswith("tools")]


@pytest.mark.parametrize("script", EAGER)
def test_an_eager_baseline_saves_and_restores_its_devices_generator(script):
    """The eager baselines sample from torch's default generators, on a GPU the CUDA one: the checkpoint holds it
    (`device_rng=plumbing.device_generator(device)`, beside `torch_rng`), or a resumed GPU run replays the first
    segment's noise (issue 59)."""
    tree = ast.parse((ROOT / "leanrl" / script).read_text())
    main = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main")
    for call in calls(main, "plumbing", "resume") + calls(main, "run", "save"):
        given = {k.arg: ast.unparse(k.value) for k in call.keywords}
        assert given.get("device_rng") == "plumbing.device_generator(device)", (script, ast.unparse(call.func))
