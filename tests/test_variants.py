"""Variants are their base plus one trick: every flag of the base, with its default, and a diff that shows the trick.

A variant script (quantized, pruned, ddp, compile_async) is rebuilt on its base whenever the base changes; these
checks fail when a base gains a flag its variants lack, or when a variant drifts from its base's code."""

import dataclasses
import difflib

import pytest

from conftest import ROOT, load_script

TRICKS = ["quantized", "pruned", "ddp", "compile_async", "teacher_student", "seeds"]
CLASSIC = "ppo_torchcompile"
ATARI = "ppo_atari_envpool_torchcompile"
CONTINUOUS = "ppo_continuous_action_torchcompile"
PAIRS = [
    (CLASSIC, "ppo_quantized_torchcompile"),
    (CLASSIC, "ppo_pruned_torchcompile"),
    (CLASSIC, "ppo_ddp_torchcompile"),
    (CLASSIC, "ppo_compile_async_torchcompile"),
    (CLASSIC, "ppo_teacher_student_torchcompile"),
    (CLASSIC, "ppo_seeds_torchcompile"),
    (CONTINUOUS, "ppo_continuous_action_seeds_torchcompile"),
    (ATARI, "ppo_atari_envpool_quantized_torchcompile"),
    (ATARI, "ppo_atari_envpool_pruned_torchcompile"),
    (ATARI, "ppo_atari_envpool_ddp_torchcompile"),
    (ATARI, "ppo_atari_envpool_compile_async_torchcompile"),
    (ATARI, "ppo_atari_envpool_seeds_torchcompile"),
]
# lines of the base a variant's diff may remove: the trick replaces a few; DDP rewires the loop for its ranks; seeds
# rewrites every unit that held one agent's parameters (acting, rollout, update, the optimizer) for the stacked ones,
# Adam's step for one learning rate per member, on HalfCheetah the normalizer's statistics for one set per member, and
# the log row's top-level fields and the checkpoint's per-member state for a member that diverges (issue 51)
MAX_REMOVED = {"ddp": 60, "seeds": 186, "quantized": 41}
# base flags a trick deliberately replaces, with the reason: (variant, flag) -> why
REPLACED = {
    ("ppo_atari_envpool_ddp_torchcompile", "num_threads"): "each rank takes its share of the cores, not all of them",
    ("ppo_quantized_torchcompile", "numpy_act"): "the int8 copy acts; the flag sets the fp32 step it is timed against",
}


def defaults(script: str) -> dict:
    module = load_script(script)
    out = {}
    for field in dataclasses.fields(module.Args):
        if field.default is not dataclasses.MISSING:
            out[field.name] = field.default
        else:
            out[field.name] = field.default_factory()
    return out


@pytest.mark.parametrize("base,variant", PAIRS, ids=[v for _, v in PAIRS])
def test_a_variant_takes_every_flag_of_its_base_with_its_default(base, variant):
    base_flags = defaults(base)
    variant_flags = defaults(variant)
    missing = [name for name in base_flags if name not in variant_flags and (variant, name) not in REPLACED]
    assert not missing, f"{variant} lacks its base's flags {missing}"
    changed = {
        name: (base_flags[name], variant_flags[name])
        for name in base_flags
        if name in variant_flags and name != "exp_name" and base_flags[name] != variant_flags[name]
    }
    changed = {name: pair for name, pair in changed.items() if (variant, name) not in REPLACED}
    assert not changed, f"{variant} changes its base's defaults (base, variant): {changed}"


@pytest.mark.parametrize("base,variant", PAIRS, ids=[v for _, v in PAIRS])
def test_a_variants_diff_against_its_base_shows_the_trick(base, variant):
    base_lines = (ROOT / "leanrl" / f"{base}.py").read_text().splitlines()
    variant_lines = (ROOT / "leanrl" / f"{variant}.py").read_text().splitlines()
    diff = list(difflib.unified_diff(base_lines, variant_lines, lineterm="", n=0))
    removed = [line for line in diff if line.startswith("-") and not line.startswith("---")]
    trick = next(t for t in TRICKS if f"_{t}_" in variant)
    limit = MAX_REMOVED.get(trick, 40)
    assert len(removed) <= limit, f"{variant} removes {len(removed)} lines of {base} (at most {limit}):\n" + "\n".join(
        removed
    )


def test_every_variant_script_is_checked():
    variants = sorted(p.stem for p in (ROOT / "leanrl").glob("*.py") if any(f"_{t}_" in p.stem for t in TRICKS))
    assert variants == sorted(v for _, v in PAIRS)
