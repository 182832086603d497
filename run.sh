#!/usr/bin/env bash
# The sweep behind doc/fps.md: every configuration of a family, seeds 1..3, interleaved seed by seed so that
# drift on the machine hits all configurations alike; then the table and plots.
#   bash run.sh            # classic control and Atari
#   bash run.sh classic    # or: atari
# ATARI_STEPS (default 200000) sets the Atari budget; OUT (default runs/bench) where the runs go.
set -euo pipefail
cd "$(dirname "$0")"
OUT=${OUT:-runs/bench}
FAMILY=${1:-all}
CUDA=$(python -c "import torch; print(int(torch.cuda.is_available()))")

run() {  # run NN-config script flags...: seeds 1..3, skipping runs already done
  local name=$1 seed=$2; shift 2
  [ -f "$OUT/$name/$seed/summary.json" ] && return
  rm -rf "$OUT/$name/$seed"
  echo "== $name seed $seed" >&2
  python "$@" --seed "$seed" --log-dir "$OUT/$name/$seed"
}

for seed in 1 2 3; do
  if [ "$FAMILY" != atari ]; then
    run 01-ppo "$seed" leanrl/ppo.py
    run 02-ppo_torchcompile "$seed" leanrl/ppo_torchcompile.py
    run 03-ppo_torchcompile--compile "$seed" leanrl/ppo_torchcompile.py --compile
    if [ "$CUDA" = 1 ]; then
      run 04-ppo_torchcompile--compile--cudagraphs "$seed" leanrl/ppo_torchcompile.py --compile --cudagraphs
    fi
  fi
  if [ "$FAMILY" != classic ]; then
    steps=${ATARI_STEPS:-200000}
    run 11-ppo_atari_envpool "$seed" leanrl/ppo_atari_envpool.py --total-timesteps "$steps"
    run 12-ppo_atari_envpool_torchcompile "$seed" leanrl/ppo_atari_envpool_torchcompile.py --total-timesteps "$steps"
    run 13-ppo_atari_envpool_torchcompile--compile "$seed" leanrl/ppo_atari_envpool_torchcompile.py --compile --total-timesteps "$steps"
    run 14-ppo_atari_envpool_torchcompile--bf16 "$seed" leanrl/ppo_atari_envpool_torchcompile.py --bf16 --total-timesteps "$steps"
    run 15-ppo_atari_envpool_torchcompile--compile--bf16 "$seed" leanrl/ppo_atari_envpool_torchcompile.py --compile --bf16 --total-timesteps "$steps"
    if [ "$CUDA" = 1 ]; then
      run 16-ppo_atari_envpool_torchcompile--compile--cudagraphs "$seed" leanrl/ppo_atari_envpool_torchcompile.py --compile --cudagraphs --total-timesteps "$steps"
    fi
  fi
done
python leanrl/fps_table.py "$OUT" --out doc
