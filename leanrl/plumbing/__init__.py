"""The run plumbing every training script imports (`import plumbing`); no part of any algorithm or speed trick
lives here. A script copied out of leanrl needs none of it: its algorithm and its tricks are all in the script.

One module per concern, in the order a run meets them:

- `flags.py`: the command line: parsed, every flag checked before any work, a mistake refused in one line (exit 2).
- `envs.py`: which script takes an env id; an env's sizes and seeds; what moves in a gymnasium env.
- `memory.py`: a run that cannot fit in memory refused up front.
- `logdir.py`: the log dir, claimed for the run's life; `--track`'s wandb; files written whole; what summary.json
  records of the machine.
- `episodes.py`: the returns (and Atari's game lengths) of finished episodes.
- `checkpoint.py`: what agent.pt holds (its docstring), and how a run is saved into it and resumed from it.
- `members.py`: the seeds scripts' members: a diverged member reported and left out, its last finite state kept.
- `life.py`: `check_run`, the flags every script shares, then `Run`: metrics rows, the progress bar, fps, signals,
  divergence, the checkpoint and summary.json.
"""

from .checkpoint import (
    CHECKPOINT_FORMAT,
    CUDA_RNG_STATE_BYTES,
    device_generator,
    env_saved,
    load_checkpoint,
    load_optimizer,
    restore_rngs,
    resume,
    save_checkpoint,
    state_of,
)
from .envs import check_env_id, env_family, envpool_seed, spaces
from .episodes import AtariEpisodes, Episodes, MemberAtariEpisodes, MemberEpisodes
from .flags import (
    Unbroken,
    check_minibatches,
    fail,
    non_negative_finite,
    one_per_member,
    parse_args,
    pick_device,
    positive,
    positive_finite,
    probability,
    require,
    script_name,
    unit_interval,
)
from .life import Run, StopFlag, check_run
from .logdir import (
    check_compile_cache,
    check_log_dir,
    cores,
    cpu_model,
    machine_info,
    new_folder,
    reachable,
    write_atomically,
)
from .memory import ENV_BYTES, check_memory
