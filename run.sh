#!/usr/bin/env bash
# The sweep behind doc/fps_table.md: every training script with its flag combinations, seeds interleaved so that
# drift on the machine hits all configurations alike, then the table and the plots (leanrl/tools/report.py).
# CartPole's and HalfCheetah's seeds scripts train 4 agents (seeds s to s + 3) in one program per sweep seed.
#   bash run.sh                  # all families: classic, atari, mujoco, sac, td3, dqn, dqn_atari
#   bash run.sh classic atari    # some of them
# Budgets (steps per run): CLASSIC_STEPS (default 200000), ATARI_STEPS (10240), MUJOCO_STEPS (20480): the whole
# default sweep takes about 31 minutes on 2 idle AMD Zen 5 cores (38 on Zen 4). FULL=1: the published budgets (500k, 10M, 1M).
# Off-policy families (sac, td3, HalfCheetah-v4): OFFPOLICY_STEPS (default 8000) with updates from step 5000 (TD3's
# own default is 25000), fps counted after a further 1000; FULL=1: 1M steps with the scripts' defaults.
# DQN (dqn, dqn_atari): DQN_STEPS (default 30000), DQN_ATARI_STEPS (6000, learning from step 2000, a 100k-frame
# buffer); fps counts the steps after learning starts; FULL=1: 500k and 10M with CleanRL's learning_starts.
# SMOKE=1: every script once with the tiny smoke budget and without --compile (the tests cover the compiled paths),
# table into $OUT/doc: what CI runs. The variants (quantized, pruned, ddp2) otherwise run with --compile.
# teacher (not in the default sweep: its 1024 x 6 networks learn slowly on a CPU): students of 64x2, 128x2 and 256x4
# acting beside a 1024 x 6 teacher (ppo_teacher_student_torchcompile.py), and a 1024 x 6 network acting and learning on
# its own (ppo_quantized_torchcompile.py, int8 acting copy), CartPole-v1 at the classic budget: `bash run.sh teacher`.
# LEARN=1: the learning budgets instead, which show every script learning on a 2-core machine: the baseline and
# --compile of every family, and the variants where the family has them (quantized, pruned with its default schedule,
# ddp2, --compile-async; SAC's and TD3's --bf16 where bf16 is native), seeds "1 2" (SEEDS="1 2 3" for three; CartPole's
# and HalfCheetah's --compile runs as the members of one seeds-script run where the seeds follow each other), into
# runs/learn; then doc/learning.md (final returns against the baseline's seeds, the verdicts, the machine and commit)
# and doc/learning_<family>.png. Steps per run: classic and
# dqn 500k, atari 400k, mujoco 200k, sac and td3 100k (their own learning_starts). dqn_atari needs CleanRL's 10M
# steps (learning from step 80k), out of reach on 2 cores: skipped unless DQN_ATARI_STEPS=10000000 is given.
# CLEANRL=1: CleanRL's own budgets, beside CleanRL's published benchmark table (doc/learning_cleanrl.md): the baseline
# and --compile of classic, dqn and mujoco (CartPole 500k, DQN CartPole 500k, HalfCheetah 1M; SEEDS default
# "1 2 3 4 5", --compile's seeds as one seeds-script run where the family has one), --compile of td3 and sac (1M)
# and the baseline and --compile of atari (Breakout, ATARI_STEPS, default 2000000 of CleanRL's 10M), these three with
# LONG_SEEDS (default "1"). Every run saves its checkpoint (--save-model) when it ends or is stopped (Ctrl-C,
# SIGTERM), and the next CLEANRL=1 run resumes it; a run finished at another budget runs again. The report records
# every run in $DOC/cleanrl_runs/ (committed with the page), and a run finished there is not run again, on any machine.
# Two at a time, one per core: `taskset -c 0 nice bash run.sh classic dqn mujoco & taskset -c 1 nice bash run.sh td3 sac atari`.
# CleanRL's own ppo_continuous_action.py beside ours on HalfCheetah (its row on the page), in a virtual environment
# of its own (leanrl/tools/cleanrl_reference.py's docstring says which), 10 seeds at 1M steps, one run per core:
#   python leanrl/tools/cleanrl_reference.py run --python VENV/bin/python --core 0 --seeds 1 2 3 4 5 &
#   python leanrl/tools/cleanrl_reference.py run --python VENV/bin/python --core 1 --seeds 6 7 8 9 10
#   python leanrl/tools/cleanrl_reference.py convert runs/cleanrl_ref/mujoco --python VENV/bin/python   # finished seeds
#   python leanrl/tools/report.py doc/cleanrl_runs --cleanrl   # the page again, from its record alone
# SEEDS (default "21 31 41"), OUT (default runs/bench, or runs/smoke), DOC (default doc, or $OUT/doc with SMOKE).
# Re-running resumes: a run that finished at the sweep's budget (and, for a seeds script, with the members SEEDS
# asks for) is not repeated. One run.sh per family at a time: a second one into the same OUT is refused.
# What this machine cannot run is skipped, saying so.
# DRY=1: print the runs that would run (one line each: family/configuration, then the command) and the report's
# command, and run nothing.
set -euo pipefail
cd "$(dirname "$0")"
LEARN=${LEARN:-0}
CLEANRL=${CLEANRL:-0}
if [ "$CLEANRL" = 1 ]; then
  FAMILIES=${*:-classic dqn mujoco td3 sac atari}
else
  FAMILIES=${*:-classic atari mujoco sac td3 dqn dqn_atari}
fi
for f in $FAMILIES; do
  case $f in classic|atari|mujoco|sac|td3|dqn|dqn_atari|teacher) ;;
    *) echo "error: unknown family '$f' (classic, atari, mujoco, sac, td3, dqn, dqn_atari or teacher)" >&2; exit 2 ;; esac
done
DRY=${DRY:-0}
if [ $(( ${SMOKE:-0} + ${FULL:-0} + LEARN + CLEANRL )) -gt 1 ]; then
  echo "error: SMOKE=1, FULL=1, LEARN=1 and CLEANRL=1 are different sweeps: give one of them" >&2
  exit 2
fi
dqn_budget() {  # family steps: DQN's budget flags (learning_starts, log lines, buffer) for a run of that many steps
  case $1 in
    dqn) echo --total-timesteps "$2" $([ "$2" -lt 20000 ] && echo --learning-starts 200 --measure-burnin 100 --log-every 100) ;;
    dqn_atari) echo --total-timesteps "$2" $([ "$2" -lt 100000 ] && echo --learning-starts $(( $2 / 3 )) \
      --measure-burnin $(( $2 / 12 )) --log-every $(( $2 / 12 )) --buffer-size $(( $2 < 1000 ? 200 : 100000 )) \
      $([ "$2" -lt 1000 ] && echo --batch-size 8)) ;;
  esac
}
if [ "${SMOKE:-0}" = 1 ]; then
  OUT=${OUT:-runs/smoke}; DOC=${DOC:-$OUT/doc}; SEEDS=${SEEDS:-1}; COMPILE=
  budget() { case $1 in sac|td3) echo --total-timesteps 600 --learning-starts 200 --batch-size 32 --buffer-size 1000 \
                                   --log-every 100 --measure-burnin 100;;
             dqn|dqn_atari) dqn_budget "$1" 600;;
             *) echo --num-envs 1 --num-steps 64 --total-timesteps 256;; esac; }
elif [ "${FULL:-0}" = 1 ]; then
  budget() { case $1 in dqn) dqn_budget dqn 500000;; dqn_atari) dqn_budget dqn_atari 10000000;;
    *) echo --total-timesteps "$(case $1 in classic|teacher) echo 500000;; atari) echo 10000000;; *) echo 1000000;; esac)";; esac; }
elif [ "$LEARN" = 1 ]; then
  OUT=${OUT:-runs/learn}
  SEEDS=${SEEDS:-1 2}
  budget() {  # steps where each family has learned with CleanRL's settings, within hours on 2 cores
    case $1 in
      classic|teacher) echo --total-timesteps 500000 ;;
      atari) echo --total-timesteps 400000 ;;
      mujoco) echo --total-timesteps 200000 ;;
      sac|td3) echo --total-timesteps 100000 ;;
      dqn) dqn_budget dqn 500000 ;;
      dqn_atari) dqn_budget dqn_atari "${DQN_ATARI_STEPS:-10000000}" ;;
    esac
  }
elif [ "$CLEANRL" = 1 ]; then
  OUT=${OUT:-runs/cleanrl}
  SEEDS=${SEEDS:-1 2 3 4 5}
  LONG_SEEDS=${LONG_SEEDS:-1}
  budget() {  # CleanRL's budgets (Breakout's cut to ATARI_STEPS), with CleanRL's defaults for everything else
    case $1 in
      classic) echo --total-timesteps 500000 ;;
      dqn) dqn_budget dqn 500000 ;;
      mujoco|sac|td3) echo --total-timesteps 1000000 ;;
      atari) echo --total-timesteps "${ATARI_STEPS:-2000000}" ;;
      *) echo "error: CLEANRL=1 runs classic, dqn, mujoco, td3, sac and atari, not $1" >&2; exit 2 ;;
    esac
  }
else
  budget() { case $1 in dqn) dqn_budget dqn "${DQN_STEPS:-30000}";; dqn_atari) dqn_budget dqn_atari "${DQN_ATARI_STEPS:-6000}";;
    *) echo --total-timesteps "$(case $1 in classic|teacher) echo "${CLASSIC_STEPS:-200000}";; atari) echo "${ATARI_STEPS:-10240}";; mujoco) echo "${MUJOCO_STEPS:-20480}";; *) echo "${OFFPOLICY_STEPS:-8000}";; esac)"
      case $1 in sac|td3) echo --learning-starts 5000;; esac;; esac; }
fi
OUT=${OUT:-runs/bench}; DOC=${DOC:-doc}; SEEDS=${SEEDS:-21 31 41}; COMPILE=${COMPILE---compile}
read -r CUDA BF16 CORES < <(python -c "import sys, torch; sys.path.insert(0, 'leanrl'); import plumbing
print(int(torch.cuda.is_available()), int(torch.ops.mkldnn._is_mkldnn_bf16_supported()), plumbing.cores())")

skip() {  # skip family config reason: the report shows the configuration as skipped, with the reason
  if [ "$DRY" = 1 ]; then
    echo "skip $1/$2: $3"
    return
  fi
  mkdir -p "$OUT/$1/$2"; echo "$3" > "$OUT/$1/$2/SKIPPED"; echo "== skip $1/$2: $3" >&2
}

finished() {  # dir family command...: the run there ended by itself at this sweep's budget, with the members asked
  local dir=$1 total members
  total=$(budget "$2" | sed -n 's/.*--total-timesteps \([0-9]*\).*/\1/p')
  members=$(sed -n 's/.*--num-seeds \([0-9]*\).*/\1/p' <<< "${*:3}")
  [ -f "$dir/summary.json" ] && ! grep -q '"interrupted": true' "$dir/summary.json" \
    && grep -Eq "\"total_timesteps\": $total([^0-9]|$)" "$dir/summary.json" \
    && { [ -z "$members" ] || grep -Eq "\"num_seeds\": $members([^0-9]|$)" "$dir/summary.json"; }
}

run() {  # run family config seed command...: one run, unless it finished before
  local family=$1 config=$2 seed=$3; shift 3
  local dir="$OUT/$family/$config/$seed" keep=() fresh=
  # one stopped early (Ctrl-C, which stops the sweep too) wrote a summary.json as well: it runs again, and CLEANRL=1
  # resumes it from the checkpoint it saved
  if finished "$dir" "$family" "$@"; then return; fi
  # CLEANRL=1 goes on from the runs its report recorded beside its page, on this machine or another
  if [ "$CLEANRL" = 1 ] && finished "$DOC/cleanrl_runs/$family/$config/$seed" "$family" "$@"; then return; fi
  # a run that ended at another budget or with other members is another run: it starts again
  if [ -f "$dir/summary.json" ] && ! grep -q '"interrupted": true' "$dir/summary.json"; then fresh=1; fi
  if [ "$CLEANRL" = 1 ]; then
    keep=(--save-model)
    if [ -f "$dir/agent.pt" ] && [ -z "$fresh" ]; then keep+=(--resume "$dir/agent.pt"); fi
  fi
  if [ "$DRY" = 1 ]; then
    echo "$family/$config:" "$@" --seed "$seed" --log-dir "$dir" $(budget "$family") "${keep[@]}"
    return
  fi
  if [ "${#keep[@]}" -lt 2 ]; then rm -rf "$dir"; fi
  rm -rf "$OUT/$family/$config/SKIPPED"
  echo "== $family/$config seed $seed" >&2
  "$@" --seed "$seed" --log-dir "$dir" $(budget "$family") "${keep[@]}"
}

family() {  # family baseline torchcompile [quantized pruned ddp compile_async seeds]: one family per seed (compile_async: LEARN=1)
  local f=$1 base=leanrl/$2 tc=leanrl/$3 quant=${4:+leanrl/$4} pruned=${5:+leanrl/$5} ddp=${6:+leanrl/$6} seed
  local seeds=${8:+leanrl/$8}
  if [ "$LEARN" = 1 ]; then
    learn_family "$@"
    return
  fi
  if [ "$CLEANRL" = 1 ]; then
    cleanrl_family "$@"
    return
  fi
  [ "$CUDA" = 1 ] || skip "$f" 04-compile-cudagraphs "no CUDA device"
  [ -n "$COMPILE" ] || skip "$f" 03-compile "SMOKE=1 runs no compiled configuration"
  if [ "$f" = atari ] && [ "$BF16" = 0 ]; then skip "$f" 05-bf16 "no native bf16 on this CPU"; fi
  if [ -n "$ddp" ] && [ "$CORES" -lt 2 ]; then skip "$f" 08-ddp2 "one CPU core: no room for 2 ranks"; fi
  for seed in $SEEDS; do
    run "$f" 01-baseline "$seed" python "$base"
    run "$f" 02-eager "$seed" python "$tc"
    if [ -n "$COMPILE" ]; then run "$f" 03-compile "$seed" python "$tc" --compile; fi
    if [ "$CUDA" = 1 ]; then run "$f" 04-compile-cudagraphs "$seed" python "$tc" --compile --cudagraphs; fi
    if [ "$f" = atari ] && [ "$BF16" = 1 ]; then run "$f" 05-bf16 "$seed" python "$tc" $COMPILE --bf16; fi
    if [ -n "$quant" ]; then run "$f" 06-quantized "$seed" python "$quant" $COMPILE; fi
    # pruned once, before the first iteration (CartPole's default; Breakout's steps at iterations 150-230 would leave
    # the short budgets timing the wide network first)
    if [ -n "$pruned" ]; then
      run "$f" 07-pruned "$seed" python "$pruned" $COMPILE --prune-ratio 0.5 --prune-start 1 --prune-steps 1
    fi
    if [ -n "$ddp" ] && [ "$CORES" -ge 2 ]; then
      run "$f" 08-ddp2 "$seed" python -m torch.distributed.run --standalone --nproc-per-node 2 "$ddp" $COMPILE
    fi
    # the seeds script: the agents of seeds seed to seed + 3 in one program (fps counts all their steps); Breakout has
    # none here, its seeds script being slower than single runs on a CPU (doc/seeds.md)
    if [ -n "$seeds" ]; then run "$f" 11-compile-4-seeds "$seed" python "$seeds" $COMPILE --num-seeds 4; fi
    # the PPO families' ceiling: their envs stepped with random actions and no policy (leanrl/tools/bench_env.py)
    case $f in classic|atari|mujoco) run "$f" 09-env-alone "$seed" python leanrl/tools/bench_env.py --family "$f" ;; esac
  done
}

consecutive() {  # seeds...: true when each seed is the one before plus 1 (a seeds run's members are seed, seed + 1, ...)
  local prev=$1 s
  shift
  for s in "$@"; do
    [ "$s" = $((prev + 1)) ] || return 1
    prev=$s
  done
}

learn_family() {  # family baseline torchcompile [quantized pruned ddp compile_async seeds]: LEARN=1's configurations
  local f=$1 base=leanrl/$2 tc=leanrl/$3 quant=${4:+leanrl/$4} pruned=${5:+leanrl/$5} ddp=${6:+leanrl/$6} seed
  local async=${7:+leanrl/$7} seeds=${8:+leanrl/$8}
  if [ "$f" = dqn_atari ] && [ -z "${DQN_ATARI_STEPS:-}" ]; then
    local why="needs a faster machine: DQN learns Breakout over CleanRL's 10M steps (learning from step 80k), about"
    why+=" 40 hours a run at the ~70 fps of 2 CPU cores; DQN_ATARI_STEPS=10000000 LEARN=1 bash run.sh dqn_atari runs it"
    skip "$f" 01-baseline "$why"
    skip "$f" 03-compile "$why"
    return
  fi
  if [ -n "$ddp" ] && [ "$CORES" -lt 2 ]; then skip "$f" 08-ddp2 "one CPU core: no room for 2 ranks"; fi
  # --compile's runs as the members of one seeds run, where the family has a seeds script and the seeds follow each
  # other: about 1.7-2.1x faster than a run per seed in turn (doc/seeds.md); report.py reads each member as its
  # seed's run
  if [ -n "$seeds" ] && consecutive $SEEDS; then
    run "$f" 03-compile "${SEEDS%% *}" python "$seeds" --compile --num-seeds "$(wc -w <<< "$SEEDS")"
  else
    seeds=
  fi
  for seed in $SEEDS; do
    run "$f" 01-baseline "$seed" python "$base"
    if [ -z "$seeds" ]; then run "$f" 03-compile "$seed" python "$tc" --compile; fi
    # SAC's and TD3's opt-in bf16 updates, where the CPU (or a GPU) has native bf16: they learn as fp32 does, or not
    case $f in sac|td3) if [ "$BF16" = 1 ] || [ "$CUDA" = 1 ]; then
      run "$f" 05-bf16 "$seed" python "$tc" --compile --bf16; fi ;; esac
    if [ -n "$quant" ]; then run "$f" 06-quantized "$seed" python "$quant" --compile; fi
    if [ -n "$pruned" ]; then run "$f" 07-pruned "$seed" python "$pruned" --compile; fi
    if [ -n "$ddp" ] && [ "$CORES" -ge 2 ]; then
      run "$f" 08-ddp2 "$seed" python -m torch.distributed.run --standalone --nproc-per-node 2 "$ddp" --compile
    fi
    # eager units until the background compile is done, then the compiled ones: it learns as --compile does, or not
    if [ -n "$async" ]; then run "$f" 10-compile-async "$seed" python "$async" --compile --compile-async; fi
  done
}

cleanrl_family() {  # family baseline torchcompile [... seeds]: CLEANRL=1's configurations
  local f=$1 base=leanrl/$2 tc=leanrl/$3 seeds=${8:+leanrl/$8} list=$SEEDS seed
  case $f in td3|sac|atari) list=$LONG_SEEDS ;; esac
  if [ -n "$seeds" ] && consecutive $list; then
    run "$f" 03-compile "${list%% *}" python "$seeds" --compile --num-seeds "$(wc -w <<< "$list")"
  else
    seeds=
  fi
  for seed in $list; do
    # TD3's and SAC's baselines at 1M are 2-3 hours each on a CPU core: the published table is CleanRL's
    case $f in td3|sac) ;; *) run "$f" 01-baseline "$seed" python "$base" ;; esac
    if [ -z "$seeds" ]; then run "$f" 03-compile "$seed" python "$tc" --compile; fi
  done
}

teacher_family() {  # a 1024 x 6 network alone, then students of three sizes acting beside a 1024 x 6 teacher
  local ts=leanrl/ppo_teacher_student_torchcompile.py seed
  for seed in $SEEDS; do
    run teacher 10-large-alone "$seed" python leanrl/ppo_quantized_torchcompile.py $COMPILE --hidden-dim 1024 \
      --hidden-depth 6
    run teacher 11-student-64x2 "$seed" python "$ts" $COMPILE --student-hidden-dim 64 --student-hidden-depth 2
    run teacher 12-student-128x2 "$seed" python "$ts" $COMPILE --student-hidden-dim 128 --student-hidden-depth 2
    run teacher 13-student-256x4 "$seed" python "$ts" $COMPILE --student-hidden-dim 256 --student-hidden-depth 4
  done
}

# one run.sh per family at a time: a second one would delete the first one's live run folders; another family's
# sweep may run beside it (one per core)
if [ "$DRY" != 1 ]; then
  lock=9
  for f in $FAMILIES; do
    mkdir -p "$OUT/$f"
    eval "exec $lock>\"\$OUT/\$f/.lock\""
    if ! flock -n "$lock"; then
      echo "error: another run.sh is running $f into $OUT: wait for it, or give another OUT" >&2
      exit 2
    fi
    lock=$((lock + 1))
  done
fi
start=$SECONDS
for f in $FAMILIES; do
  case $f in
    classic) family classic ppo.py ppo_torchcompile.py ppo_quantized_torchcompile.py ppo_pruned_torchcompile.py \
               ppo_ddp_torchcompile.py ppo_compile_async_torchcompile.py ppo_seeds_torchcompile.py ;;
    atari) family atari ppo_atari_envpool.py ppo_atari_envpool_torchcompile.py \
             ppo_atari_envpool_quantized_torchcompile.py ppo_atari_envpool_pruned_torchcompile.py \
             ppo_atari_envpool_ddp_torchcompile.py ppo_atari_envpool_compile_async_torchcompile.py ;;
    mujoco) family mujoco ppo_continuous_action.py ppo_continuous_action_torchcompile.py "" "" "" "" \
              ppo_continuous_action_seeds_torchcompile.py ;;
    sac) family sac sac_continuous_action.py sac_continuous_action_torchcompile.py ;;
    td3) family td3 td3_continuous_action.py td3_continuous_action_torchcompile.py ;;
    dqn) family dqn dqn.py dqn_torchcompile.py ;;
    dqn_atari) family dqn_atari dqn_atari_envpool.py dqn_atari_envpool_torchcompile.py ;;
    teacher) teacher_family ;;
  esac
done
report=(python leanrl/tools/report.py "$OUT" --out "$DOC")
if [ "$LEARN" = 1 ]; then report+=(--learning); fi
if [ "$CLEANRL" = 1 ]; then report+=(--cleanrl); fi
if [ "$DRY" = 1 ]; then
  echo "${report[*]}"
  exit 0
fi
echo "== sweep took $(( (SECONDS - start) / 60 )) min" >&2
"${report[@]}"
