#!/usr/bin/env bash
# One cell of the Table 1 reproduction: train MODEL within BUDGET parameters on text8-10M with the
# shared protocol, export it, score the test split once with `isan score`, and keep the evidence in
# results/table1/MODEL-BUDGET/ (train_log.jsonl, score.json, valid.json, command.txt).
# Protocol: B=32 streams, T=64, Adam at the model's rate (and the IRNN's identity scale) from the
# tuning step at 8e4 (train/studies/tune.sh, then `python -m isan.train.studies.table1 --tuning results/table1/tuning`
# writes results/table1/tuning/lr.json; a model not tuned there starts from 2e-3), moved to BUDGET as
# 1/d: rate * d(8e4) / d(BUDGET). The rate is halved on a validation plateau; early stopping with
# patience 4 at evaluations every half epoch; MAX_CHARS (default 18e6, two epochs) characters.
# Usage (from the repository root): bash train/studies/table1.sh MODEL BUDGET [MAX_CHARS]
# Environment: THREADS (torch CPU threads), DATA (text8 file), EXTRA (options added to the recorded
# training command: the 1.28e6 RNN is EXTRA="--clip 5.0", from the probes in results/table1/notes).
# A run that was stopped resumes from runs/table1/MODEL-BUDGET when started again.
set -euo pipefail
model=$1 budget=$2 max_chars=${3:-18e6}
data=${DATA:-../shared/data/text8_head/text8_head.txt}
settings=$(python -c "
import json, pathlib, sys
from isan.train.models import build_model
model, budget = sys.argv[1], float(sys.argv[2])
p = pathlib.Path('results/table1/tuning/lr.json')
s = json.loads(p.read_text()).get(model, {}) if p.is_file() else {}
init = {'init_scale': s['init_scale']} if 'init_scale' in s else {}
# the rate tuned at 8e4 moves to this budget as 1/d (Adam on hidden weights, as in muP)
d_tuned, d = (build_model(model, 27, 27, params=b, **init).d for b in (8e4, budget))
lr = s.get('lr', 2e-3) * d_tuned / d
print('--lr', f'{lr:.3g}', *(['--init-scale', s['init_scale']] if init else []))" "$model" "$budget")
threads=${THREADS:+--threads $THREADS}
run=runs/table1/$model-$budget bundle=runs/table1/$model-$budget.bundle out=results/table1/$model-$budget
train_cmd="isan train $model --out $run --params $budget --data $data $settings ${EXTRA:+$EXTRA }--batch-size 32 --bptt 64 --max-chars $max_chars --eval-every 0.5 --patience 4 --max-epochs 100 --no-progress"
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
