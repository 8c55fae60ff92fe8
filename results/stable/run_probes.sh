#!/bin/bash
# The probes of results/stable/README.md (issue 20). Two at a time, one thread each (2 cores).
# Run directories go to $RUNS/<name> (default runs/stable-probes); each train_log.jsonl is copied to
# results/stable/<name>/. Usage (from the repository root): results/stable/run_probes.sh set_a | set_b
set -u
R=${RUNS:-runs/stable-probes}
D=$R/probe_data
mkdir -p $D
# the probes' data: the first 2M and 500k characters of the text8-10M train split, and its valid split
python - "$D" <<'PY'
import sys
from isan.data import read_text8_split
d = sys.argv[1]; text8 = "../shared/data/text8_head/text8_head.txt"
train = read_text8_split(text8, "train")
open(f"{d}/train2M.txt", "w").write(train[:2_000_000])
open(f"{d}/train500k.txt", "w").write(train[:500_000])
open(f"{d}/valid.txt", "w").write(read_text8_split(text8, "valid"))
PY
SMALL="--dataset text --data $D/train2M.txt --valid-data $D/valid.txt"
# set A: the text8-10M split, 6M characters (2/3 of an epoch), cosine schedule
A="--d 216 --max-chars 6e6 --eval-every 0.34 --patience 20 --lr-schedule cosine --threads 1 --no-progress"
# set B (regularisers): the first 2M characters of the text8-10M train split, the text8-10M valid split,
# 3 epochs (6M characters), so that overfitting shows within a probe
B="$SMALL --d 216 --max-chars 6e6 --max-epochs 100 --eval-every 1 --patience 20 --lr-schedule cosine --threads 1 --no-progress"
# set C (regularisers, strong overfitting): the first 500k characters of the train split, 12 epochs
TINY="--dataset text --data $D/train500k.txt --valid-data $D/valid.txt"
C="$TINY --d 216 --max-chars 6e6 --max-epochs 100 --eval-every 1 --patience 20 --lr-schedule cosine --threads 1 --no-progress"
probe() { name=$1; shift; isan train --out $R/$name "$@" > $R/$name.out 2>&1;
          mkdir -p results/stable/$name; cp $R/$name/train_log.jsonl results/stable/$name/; echo "$name $*" >> results/stable/commands.txt; }
# first run, before the projection became singular-value clipping: A_free, and A_r0.98_pi25 (whole-matrix
# rescale by rho / sigma_max, power iteration with exact norms every 25 steps):
#   probe A_free $A & probe A_r0.98_pi25 $A --stable-rho 0.98 --stable-exact-every 25 & wait
set_a() {  # (A_free and A_r0.98_pi25: see above)
  probe A_r0.98 $A --stable-rho 0.98 & probe A_r0.95 $A --stable-rho 0.95 & wait
}
set_a2() {
  probe A_r0.995 $A --stable-rho 0.995 & probe A_r0.98_basis $A --stable-rho 0.98 --stable-basis & wait
}
set_b() {
  probe B_r0.98 $B --stable-rho 0.98 & probe B_r0.98_all $B --stable-rho 0.98 --weight-decay 0.1 --state-dropout 0.2 --ema 0.998 & wait
}
set_c() {
  probe C_r0.98 $C --stable-rho 0.98 & probe C_r0.98_do $C --stable-rho 0.98 --state-dropout 0.2 & wait
  probe C_r0.98_wd $C --stable-rho 0.98 --weight-decay 0.1 & probe C_r0.98_all $C --stable-rho 0.98 --weight-decay 0.1 --state-dropout 0.2 --ema 0.998 & wait
}
"$@"
