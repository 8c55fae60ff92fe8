#!/usr/bin/env bash
# The tuning step of the Table 1 protocol, the same for every architecture: train MODEL at the
# 8e4 budget for half an epoch of text8-10M (4.6M characters, one validation at 0.5 epoch; B=32
# streams, T=64, as in train/studies/table1.sh) with each learning rate of the grid, and keep each log in
# results/table1/tuning/MODEL-lrRATE.jsonl. `python -m isan.train.studies.table1 --tuning results/table1/tuning`
# then picks the rate with the best valid bpc per model (results/table1/tuning/lr.json), which
# train/studies/table1.sh uses at 8e4 and moves to larger budgets as 1/d.
# MODEL@S (irnn only) starts the recurrent matrix at S * I: the IRNN also tries 0.1 * I (Le et al. 2015
# allow a scaled identity), because at 1 * I its state blows up in the first steps at every rate.
# Usage (from the repository root): bash train/studies/tune.sh [MODEL ...]
#   (default: isan rnn irnn irnn@0.1 gru lstm linear linear_nlro isan_nobias; a log already there is kept)
# Environment: GRID (rates), THREADS (torch CPU threads), DATA (text8 file).
set -euo pipefail
data=${DATA:-../shared/data/text8_head/text8_head.txt}
grid=${GRID:-"8e-3 4e-3 2e-3 1e-3 5e-4 2.5e-4"}
models=${*:-isan rnn irnn irnn@0.1 gru lstm linear linear_nlro isan_nobias}
threads=${THREADS:+--threads $THREADS}
out=results/table1/tuning
mkdir -p "$out"
for spec in $models; do
  model=${spec%@*} scale=
  [ "$spec" != "$model" ] && scale="--init-scale ${spec#*@}"
  for lr in $grid; do
    [ -f "$out/$spec-lr$lr.jsonl" ] && continue
    run=runs/tune/$spec-lr$lr
    rm -rf "$run"
    isan train "$model" $scale --out "$run" --params 8e4 --data "$data" --lr "$lr" --batch-size 32 --bptt 64 \
      --max-chars 4.6e6 --eval-every 0.5 --max-epochs 1 --no-progress $threads
    cp "$run/train_log.jsonl" "$out/$spec-lr$lr.jsonl.tmp" && mv "$out/$spec-lr$lr.jsonl.tmp" "$out/$spec-lr$lr.jsonl"
  done
done
