#!/usr/bin/env bash
# The structured ISANs' probe (results/structured/README.md). Three ISANs of equal cost (52,488 / 52,224 / 52,224 multiply-adds a character),
# trained with the same recipe and seed on text8-10M for the same budget of characters:
#   dense  d = 216            (the default's shape; its recipe without the certificate and the teacher)
#   dplr   d = 384, r = 54    W[x] = diag(a[x]) + U[x] V[x]^T
#   dplr   d = 512, r = 37
# Run from the repository root:  DEVICE=cuda RUNS=/path/to/runs bash results/structured/probe.sh
# Environment: DEVICE (cpu | cuda; default cpu), RUNS (run directories; default runs/structured),
# MAX_CHARS (default 45e6), DATA (default $ISAN_SHARED_DATA/text8_head/text8_head.txt, ISAN_SHARED_DATA
# defaulting to ../shared/data), THREADS (CPU threads, default: torch's), ONLY (a space-separated subset of:
# dense216 dplr384r54 dplr512r37), PARALLEL=1 (the runs at once instead of one after another: each one's
# chars/s is then not its own), PYTHON (default python3; isan runs as `$PYTHON -m isan.cli`).
# Each run's log (stdout and stderr) is kept beside its run directory as RUNS/NAME.log; a run directory that
# exists is resumed (the loop's checkpoints). At the end the table: python results/structured/table.py RUNS.
set -euo pipefail
DEVICE=${DEVICE:-cpu}
RUNS=${RUNS:-runs/structured}
MAX_CHARS=${MAX_CHARS:-45e6}
DATA=${DATA:-${ISAN_SHARED_DATA:-../shared/data}/text8_head/text8_head.txt}
PYTHON=${PYTHON:-python3}
PARALLEL=${PARALLEL:-0}
ONLY=${ONLY:-"dense216 dplr384r54 dplr512r37"}
mkdir -p "$RUNS"
# the default's plain recipe (results/distil/README.md) without --stable-rho and --teacher; batch 256,
# bptt 64, lr 2e-3 are the CLI's defaults
RECIPE=(--data "$DATA" --dataset text8 --seed 0 --device "$DEVICE" --weight-decay 0.1 --state-dropout 0.2
        --ema 0.998 --lr-schedule cosine --max-chars "$MAX_CHARS" --max-epochs 100 --eval-every 0.5
        --patience 1000 --no-progress)
if [ -n "${THREADS:-}" ]; then RECIPE+=(--threads "$THREADS"); fi
declare -A SHAPE=(
  [dense216]="--d 216"
  [dplr384r54]="--d 384 --structure dplr --rank 54"
  [dplr512r37]="--d 512 --structure dplr --rank 37"
)
one() {  # one model: its run, its log, its wall time
  local name=$1 start
  echo "== $name: isan train --out $RUNS/$name ${SHAPE[$name]} ${RECIPE[*]}" >> "$RUNS/$name.log"
  start=$(date +%s)
  # shellcheck disable=SC2086
  "$PYTHON" -m isan.cli train --out "$RUNS/$name" ${SHAPE[$name]} "${RECIPE[@]}" >> "$RUNS/$name.log" 2>&1 \
    || echo "== $name: isan train failed (exit $?)" >> "$RUNS/$name.log"
  echo "== $name: $(( $(date +%s) - start )) s wall" >> "$RUNS/$name.log"
  tail -n 2 "$RUNS/$name.log"
}
for name in $ONLY; do
  [ -n "${SHAPE[$name]:-}" ] || { echo "unknown model $name (choose from ${!SHAPE[*]})" >&2; exit 2; }
done
pids=()
for name in $ONLY; do
  if [ "$PARALLEL" = 1 ]; then one "$name" & pids+=($!); else one "$name"; fi
done
for pid in "${pids[@]}"; do wait "$pid"; done
"$PYTHON" "$(dirname "$0")/table.py" "$RUNS"
