"""A run that cannot fit in memory is refused before any work (`check_memory`), in one line naming the flags to
lower."""

import contextlib
import os
from typing import Optional

import torch

from .flags import fail, flag

# bytes one env of a family holds in its pool (emulator or physics state, frame stack, queues), measured with envpool
# 1.2.5 and gymnasium 1.4 (Breakout-v5, HalfCheetah-v4, CartPole-v1) and rounded down: the estimate is a lower bound,
# so a refused run is one that cannot fit
ENV_BYTES = {"classic": 5_000, "atari": 1_200_000, "mujoco": 700_000}


# the flags that size each store check_memory knows
SIZED_BY = {"rollout": ("num_envs", "num_steps"), "replay_buffer": ("buffer_size",), "envs": ("num_envs",)}


GIB = 2**30


def available_memory() -> Optional[int]:
    """Bytes this process can still take: the kernel's MemAvailable plus free swap, capped by a container's limit
    (cgroup v2); None where /proc/meminfo cannot be read (not Linux): no check there."""
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.split()[1:2]}
    except (OSError, ValueError):
        return None
    free = info.get("MemAvailable", 0) + info.get("SwapFree", 0)
    with contextlib.suppress(OSError, ValueError):
        with open("/sys/fs/cgroup/memory.max") as f, open("/sys/fs/cgroup/memory.current") as g:
            limit = f.read().strip()
            if limit != "max":
                free = min(free, int(limit) - int(g.read()))
    return free


def check_memory(args, family: str, members: int = 1, **stores: int):
    """Refuse, before any work, a run that cannot fit in memory: `stores` are the bytes of its big stores on the
    learner's device (`rollout`, `replay_buffer`: SIZED_BY names their flags), the env pools (`--num-envs` x
    ENV_BYTES[family], for each of a seeds run's `members`) are on the host. Without this a run the machine cannot hold
    is killed by the kernel without a word, or fails hours in, when its replay buffer fills. torchrun's ranks on one
    machine share its memory."""
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    host = dict(envs=members * args.num_envs * ENV_BYTES[family])
    if args.cuda and torch.cuda.is_available():
        index = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
        fits(args, stores, torch.cuda.mem_get_info(index)[0], "free on the GPU", 1)
    else:
        host.update(stores)
    fits(args, host, available_memory(), "available", ranks)


def fits(args, stores: dict, free: Optional[int], where: str, ranks: int):
    """`stores` (name: bytes) x `ranks` within `free` bytes, else one line naming the flags of the big stores."""
    need = sum(stores.values()) * ranks
    if free is None or need <= free:
        return
    big = sorted((store for store in stores if stores[store] * ranks >= need / 20), key=stores.get, reverse=True)
    flags = list(dict.fromkeys(name for store in big for name in SIZED_BY[store]))  # largest store's first, once each
    if getattr(args, "num_seeds", 1) > 1:  # a seeds run: every member has its own envs and rollout
        flags.append("num_seeds")
    parts = ", ".join(f"{store.replace('_', ' ')} {stores[store] / GIB:.1f} GiB" for store in big)
    each = f" per rank, {ranks} ranks on this machine" if ranks > 1 else ""
    sizes = " ".join(f"{flag(name)} {getattr(args, name)}" for name in flags)
    fail(
        f"{sizes}: this run needs about {need / GIB:.1f} GiB ({parts}{each}) and {free / GIB:.1f} GiB is {where}; "
        f"lower {' or '.join(flag(name) for name in flags)}"
    )
