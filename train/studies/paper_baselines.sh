#!/usr/bin/env bash
# The models behind Figure 1b of `isan analyze` (PCA spectrum of hidden states), retrained by the
# committed Table 1 commands of the 3.2e5 cells (results/table1/{rnn,gru,isan}-3.2e5/command.txt: same
# model, budget, rate, B=32, T=64, 18M characters, seed 0), then exported as small bundles (about
# 1.3 MB each, no table) into results/paper/models/CELL/ with their training logs and test scores.
# The 3.2e5 cells, not the 1.28e6 ones: the 1.28e6 RNN and GRU cells are training failures (README,
# Baselines and Table 1), the 3.2e5 ones trained normally, and their bundles stay small enough to commit.
# Usage (from the repository root): bash train/studies/paper_baselines.sh [CELL ...]   (default: all three)
# Environment: THREADS (torch CPU threads), DATA (text8 file). A stopped run resumes when started again.
set -euo pipefail
data=${DATA:-../shared/data/text8_head/text8_head.txt}
threads=${THREADS:+--threads $THREADS}
cells=("$@")
[ ${#cells[@]} -eq 0 ] && cells=(rnn-3.2e5 gru-3.2e5 isan-3.2e5)
for cell in "${cells[@]}"; do
  src=results/table1/$cell/command.txt
  [ -f "$src" ] || { echo "no committed command for $cell ($src)" >&2; exit 2; }
  run=runs/paper/$cell out=results/paper/models/$cell
  # the committed training command, with its run directory moved to runs/paper/
  train_cmd=$(head -n 1 "$src" | sed "s#--out runs/table1/$cell #--out $run #; s#--data [^ ]* #--data $data #")
  export_cmd="isan export $run $out --overwrite --no-table"
  score_cmd="isan score --model $out --json --text8-split test $data"
  echo "== $cell: $train_cmd" >&2
  $train_cmd $threads
  $export_cmd > /dev/null
  $score_cmd > "runs/paper/$cell.score.json"
  printf '%s\n' "$train_cmd" "$export_cmd" "$score_cmd" > "runs/paper/$cell.command.txt"
  mkdir -p results/paper/models
  cp "runs/paper/$cell.score.json" "results/paper/models/$cell.score.json"
  cp "runs/paper/$cell.command.txt" "results/paper/models/$cell.command.txt"
  cat "results/paper/models/$cell.score.json"
done
