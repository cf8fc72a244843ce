#!/usr/bin/env bash
# The game at a plateau base (docs/results.md, sections 3.3 and 5): the tilt's game (KL inside the
# reward, log-odds) with the n-gram judge, co-trained and frozen after its warm-up, as docs/results.md 3.3 plays it on
# base v1, over 3 seeds, each with its own shuffled-judge, base, matched-temperature and MLE controls (bench_share).
#   bash benchmarks/plateau_game.sh play [ngram_frozen|ngram_co|ngram_saved ...]   every seed's arms and their
#                                  shuffled-judge controls, side by side (default: ngram_frozen and ngram_co)
#   bash benchmarks/plateau_game.sh read [ngram_frozen|ngram_co ...]   each arm against each control over the seeds
#                                                                       (the MLE controls train here)
# ngram_saved plays the n-gram judge saved at JUDGE (a .json file: bench_judge_curve.py's, bench_judge_recipes.py's)
# frozen from its first step, no warm-up; its runs are named by the arm, so one saved judge a RUN/game.
# Each read divides by the worth of the judge that played: each seed's n-gram judge as its game saved it
# (RUN/game/ARM_s{seed}_judge.json) or the saved judge at JUDGE, read on the base the game started from
# (bench_share.py).
# Environment: RUN (the plateau run: RUN/base_model_v1.pt, RUN/config.json; the games go to RUN/game), OUT (logs),
# DEVICE, PY, SEEDS, STEPS (200), JUDGE (ngram_saved's judge), SCALE (the tilt's a: the scale the n-gram judge's
# worth is largest at on this base),
# PARALLEL=1 (the read's controls side by side), READ_DEVICE (where the read's models are read, in fp32: cpu unless
# given), TOY=1 (toy sizes, for a CPU check). A read that fails stops the script (exit 1) before the next one.
set -uo pipefail
cd "$(dirname "$0")/.."
RUN=${RUN:-runs/plateau_gpu}
OUT=${OUT:-$RUN/game}
DEVICE=${DEVICE:-auto}
PY=${PY:-python3}
SEEDS=${SEEDS:-1338,2001,3001}
GAME=(--policy_path="$RUN/base_model_v1.pt" --device="$DEVICE" --max_steps="${STEPS:-200}" --prompts_per_step=8
      --num_generations=8 --learning_rate=1e-5 --beta=0 --scale_rewards=none --loss_type=dr_grpo --kl_in_reward=True
      --reward_form=log_odds --eval_interval=25 --ppl_max_tokens=50000 --judge=ngram --judge_warmup_steps=20
      --judge_natural_windows=64 --judge_replay=15 --reward_scale="${SCALE:-1}")
READ=()
if [ "${TOY:-0}" = 1 ]; then
  GAME+=(--max_steps="${STEPS:-4}" --eval_interval=2 --judge_warmup_steps=1 --judge_natural_windows=8 --prompts_per_step=2
         --num_generations=2 --ppl_max_tokens=2000)
  READ=(--ppl_windows 8 --entropy_windows 8 --worth_samples 8)
fi
mkdir -p "$RUN/game" "$OUT"

judge_args() {  # the arm's judge: refit every step (co-trained), never after its warm-up (frozen), or saved (JUDGE)
  case $1 in
    ngram_frozen) echo --judge_update_interval=100000 ;;
    ngram_co) echo --judge_update_interval=1 ;;
    ngram_saved) echo --reward_model_path="$JUDGE" --judge_update_interval=0 --judge_warmup_steps=0 \
                      --judge_natural_windows=0 ;;
  esac
}

play() {
  local seed name ctl
  for seed in ${SEEDS//,/ }; do
    for name in "$@"; do
      for ctl in "" _shuffled; do
        # shellcheck disable=SC2046  # judge_args' words are options
        OMP_NUM_THREADS=1 $PY train_grpo.py "${GAME[@]}" $(judge_args $name) --seed="$seed" --resume=True \
          --out_path="$RUN/game/${name}${ctl}_s$seed.pt" $([ -n "$ctl" ] && echo --reward_shuffle=True) \
          > "$OUT/game_${name}${ctl}_s$seed.log" 2>&1 &
      done
    done
  done
  wait
  for name in "$@"; do grep -h "^time:" "$OUT"/game_"$name"*.log; done
}

read_games() {
  local name control pid status
  pids=()  # the reads running side by side, seen by stop
  for name in "$@"; do
    # the shuffled control first, alone: it finishes any arm cut short, which the other controls then only read
    # (bench_share.py trains a run under a lock, so two reads never resume one arm in two processes)
    read_control "$name" shuffled || stop "$name" shuffled
    pids=()
    for control in base temperature mle; do
      if [ "${PARALLEL:-0}" = 1 ]; then
        read_control "$name" "$control" > "$OUT/read_${name}_$control.txt" &
        pids+=($!)
      else
        read_control "$name" "$control" || stop "$name" "$control"
      fi
    done
    if [ "${PARALLEL:-0}" = 1 ]; then
      for control in base temperature mle; do
        pid=${pids[0]}; pids=("${pids[@]:1}")
        wait "$pid"; status=$?
        cat "$OUT/read_${name}_$control.txt"
        [ "$status" = 0 ] || stop "$name" "$control"
      done
    fi
  done
}

stop() {  # stop ARM CONTROL: a read failed; say which, end the reads still running side by side (read_games'
  # pids, every process under each) and wait for them, so that none trains on after the script has stopped
  local pid
  echo "plateau_game.sh: the $2 read of $1 failed (its output is above): fix it, then rerun 'read $1'" >&2
  for pid in ${pids[@]+"${pids[@]}"}; do kill_tree "$pid"; done
  for pid in ${pids[@]+"${pids[@]}"}; do wait "$pid" 2>/dev/null; done
  exit 1
}

kill_tree() {  # kill_tree PID: the process and all its descendants, the deepest first
  local child
  for child in $(pgrep -P "$1"); do kill_tree "$child"; done
  kill "$1" 2>/dev/null
}

read_control() {  # read_control ARM CONTROL: bench_share's table for one arm against one control; its exit status
  $PY benchmarks/bench_share.py --out "$RUN/game" --name "$1" --seeds "$SEEDS" --control "$2" \
    --device "${READ_DEVICE:-cpu}" "${READ[@]}" -- "${GAME[@]}" $(judge_args "$1") 2>&1 \
    | tr '\r' '\n' | grep -v "it/s\]\|s/it\]\|^\s*$"
  return "${PIPESTATUS[0]}"
}

ARMS=("${@:2}")
[ ${#ARMS[@]} = 0 ] && ARMS=(ngram_frozen ngram_co)
for name in "${ARMS[@]}"; do
  case $name in
    ngram_frozen|ngram_co) ;;
    ngram_saved) [ -f "${JUDGE:-}" ] || { echo "plateau_game.sh: ngram_saved plays the n-gram judge at JUDGE=FILE.json;" \
                   "got JUDGE='${JUDGE:-}'" >&2; exit 2; } ;;
    *) echo "plateau_game.sh: no arm $name: the arms are ngram_frozen, ngram_co and ngram_saved" >&2; exit 2 ;;
  esac
done
case ${1:-} in
  play) play "${ARMS[@]}" ;;
  read) read_games "${ARMS[@]}" ;;
  *) echo "usage: bash benchmarks/plateau_game.sh play|read" >&2; exit 2 ;;
esac
