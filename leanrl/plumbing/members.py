"""The seeds scripts' members (N agents stacked in one run): a member that diverges is reported and left out, the
others train on, and the checkpoint keeps its last finite state.

- `Members`, `Run`'s base: a seeds row's members checked (`check_members`), the top-level means over the members
  still training (`live_mean`), the checkpoint's per-member state (`finite_members`).
- `check_diverged`: on `--resume`, a member the checkpoint holds no finite state of is refused.
"""

from typing import Optional

import numpy as np
import torch

from .flags import fail
from .logdir import non_finite


def check_diverged(args, ckpt: dict) -> Optional[str]:
    """The members of a seeds run's checkpoint that diverged (`Run.finite_members`). A member the file holds no finite
    state of is refused: it would resume as NaN. A member whose last finite state the file kept goes on from it, said
    in the line returned (None if no member diverged)."""
    records = ckpt.get("diverged", [])
    lost = [r for r in records if r["kept"] is None]
    if lost:
        who = ", ".join(f"seed {r['seed']} (at step {r['global_step']:,})" for r in lost)
        fail(
            f"--resume {args.resume}: member {who} diverged before any checkpoint held a finite state of it, so its "
            "weights here are not finite; start a new run, with a lower learning rate for it"
        )
    if not records:
        return None
    who = "; ".join(
        f"seed {r['seed']} diverged at step {r['global_step']:,}, goes on from step {r['kept']:,}" for r in records
    )
    return (
        f"--resume: member {who}: the checkpoint kept its last finite weights and optimizer state (the other "
        f"members' are of step {ckpt['global_step']:,})"
    )


class Members:
    """The seeds scripts' side of `Run`, its base: the members that diverged (`members_diverged`, their `seeds`). It
    reads and writes Run's `diverged` record and stops the run through `Run.diverge` once no member is left."""

    def __init__(self):
        self.members_diverged = {}  # member index -> the step and the losses that were not finite
        self.seeds = []  # each member's seed, as its rows give it

    def check_members(self, global_step: int, members: list):
        """A seeds run's row: a member whose numbers are not finite for the first time is recorded (in `diverged` too)
        and said in one line, and the others train on; once no member is left training, the run stops as diverged. A
        member's NaN reaches no other: each has its own parameters, Adam moments, generator, envs, advantage
        normalization and gradient clip, and the top-level fields leave it out (`live_mean`)."""
        self.seeds = [m.get("seed", k) for k, m in enumerate(members)]
        fresh = {k: non_finite(m) for k, m in enumerate(members) if k not in self.members_diverged}
        fresh = {k: broken for k, broken in fresh.items() if broken}
        if not fresh:
            return
        record = self.diverged or dict(global_step=global_step, losses=[])
        record.setdefault("members", [])
        for k, broken in fresh.items():
            self.members_diverged[k] = dict(global_step=global_step, losses=list(broken))
            record["losses"] += [f"members[{k}].{name}" for name in broken]
            record["members"].append(self.seeds[k])
        self.diverged = record
        if len(self.members_diverged) == len(members):
            said = ", ".join(f"members[{k}].{n} {v}" for k, broken in fresh.items() for n, v in broken.items())
            self.diverge(global_step, record["losses"], f"at step {global_step:,}", said)
            return
        saved = ""
        if getattr(self.args, "save_model", False):
            saved = (
                ", and agent.pt will keep this member's state from --resume's checkpoint"
                if getattr(self.args, "resume", None)
                else "; agent.pt will hold no finite state of this member (no earlier checkpoint): --resume refuses it"
            )
        for k, broken in fresh.items():
            said = ", ".join(f"{name} {value}" for name, value in broken.items())
            self.say(
                f"error: training diverged for member seed {self.seeds[k]} at step {global_step:,}: {said} not finite; "
                f"the other members train on{saved}"
            )

    def live_mean(self, values: list) -> Optional[float]:
        """The mean of a seeds run's per-member `values` over the members still training, None values left out (None
        if none is left)."""
        kept = [v for k, v in enumerate(values) if k not in self.members_diverged and v is not None]
        return float(np.mean(kept)) if kept else None

    def finite_members(self, earlier: Optional[dict], **state) -> dict:
        """A seeds run's per-member state for its checkpoint (`state`: the stacked parameters, the optimizer's state
        dict, a normalizer's; every tensor of one or more dimensions holds the members along its first), with
        `diverged`, the record `check_diverged` reads on resume. A member that diverged has its slices taken from
        `earlier`, the checkpoint this run resumed from (the only one its log dir can hold): the file keeps the
        member's last finite state, never NaNs over it; its envs, generator, step and Adam's step count (a scalar, the
        members') are the run's. With no earlier checkpoint there is no finite state to keep: its slices are saved as
        they are, recorded `kept` None, and --resume refuses the file."""
        before = {r["seed"]: r["kept"] for r in earlier.get("diverged", [])} if earlier else {}
        records = []
        for k, record in self.members_diverged.items():
            seed = self.seeds[k]
            kept = before.get(seed, earlier["global_step"]) if earlier else None
            records.append(dict(seed=seed, **record, kept=kept))
        if earlier is None or not records:
            return dict(state, diverged=records)

        def splice(value, old):
            if isinstance(value, torch.Tensor) and value.dim():
                value = value.clone()
                for k in self.members_diverged:
                    value[k] = old[k]
                return value
            if isinstance(value, dict):
                return {key: splice(item, old[key]) for key, item in value.items()}
            if isinstance(value, (list, tuple)):
                return type(value)(splice(item, o) for item, o in zip(value, old))
            return value

        return dict(splice(state, {name: earlier[name] for name in state}), diverged=records)
