#!/usr/bin/env bash
# On one GPU machine (about 9 minutes): three distillation runs at once on
# one GPU, each from the ensemble of the four shipped models (the mixture of their next-character
# distributions; valid 1.6996 bpc, against 1.7308 for the best member, d = 320), with the default's
# recipe: two students at the default's width (d = 216; A = 0.5 and 0.8) and one at d = 320 (A = 0.5).
#
#   bash isan/bench/gpu_check.sh --prepare      # here, once: marisa-trie's wheel and the data into .gpu/
#   bash results/distil/gpu_run.sh              # there, with .gpu carried
#
# The budget follows the card: a 25-step probe of the three runs at once (no teacher) measures each
# run's speed, and each run gets the characters it can train in the minutes left (the cosine schedule
# ends with the budget). Every run's command, with the budget it got, is printed and written to
# $OUT/commands.txt; a run is the same on a CPU with that command (slower). What comes back: a tar per
# run (best.safetensors, config.json, train_log.jsonl, the run's output), the GPU tests' log, the log.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR=${OUT:-.gpu/out}
mkdir -p "$OUT_DIR" runs
TRAIN_SECONDS=${ISAN_GPU_TRAIN_SECONDS:-390}  # from the launch of the runs to their end
export PYTHONUNBUFFERED=1 ISAN_SHARED_DATA="$PWD/.gpu/data"  # the tests read text8 from there
if [ -z "${ISAN_DRY_RUN:-}" ]; then  # ISAN_DRY_RUN=1: the script's own check on a CPU, on a small text
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/isan-site .gpu/whl/*.whl
export PYTHONPATH=/tmp/isan-site${PYTHONPATH:+:$PYTHONPATH}
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -3
nvidia-smi -L
fi
ISAN="python3 -m isan.cli"
DATA="${ISAN_DATA:-.gpu/data/text8_head/text8_head.txt --dataset text8}"
TEACHERS="--teacher isan/models/text8-d320-stable --teacher isan/models/text8-d216-distil --teacher isan/models/text8-d216-stable --teacher isan/models/text8-d216-unconstrained"
RECIPE="--stable-rho 0.98 --weight-decay 0.1 --state-dropout 0.2 --ema 0.998 --lr-schedule cosine --max-epochs 1000 --eval-every 0.5 --patience 1000 --device ${ISAN_DEVICE:-cuda} --threads 4 --no-progress"
RUNS=("ens-d216-a05:216:0.5" "ens-d216-a08:216:0.8" "ens-d320-a05:320:0.5")

# the probe: 25 steps of the three at once, no teacher
for r in "${RUNS[@]}"; do IFS=: read -r name d a <<<"$r"
  $ISAN train --out "runs/probe-$name" --data $DATA --d "$d" $RECIPE --max-steps 25 >"runs/probe-$name.out" 2>&1 &
done
wait
declare -A SPEED
for r in "${RUNS[@]}"; do IFS=: read -r name d a <<<"$r"
  SPEED[$name]=$(python3 -c "
import json; e=[json.loads(l) for l in open('runs/probe-$name/train_log.jsonl')]
s=[x['chars_per_s'] for x in e if x.get('event')=='step']; print(s[-1] if s else 0)")
  echo "probe $name: ${SPEED[$name]} chars/s (three runs at once)"
done

START=$SECONDS
for r in "${RUNS[@]}"; do IFS=: read -r name d a <<<"$r"
  # the teacher's pass and the validations take about a tenth of the time: budget 0.75 of it
  budget=$(python3 -c "print(max(100000, int(${SPEED[$name]} * $TRAIN_SECONDS * 0.75 // 1e5 * 1e5)))")
  cmd="isan train --out runs/text8-$name --data $DATA --d $d $TEACHERS --distill $a $RECIPE --max-chars $budget"
  echo "$cmd" | tee -a "$OUT_DIR/commands.txt"
  python3 -m isan.cli ${cmd#isan } >"runs/text8-$name.out" 2>&1 &
done
sleep 30
python3 -m pytest -q -p no:cacheprovider -rs -m gpu tests/test_torch_backend.py >"$OUT_DIR/gpu_tests.log" 2>&1
tail -3 "$OUT_DIR/gpu_tests.log"
while [ $((SECONDS - START)) -lt "$TRAIN_SECONDS" ] && [ -n "$(jobs -rp)" ]; do sleep 5; done
for p in $(jobs -rp); do echo "stopping $p at the deadline"; kill -TERM "$p"; done
sleep 5
for r in "${RUNS[@]}"; do IFS=: read -r name d a <<<"$r"
  tail -2 "runs/text8-$name/train_log.jsonl" | cut -c1-400
  tar --ignore-failed-read -cf "$OUT_DIR/text8-$name.tar" -C runs "text8-$name/best.safetensors" "text8-$name/config.json" \
      "text8-$name/train_log.jsonl" "text8-$name.out"
done
ls -la "$OUT_DIR"
