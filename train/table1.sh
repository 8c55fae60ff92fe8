#!/usr/bin/env bash
# One cell of the Table 1 reproduction: train MODEL within BUDGET parameters on text8-10M with the
# shared protocol, export it, score the test split once with `isan score`, and keep the evidence in
# results/table1/MODEL-BUDGET/ (train_log.jsonl, score.json, valid.json, command.txt).
# Protocol: B=32 streams, T=64, Adam at the model's rate (and the IRNN's identity scale) from the tuning step (train/tune.sh, then
# `python -m isan.train.table1 --tuning results/table1/tuning` writes results/table1/tuning/lr.json;
# a model not tuned there uses 2e-3), rate halved on a validation plateau, early stopping with
# patience 4 at evaluations every half epoch, MAX_CHARS (default 18e6, two epochs) characters.
# Usage (from the repository root): bash train/table1.sh MODEL BUDGET [MAX_CHARS]
# Environment: THREADS (torch CPU threads), DATA (text8 file).
# A run that was stopped resumes from runs/table1/MODEL-BUDGET when started again.
set -euo pipefail
model=$1 budget=$2 max_chars=${3:-18e6}
data=${DATA:-../shared/data/text8_head/text8_head.txt}
settings=$(python -c "
import json, pathlib, sys
p = pathlib.Path('results/table1/tuning/lr.json')
s = json.loads(p.read_text()).get(sys.argv[1], {}) if p.is_file() else {}
print('--lr', s.get('lr', 2e-3), *(['--init-scale', s['init_scale']] if 'init_scale' in s else []))" "$model")
threads=${THREADS:+--threads $THREADS}
run=runs/table1/$model-$budget bundle=runs/table1/$model-$budget.bundle out=results/table1/$model-$budget
train_cmd="isan train $model --out $run --params $budget --data $data $settings --batch-size 32 --bptt 64 --max-chars $max_chars --eval-every 0.5 --patience 4 --max-epochs 100 --no-progress"
# threads change speed only, so they stay out of the recorded command
export_cmd="isan export $run $bundle --overwrite --no-table"
score_cmd="isan score --model $bundle --json --text8-split test $data"
valid_cmd="isan score --model $bundle --json --text8-split valid $data"
$train_cmd $threads
$export_cmd > /dev/null
mkdir -p "$out"
$score_cmd > "$out/score.json.tmp" && mv "$out/score.json.tmp" "$out/score.json"
$valid_cmd > "$out/valid.json.tmp" && mv "$out/valid.json.tmp" "$out/valid.json"
cp "$run/train_log.jsonl" "$out/train_log.jsonl"
cp "$run/config.json" "$out/config.json"
printf '%s\n' "$train_cmd" "$export_cmd" "$score_cmd" "$valid_cmd" > "$out/command.txt"
cat "$out/score.json"
