#!/usr/bin/env bash
# Export the token-alphabet runs of train/studies/token_runs.sh and score them (issue #14):
#   byte models: Tiny Shakespeare's last 10% (the validation part, as `isan train --dataset text` cuts it)
#                and WikiText-2's test file (out of domain: no training data from there);
#   pair models: the text8-10M test split.
# Writes results/tokens/RUN/score_*.json (the `isan score --json` answers, normalisation reports
# dropped) and prints a Markdown table. Usage (from the repository root): bash train/studies/token_eval.sh
set -euo pipefail
ts=../shared/data/tinyshakespeare/input.txt
wt=../shared/data/wikitext2/test.txt
text8=../shared/data/text8_head/text8_head.txt
score() {  # RUN NAME ARGS...: score the run's bundle, keep the answer
  local run=$1 name=$2; shift 2
  isan score --model runs/tokens/bundles/$run --json "$@" \
    | python -c "import json,sys; d=json.load(sys.stdin); d.pop('normalization', None); print(json.dumps(d))" \
    > results/tokens/$run/score_$name.json
}
for run in bytes-isan bytes-lstm pairs-isan pairs-lstm; do
  isan export runs/tokens/$run runs/tokens/bundles/$run --overwrite --no-table > /dev/null
  case $run in
    bytes-*) score $run valid --text-split valid $ts; score $run wikitext2_test $wt ;;
    pairs-*) score $run text8_test --text8-split test $text8 ;;
  esac
done
python - <<'PY'
import json, pathlib
rows = ["| run | scored text | tokens | bits per token | bits per character | NNL |", "|---|---|---:|---:|---:|---:|"]
for f in sorted(pathlib.Path("results/tokens").glob("*/score_*.json")):
    d = json.loads(f.read_text())
    rows.append(f"| {f.parent.name} | {f.stem[6:]} | {d['tokens']:,} | {d['bits_per_token']:.4f} | {d['bpc']:.4f} | {d['nnl']:.4f} |")
print("\n".join(rows))
PY
