#!/usr/bin/env bash
# Issue #47 part 3, run by gpu_check.sh: a JSONL corpus (zstd) of MB megabytes made from the shared
# data (isan.bench.corpus.make_corpus, 16 files), scored by `isan corpus score --device cuda` (one
# process drives the GPU), timed (wall clock); its summary.json goes to OUT_DIR.
# usage: gpu_corpus.sh DATA_DIR MB OUT_DIR
set -uo pipefail
DATA=$1; MB=$2; OUT_DIR=$3
WORK=/tmp/isan-corpus-gpu; rm -rf "$WORK/out"; mkdir -p "$WORK/zst"
python3 - "$DATA" "$MB" "$WORK" <<'PY' || exit 1
import sys, time
from pathlib import Path
import zstandard
from isan.bench.corpus import make_corpus
t0 = time.perf_counter()
work = Path(sys.argv[3])
src = make_corpus(sys.argv[1], float(sys.argv[2]), files=16, cache=work / "cache")
for f in sorted(src.glob("*.jsonl")):
    (work / "zst" / (f.name + ".zst")).write_bytes(zstandard.ZstdCompressor(level=3, threads=-1).compress(f.read_bytes()))
jsonl = sum(f.stat().st_size for f in src.glob("*.jsonl")) / 1e6
zst = sum(f.stat().st_size for f in (work / "zst").glob("*.zst")) / 1e6
print(f"corpus: {jsonl:,.0f} MB of JSONL in 16 files, {zst:,.0f} MB zstd, made in {time.perf_counter() - t0:.0f} s")
PY
t0=$(date +%s.%N)
python3 -m isan.cli corpus score "$WORK/zst" --out "$WORK/out" --device "${DEVICE:-cuda}" --no-progress --json \
    > "$OUT_DIR/corpus_gpu_summary.json"
rc=$?
t1=$(date +%s.%N)
python3 -c "import json, sys; s = json.load(open(sys.argv[1])); sec = float(sys.argv[3]) - float(sys.argv[2]); \
print({k: v for k, v in s.items() if not isinstance(v, (dict, list))}); print('this run:', s.get('this_run')); \
print(f'isan corpus score --device ${DEVICE:-cuda}: {sec:.1f} s wall, {s[\"chars_scored\"] / sec:,.0f} chars/s, '
      f'{s[\"chars_read\"] / sec / 1e6:.1f} MB/s of text read')" "$OUT_DIR/corpus_gpu_summary.json" "$t0" "$t1" || true
exit $rc
