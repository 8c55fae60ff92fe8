#!/usr/bin/env bash
# One cell of the Table 1 reproduction: train MODEL within BUDGET parameters on text8-10M with the
# shared protocol, export it, score the test split once with `isan score`, and keep the evidence in
# results/table1/MODEL-BUDGET/ (train_log.jsonl, score.json, valid.json, command.txt).
# Usage (from the repository root): bash train/table1.sh MODEL BUDGET [MAX_CHARS]
# A run that was stopped resumes from runs/table1/MODEL-BUDGET when started again.
set -euo pipefail
model=$1 budget=$2 max_chars=${3:-18e6}
data=${DATA:-../shared/data/text8_head/text8_head.txt}
run=runs/table1/$model-$budget bundle=runs/table1/$model-$budget.bundle out=results/table1/$model-$budget
train_cmd="isan train $model --out $run --params $budget --data $data --max-chars $max_chars --eval-every 0.5 --patience 4 --max-epochs 100 --no-progress"
export_cmd="isan export $run $bundle --overwrite --no-table"
score_cmd="isan score --model $bundle --json --text8-split test $data"
valid_cmd="isan score --model $bundle --json --text8-split valid $data"
$train_cmd
$export_cmd > /dev/null
mkdir -p "$out"
$score_cmd > "$out/score.json.tmp" && mv "$out/score.json.tmp" "$out/score.json"
$valid_cmd > "$out/valid.json.tmp" && mv "$out/valid.json.tmp" "$out/valid.json"
cp "$run/train_log.jsonl" "$out/train_log.jsonl"
cp "$run/config.json" "$out/config.json"
printf '%s\n' "$train_cmd" "$export_cmd" "$score_cmd" "$valid_cmd" > "$out/command.txt"
cat "$out/score.json"
