#!/usr/bin/env bash
# The shipped models' scores on real text, as `isan score --json` prints them (one JSON file each):
#   MODEL.text8_valid.json, MODEL.text8_test.json   text8-10M's valid and test splits (every shipped model)
#   MODEL.tinyshakespeare.json, MODEL.wikitext2_test.json   Tiny Shakespeare's input.txt and WikiText-2's
#       test.txt through the model's normaliser (the text8 models; not d = 320, which the guides do not quote)
#   text8-d216-distil.tinyshakespeare_skip.json   the same without the normaliser, unknown characters skipped
# Usage, from the repository root: bash results/scoring/score.sh   (one thread; about a minute)
set -euo pipefail
data=${DATA:-../shared/data}
out=results/scoring
score() {  # MODEL NAME ARGS...
  local model=$1 name=$2; shift 2
  OMP_NUM_THREADS=1 isan score --json --threads 1 --model "isan/models/$model" "$@" > "$out/$model.$name.json"
  echo "$out/$model.$name.json"
}
for model in text8-d216-distil text8-d216-stable text8-d216-unconstrained text8-d320-stable; do
  score $model text8_valid --text8-split valid "$data/text8_head/text8_head.txt"
  score $model text8_test --text8-split test "$data/text8_head/text8_head.txt"
done
for model in text8-d216-distil text8-d216-stable text8-d216-unconstrained; do
  score $model tinyshakespeare "$data/tinyshakespeare/input.txt"
  score $model wikitext2_test "$data/wikitext2/test.txt"
done
score text8-d216-distil tinyshakespeare_skip --normalize none --unknown skip "$data/tinyshakespeare/input.txt"
