#!/usr/bin/env bash
# The GPU check in one command, sized for a short GPU slot: at most 5 minutes of wall time on one H100 or H200 with a
# 16-core host (Python 3.12, torch 2.11; what the machine lacks comes from ../shared/gpu/bundle.sh's .gpu/).
#   1. tests/test_gpu.py in SHARDS parallel pytest processes (every torchcompile script and variant under --compile
#      --cudagraphs against its eager path, at a smoke budget; the variants' runs are these): at most TESTS_S seconds.
#   2. The GPU sweep, one seed, time-boxed: each family's eager baseline and its torchcompile script under --compile
#      --cudagraphs, and the PPO families' envs alone, in 5 lanes side by side, each pinned to its own cores (a
#      family's runs and its envs alone share a lane): at most the longest lane's time boxes, 130 s.
#   3. $OUT/gpu_table.md (the figures doc/gpu.md and the README take), $OUT/tests.txt (pytest's verdicts),
#      $OUT/machine.txt, and every run's logs in $OUT/logs.tar.gz.
# Every run is bounded by `timeout -k`: SIGTERM stops a training script after its iteration (its summary keeps the
# steady-state fps and the compile time), SIGKILL follows 10 s later for one stuck in a compile or a capture.
#   bash .gpu/enter.sh bash leanrl/tools/gpu_check.sh    # on the GPU machine, from the project root
#   DRY=1 bash leanrl/tools/gpu_check.sh                 # any machine: the plan and its time, nothing run
# OUT (default runs/gpu), COMMIT (default: git's HEAD, where the checkout has one).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/gpu}
DRY=${DRY:-0}
SHARDS=${SHARDS:-8}
TESTS_S=${TESTS_S:-150}
COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
PY=${PYTHON:-python}

if [ "$DRY" != 1 ] && ! $PY -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
  echo "error: no CUDA device here; DRY=1 bash leanrl/tools/gpu_check.sh prints the plan" >&2
  exit 2
fi

# what the scripts import: a module missing on the GPU machine (the bundle's to bring) ends the check at once
if ! missing=$($PY -c "
import importlib.util
names = ['torch', 'tensordict', 'cloudpickle', 'envpool', 'gymnasium', 'tyro', 'torchao', 'torch_pruning', 'tqdm',
         'numpy', 'matplotlib', 'pytest']
print(' '.join(n for n in names if importlib.util.find_spec(n) is None))") || [ -n "$missing" ]; then
  echo "error: $PY cannot import: ${missing:-its modules}; bash ../shared/gpu/bundle.sh packs what the GPU machine lacks" >&2
  exit 2
fi

# the sweep's lanes: "cores|family config seconds command..." runs, one after another in a lane; lanes side by side.
# Budgets are large: a run is stopped by its time box (the fps counts the iterations after burn-in).
BIG=(--total-timesteps 10000000 --seed 1)
OFF=(--total-timesteps 1000000 --learning-starts 2000 --measure-burnin 1000 --log-every 1000 --seed 1)
LANES=(
  "0-4|atari baseline 35 leanrl/ppo_atari_envpool.py ${BIG[*]}"
  "0-4|atari compile-cudagraphs 70 leanrl/ppo_atari_envpool_torchcompile.py --compile --cudagraphs ${BIG[*]}"
  "0-4|atari env-alone 25 leanrl/tools/bench_env.py --family atari --total-timesteps 40960"
  "5-7|mujoco baseline 35 leanrl/ppo_continuous_action.py ${BIG[*]}"
  "5-7|mujoco compile-cudagraphs 60 leanrl/ppo_continuous_action_torchcompile.py --compile --cudagraphs ${BIG[*]}"
  "5-7|mujoco env-alone 15 leanrl/tools/bench_env.py --family mujoco --total-timesteps 40960"
  "8-10|classic baseline 30 leanrl/ppo.py ${BIG[*]}"
  "8-10|classic compile-cudagraphs 50 leanrl/ppo_torchcompile.py --compile --cudagraphs ${BIG[*]}"
  "8-10|classic env-alone 15 leanrl/tools/bench_env.py --family classic --total-timesteps 409600"
  "11-13|sac baseline 25 leanrl/sac_continuous_action.py ${OFF[*]}"
  "11-13|sac compile-cudagraphs 35 leanrl/sac_continuous_action_torchcompile.py --compile --cudagraphs ${OFF[*]}"
  "11-13|td3 baseline 20 leanrl/td3_continuous_action.py ${OFF[*]}"
  "11-13|td3 compile-cudagraphs 30 leanrl/td3_continuous_action_torchcompile.py --compile --cudagraphs ${OFF[*]}"
  "14-15|dqn baseline 15 leanrl/dqn.py ${OFF[*]}"
  "14-15|dqn compile-cudagraphs 30 leanrl/dqn_torchcompile.py --compile --cudagraphs ${OFF[*]}"
  "14-15|dqn_atari baseline 35 leanrl/dqn_atari_envpool.py ${OFF[*]} --buffer-size 100000"
  "14-15|dqn_atari compile-cudagraphs 50 leanrl/dqn_atari_envpool_torchcompile.py --compile --cudagraphs ${OFF[*]} --buffer-size 100000"
)
LANE_CORES="0-4 5-7 8-10 11-13 14-15"

lane_plan() {  # cores: the runs of that lane, one per line
  local entry
  for entry in "${LANES[@]}"; do [ "${entry%%|*}" = "$1" ] && echo "${entry#*|}"; done
  return 0
}

lane() {  # cores: run that lane's runs in turn, each pinned to the lane's cores and time-boxed
  local cores=$1 family config seconds cmd pin=()
  if command -v taskset > /dev/null; then pin=(taskset -c "$cores"); fi  # without taskset the lanes share the cores
  while read -r family config seconds cmd; do
    local dir="$OUT/sweep/$family/$config/1"
    if [ "$DRY" = 1 ]; then
      echo "  timeout -k 10 $seconds ${pin[*]} $PY $cmd --log-dir $dir"
      continue
    fi
    mkdir -p "$dir"
    # exit 124 (timed out) or 130 (stopped by the SIGTERM): the run's summary holds what it measured
    timeout -k 10 "$seconds" "${pin[@]}" $PY $cmd --log-dir "$dir" > "$dir.log" 2>&1 || echo "$?" > "$dir.rc"
  done < <(lane_plan "$cores")
}

lane_seconds() {  # cores: the lane's planned seconds (time boxes plus the 10 s of grace each may take)
  lane_plan "$1" | awk '{ s += $3 } END { print s }'
}

mkdir -p "$OUT"
if [ "$DRY" != 1 ]; then rm -rf "$OUT/tests" "$OUT/sweep"; fi  # a second try in the slot: a run refuses another's folder
start=$SECONDS
echo "== GPU check, commit $COMMIT: $SHARDS shards of tests/test_gpu.py, then the sweep" >&2

# 1. tests/test_gpu.py, its test ids dealt round-robin to the shards
mapfile -t IDS < <($PY -m pytest -q --collect-only -p no:cacheprovider tests/test_gpu.py 2>/dev/null | grep "::" || true)
if [ ${#IDS[@]} -eq 0 ]; then
  echo "error: pytest collected no test in tests/test_gpu.py ($PY -m pytest --collect-only tests/test_gpu.py says why)" >&2
  exit 1
fi
echo "1. tests/test_gpu.py: ${#IDS[@]} tests in $SHARDS shards, each under timeout -k 10 $TESTS_S"
for ((s = 0; s < SHARDS; s++)); do
  shard=()
  for ((i = s; i < ${#IDS[@]}; i += SHARDS)); do shard+=("${IDS[$i]}"); done
  [ ${#shard[@]} -gt 0 ] || continue
  if [ "$DRY" = 1 ]; then
    echo "  shard $s: ${shard[*]}"
    continue
  fi
  mkdir -p "$OUT/tests/$s"
  printf '%s\n' "${shard[@]}" > "$OUT/tests/$s/ids.txt"
  timeout -k 10 "$TESTS_S" $PY -m pytest -q -rA -p no:cacheprovider --basetemp "$OUT/tests/$s/tmp" "${shard[@]}" \
    > "$OUT/tests/$s/pytest.txt" 2>&1 &
done
wait

# 2. the sweep: the lanes side by side, each bounded as a whole too
echo "2. the sweep, one seed, 5 lanes side by side:"
for cores in $LANE_CORES; do
  echo " lane $cores: $(lane_seconds "$cores") s planned"
  if [ "$DRY" = 1 ]; then lane "$cores"; else lane "$cores" & fi
done
wait
if [ "$DRY" != 1 ] && [ $((SECONDS - start)) -gt 0 ]; then
  echo "== tests and sweep took $((SECONDS - start)) s" >&2
fi

# 3. the tables and the logs
report=($PY leanrl/tools/gpu_report.py "$OUT" --commit "$COMMIT")
echo "3. ${report[*]}; tar of every run's summary.json, metrics.jsonl and log into $OUT/logs.tar.gz"
longest=0
for cores in $LANE_CORES; do
  t=$(lane_seconds "$cores")
  [ "$t" -gt "$longest" ] && longest=$t
done
echo "planned wall time: at most $((TESTS_S + 10 + longest + 10)) s (tests ${TESTS_S} s, the longest lane ${longest} s, report 10 s)"
if [ "$DRY" = 1 ]; then exit 0; fi
"${report[@]}"
find "$OUT/sweep" "$OUT/tests" \( -name summary.json -o -name metrics.jsonl -o -name '*.log' -o -name '*.rc' \
  -o -name pytest.txt -o -name ids.txt \) -print0 | tar czf "$OUT/logs.tar.gz" --null -T -
echo "== GPU check done in $((SECONDS - start)) s: $OUT/gpu_table.md" >&2
