#!/usr/bin/env bash
# The Elman-grammar study of issue #15, end to end (results/elman/command.txt lists the same steps).
# Run from the repository root. Fig. 1 takes about an hour on two shared cores (four processes).
set -euo pipefail
OUT=results/elman
DATA=runs/elman/data
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

isan study elman data --out $OUT --data-dir $DATA                     # entropy.json (H, checkers)
# Fig. 1 with the paper's models as written (issue #26): sparse ESN/ESN+ with output feedback and the RLS readout,
# eq. 6's ratios, NPM-T over EKF-trained SRNs (the EKF runs take ~6 CPU-minutes each: split over two processes)
isan study elman fig1 --out $OUT --runs 10 --models esn-paper,esn+-paper --log-name fig1_esn_paper.jsonl &
isan study elman fig1 --out $OUT --runs 10 --models npm-u+eq6 --log-name fig1_npm-uplus-eq6.jsonl &
isan study elman fig1 --out $OUT --runs 5 --models npm-t-ekf --log-name fig1_npm-t-ekf.jsonl &
isan study elman fig1 --out $OUT --runs 10 --run-from 5 --models npm-t-ekf --log-name fig1_npm-t-ekf-b.jsonl &
wait
# Our first models (issue #15), kept as named variants: dense ESN without feedback, ridge readout, transition ratios
isan study elman fig1 --out $OUT --runs 10 --models esn,esn+ --log-name fig1_esn.jsonl &
isan study elman fig1 --out $OUT --runs 10 --models npm-u --log-name fig1_npm-u.jsonl &
isan study elman fig1 --out $OUT --runs 10 --models npm-u+ --log-name fig1_npm-uplus.jsonl &
isan study elman fig1 --out $OUT --runs 10 --models npm-t --log-name fig1_npm-t.jsonl &
wait
isan study elman export --out $OUT                                    # bundles/ + bundles.json

train() {  # MODEL D: one trained model on the same data, exported, scored by the engine, recorded
  local model=$1 d=$2 name=$1-d$2
  local cmd="isan train $model --out runs/elman/$name --alphabet words --dataset text --data $DATA/train.txt --valid-data $DATA/valid.txt --d $d --batch-size 16 --bptt 32 --lr 0.004 --max-epochs 40 --patience 4 --eval-every 1 --threads 1 --no-progress"
  $cmd
  isan export runs/elman/$name $OUT/bundles/$name --overwrite --no-table
  mkdir -p $OUT/neural/$name
  isan score --model $OUT/bundles/$name --json $DATA/test.txt > $OUT/neural/$name/score.json
  isan study elman neural runs/elman/$name --name $name --label "${3:-$name}" --command "$cmd" --out $OUT
}
train isan 8 "ISAN d=8"
train isan 12 "ISAN d=12"
train isan 16 "ISAN d=16"
train isan 24 "ISAN d=24"
train isan 32 "ISAN d=32"
train lstm 64 "LSTM d=64"
isan study elman kappa runs/elman/isan-d12 --out $OUT                 # the ISAN chosen on valid
isan study elman table --results $OUT                                 # TABLE.md, table.json, fig1.png
