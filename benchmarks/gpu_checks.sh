#!/usr/bin/env bash
# The GPU checks as one prepared command, for a lent machine's short lease (docs/gpu.md): the CUDA tests, the
# sampler against eager, the plateau at GPU scale (the GPU char config's base trained on a decayed cosine with
# its own early stopping, the judges' worth in nats on it beside the MLE control's gain, the plateau verdict), and
# the game at that plateau over 3 seeds with its controls (benchmarks/plateau_game.sh).
# Each step gets at most what is left of BUDGET seconds and writes its output to $OUT/NAME.log as it runs (the steps'
# times to $OUT/checks.log, the run's small files to $OUT/run.tgz), so a run cut off still returns what it measured.
#   here:   bash ../shared/gpu/stage.sh          (the corpus and the wheels the GPU machine lacks, into .gpu/)
#   there:  <the line stage.sh prints> bash benchmarks/gpu_checks.sh          (run's carry: .gpu)
#   some steps only:  STEPS=plateau-base,judges bash benchmarks/gpu_checks.sh
#   the game (named only):  STEPS=plateau-base,game-frozen,game-frozen-read bash ...
#   the fed judge past calibration against the strongest controls (named only):
#           STEPS=plateau-base,fed-calibrate,fed-judge,fed-second-base,fed-ensemble,fed-tilt bash ...
#   on CPU at toy sizes, what a machine without a GPU can check of it:
#           TOY=1 DEVICE=cpu OUT=/tmp/gpu_checks RUN=/tmp/gpu_checks_run bash benchmarks/gpu_checks.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu_checks}
DEVICE=${DEVICE:-cuda}
export PY=${PY:-python3}  # the GPU image's python with PyTorch
BUDGET=${BUDGET:-590}
RUN=${RUN:-runs/plateau_gpu}
# the fed steps' runs beside it: the base at its tail-calibrated temperature, a second base (seed 2), their ensemble
CAL=${RUN}_calibrated SECOND=${RUN}_s2 ENSEMBLE=${RUN}_ensemble
mkdir -p "$OUT"
LOG=$OUT/checks.log
END=$((SECONDS + BUDGET))
# the base: the GPU config's shape and rate, its cosine decayed to a hundredth as config/cycles_plateau.py's is, over
# nanoGPT's 5,000 iterations (a GPU lease's time), chosen on the held-out train tokens read whole; the evaluation
# that follows it trains one fresh judge, not three, for the same reason
BASE=(--base_max_iters=5000 --base_min_lr=1e-5 --base_eval_interval=250 --base_patience=4 --judge_seeds=1)
DECODE=(--repeats 3 --train_steps 10)
RECIPES=(--windows 5000 --num_samples 960)  # 2 x 960 of the 1,975 val windows of 256 characters
# the fed judge: every train window, FED_NEGATIVES of the base's continuations of each (16 as on CPU; one lease fitted
# 4 beside the tilt: the judge's step took 175 s on an H200, its fit 747 CPU seconds, which grow with the negatives)
FED=(--windows 0 --negatives "${FED_NEGATIVES:-16}" --num_samples 960)  # 2 x 960 of the 1,975 val windows
TILT=(--tilt_k 32 --tilt_windows 100 --draws 1338,2001,3001)
PLATEAU=(--seeds 1338,2001,3001)
MLE_ITERS=500  # the plateau's MLE controls: a tenth of the base's 5,000 iterations each
if [ "${TOY:-0}" = 1 ]; then
  # a 60,000-character split of the corpus, so that the fed judge's every-window negatives are few
  [ -f data/shakespeare_char_toy/train.bin ] || $PY data/shakespeare_char/prepare.py \
    --out_dir=data/shakespeare_char_toy --train_tokens=60000 > /dev/null
  BASE+=(--dataset=shakespeare_char_toy --n_layer=2 --n_head=2 --n_embd=32 --block_size=64 --batch_size=8 --base_max_iters=40
         --base_eval_interval=20 --base_select_tokens=2000 --base_eval_iters=2)
  DECODE=(--rows 4 --new 16 --repeats 1 --samplers eager,static --train_steps 2 --train_batch 2)
  RECIPES=(--windows 24 --num_samples 12 --epochs 1 --law_windows 4)
  PLATEAU=(--seeds 1338,2001 --ppl_windows 8)
  MLE_ITERS=10
  FED=(--windows 0 --negatives 2 --select_windows 4 --num_samples 12 --read_negatives 2)
  TILT=(--tilt_k 4 --tilt_windows 4 --draws 1338,2001)
fi

step() {  # step NAME LIMIT_S COMMAND...: run it for at most LIMIT_S seconds, or what is left of the budget
  local name=$1 limit=$2 left=$((END - SECONDS)) t0=$SECONDS rc
  shift 2
  # the game and fed steps run only when named: with the base, the games overran a lease's command (docs/gpu.md)
  [[ ( ",${STEPS:-all}," == *",all,"* && $name != game* && $name != fed* ) || ",${STEPS:-}," == *",$name,"* ]] ||
    return 0
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -le 5 ]; then
    echo "== $name: skipped, the budget is spent" | tee -a "$LOG"
    return 1
  fi
  echo "== $name ($(date -u +%T), at most ${limit} s): $*" | tee -a "$LOG"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  echo "== $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$LOG"
  return "$rc"
}

pack() {  # the runs' small files (configs, logs, stage times, tables), without checkpoints, sampled data or the
  # judges' files (their fitted texts), as one file: a lease returns at most 8 of $OUT's
  local runs=() r
  for r in "$RUN" "$CAL" "$SECOND" "$ENSEMBLE"; do [ -d "$r" ] && runs+=("$r"); done
  [ ${#runs[@]} -gt 0 ] && tar czf "$OUT/run.tgz.tmp" --exclude='*.pt' --exclude='*.work' --exclude='data_*' \
    --exclude='judge_ngram_*.json' --exclude='*.progress' "${runs[@]}" && mv "$OUT/run.tgz.tmp" "$OUT/run.tgz"
  return 0
}

step environment 30 bash -c 'nvidia-smi || true; $PY -c "import torch; print(\"torch\", torch.__version__, \"CUDA\",
  torch.version.cuda, torch.cuda.get_device_name() if torch.cuda.is_available() else \"no GPU\")"'
step cuda-tests 120 $PY -m pytest -q -n 0 -p no:cacheprovider -k cuda
step sampler 150 $PY benchmarks/bench_decode.py --device "$DEVICE" "${DECODE[@]}"
# the fed steps' second base (seed 2) trains beside the first when both are named: each is launch-bound, and one
# GPU runs the two at about one's speed (so neither's time is a figure of the base's alone)
# the corpus prepared first, so that the two do not both prepare it
[ "${TOY:-0}" = 1 ] || [ -f data/shakespeare_char/train.bin ] || $PY data/shakespeare_char/prepare.py > /dev/null
step fed-second-base 300 $PY run_cycles.py config/cycles_shakespeare_char_gpu.py config/cycles_plateau.py \
  --num_cycles=0 --out_dir="$SECOND" --device="$DEVICE" --seed=2 "${BASE[@]}" &
second=$!
step plateau-base 300 $PY run_cycles.py config/cycles_shakespeare_char_gpu.py config/cycles_plateau.py \
  --num_cycles=0 --out_dir="$RUN" --device="$DEVICE" "${BASE[@]}"
pack
[ -f "$RUN/base_model_v1.pt" ] || exit 1
flops=$($PY -c "import json, types
from run_cycles import flops_per_iteration
C = types.SimpleNamespace(**json.load(open('$RUN/config.json')))
print(f'{flops_per_iteration(C, \"$RUN/base_model_v1.pt\") * $MLE_ITERS:.6g}')")
# the judges, the plateau's MLE controls and the game at the plateau (benchmarks/plateau_game.sh: the frozen judge's
# arms, and the co-trained judge's, whose refits cost ~1.6 s of CPU a step) write apart and time nothing: side by
# side; each game's read reads the worth of the judges that played itself (bench_share.py)
export RUN OUT DEVICE TOY
# each game read's controls side by side, their models read on the GPU: on CPU, the read of 10.7 M models overran
# 400 s of a lease (docs/gpu.md)
export PARALLEL=${PARALLEL:-1} READ_DEVICE=${READ_DEVICE:-$DEVICE}
step judges 240 $PY benchmarks/bench_judge_recipes.py --run "$RUN" --recipes "${JUDGES:-window,bidirectional}" \
  --device "$DEVICE" "${RECIPES[@]}" &
judges=$!
step plateau-verdict 240 $PY benchmarks/bench_plateau.py --run "$RUN" --flops "$flops" --learning_rates 0 \
  --device "$DEVICE" "${PLATEAU[@]}" &
verdict=$!
step game-frozen 300 bash benchmarks/plateau_game.sh play ngram_frozen &
frozen=$!
step game-co 420 bash benchmarks/plateau_game.sh play ngram_co &
co=$!
wait $judges $verdict $frozen
pack
step game-frozen-read 240 bash benchmarks/plateau_game.sh read ngram_frozen
pack
wait $co
step game-co-read 240 bash benchmarks/plateau_game.sh read ngram_co
pack
# the fed judge past calibration (named only): the base at its tail-calibrated temperature, the n-gram judge fed every
# train window x 16 of that base's own continuations (J_T) with its MLE control, a second base (seed 2) and the
# ensemble of the two calibrated, then J_T's tilt of the calibrated base read against the calibrated base, MLE at the
# judge's FLOPs (calibrated again) and the ensemble, on the same windows
step fed-calibrate 60 $PY benchmarks/calibrate_base.py --run "$RUN" --out_dir "$CAL" --device "$DEVICE"
wait $second
# the ensemble of the two calibrated bases beside the judge, whose fit runs on the CPU and leaves the GPU idle
step fed-ensemble 60 $PY benchmarks/calibrate_base.py --run "$RUN,$SECOND" --out_dir "$ENSEMBLE" \
  --device "$DEVICE" &
ensemble=$!
step fed-judge 420 $PY benchmarks/bench_judge_curve.py --run "$CAL" "${FED[@]}" --device "$DEVICE"
wait $ensemble
if [[ ",${STEPS:-}," == *",fed-tilt,"* ]]; then
  work=$(ls -d "$CAL"/recipes/base_* 2> /dev/null | head -1)
  step fed-tilt 300 $PY benchmarks/bench_tilt.py --runs "$CAL" --source "$work/judge_ngram_curve_allw_${FED[3]}neg_s1337.json" \
    --mle "$(ls "$work"/mle_at_*_flops_s1337.pt | head -1)" --control "$ENSEMBLE/base_model_v1.pt" "${TILT[@]}" \
    --device "$DEVICE" --out "$OUT/fed_tilt.json"
fi
pack
echo "== done in $SECONDS s" | tee -a "$LOG"
