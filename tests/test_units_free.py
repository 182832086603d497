"""A trick copied without the plumbing (issue 50): in every torchcompile and seeds script, read from its syntax tree,
no unit (a function or class of the script other than `main`, `Args`, the flag checks `check_*` and the env setup
`make_env*`, which a CleanRL script has of its own) names the plumbing module, no plumbing object
(`plumbing.Episodes(...)`, `plumbing.Run(...)`, ...) is handed to a unit, and the compile block (`if args.compile:`,
`if args.cudagraphs:`) names nothing from the plumbing either. A user pastes the units and the block into a
CleanRL-style script that has no plumbing module."""

import ast
import glob
from pathlib import Path

import pytest

from conftest import ROOT

SCRIPTS = sorted(Path(p).name for p in glob.glob(str(ROOT / "leanrl" / "*_torchcompile.py")))
OUTSIDE = {"main", "Args"}  # the loop and the flags, with the flag checks and the env setup: the plumbing's to serve


def outside(name: str) -> bool:
    return name in OUTSIDE or name.startswith(("check_", "make_env"))


def names_plumbing(node) -> list:
    return sorted(
        {
            f"plumbing.{n.attr}"
            for n in ast.walk(node)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "plumbing"
        }
    )


def plumbing_objects(main: ast.FunctionDef) -> set:
    """The names `main` binds to an object the plumbing builds (a class of it called: `plumbing.Episodes(...)`)."""
    bound = set()
    for node in ast.walk(main):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            func = node.value.func
            called = isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
            if called and func.value.id == "plumbing" and func.attr[:1].isupper():
                bound |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return bound


def script_tree(script: str):
    tree = ast.parse((ROOT / "leanrl" / script).read_text())
    defined = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    main = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main")
    return tree, defined, main


@pytest.mark.parametrize("script", SCRIPTS)
def test_no_unit_needs_the_plumbing(script):
    tree, defined, main = script_tree(script)
    found = [
        f"{node.name} names {', '.join(names_plumbing(node))}"
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not outside(node.name) and names_plumbing(node)
    ]
    objects = plumbing_objects(main)
    for call in ast.walk(main):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in defined:
            if outside(call.func.id):
                continue
            handed = {a.id for a in call.args + [k.value for k in call.keywords] if isinstance(a, ast.Name)}
            found += [f"{call.func.id} is handed {name}, a plumbing object" for name in sorted(handed & objects)]
    for node in ast.walk(main):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("args.compile", "args.cudagraphs"):
            found += [f"the compile block names {name}" for name in names_plumbing(node)]
    assert not found, f"{script}: " + "; ".join(found)
