#!/usr/bin/env bash
# The GPU check: what a GPU gives isan, measured, and its tests, on a bare GPU machine
# that got a copy of this working tree. On an H200 with a 16-core Xeon (bench_results/gpu_h200/) it took 259 s in
# full, 215 s with --no-scaling and 150 s with --gpu-only, the install included.
#
# Such a machine has Python 3.12, a CUDA build of torch, numpy, pytest, hypothesis, safetensors,
# click, tqdm, anyio, httpx, uvloop and gcc, but no package index; isan needs marisa-trie besides,
# corpora zstandard, the server FastAPI and its stack, and the tests and the benchmarks read text8
# from ../shared, which does not travel. So, in two steps:
#
#   bash isan/bench/gpu_check.sh --prepare     # here: those wheels for Python 3.12 and the shared
#                                              # data, gzipped, into .gpu/ (ignored by git, ~16 MB)
#   bash isan/bench/gpu_check.sh               # there, with the .gpu folder copied beside the repository
#   bash isan/bench/gpu_check.sh --no-scaling  # the same without the CPU scaling tables and the probe
#   bash isan/bench/gpu_check.sh --gpu-only    # no scaling tables and no probe
#
# ISAN_GPU_STEPS chooses the runs of `isan bench gpu` (default float32:triton,float64:triton) and
# ISAN_GPU_BENCH_ARGS adds options to it; ISAN_GPU_TESTS the test files (- for none); ISAN_GPU_PROBE=0 leaves the
# probe out, ISAN_GPU_PROBE=last runs it (in any mode) after everything else, alone on the card, for at
# most ISAN_GPU_PROBE_SECONDS (default 600) or until ISAN_GPU_DEADLINE seconds after the check began; ISAN_GPU_CORPUS_MB (default 400; set, it runs in any mode) the corpus's size;
# ISAN_GPU_SCALING (engine,corpus,serve in full; set, in any mode) which scaling tables run, and
# ISAN_GPU_SERVE_SECONDS (default 5) each server load's length.
#
# The check installs the carried wheels and isan itself (--no-deps --no-build-isolation: the C
# kernels compile there), starts the structured ISAN's probe (results/structured/probe.sh: three training runs
# on the GPU, in the background) and runs the tests of the torch backend (those marked gpu run on
# CUDA) meanwhile, then `isan bench gpu --profile` (65,536 documents x 512 characters and the
# 12.5M-character text8 head, float32 and float64, against the CPU's compiled kernels on all cores:
# end to end, steps only, the step's kernel alone, and where one call's time goes on the device and
# on the host), then the 16-core scaling tables: `isan bench engine --threads` (with the fraction of
# the FMA peak), `isan bench corpus --workers` and `isan bench serve --workers 1,2,4,8`. Results go
# to $OUT (a folder you name) or .gpu/out: commit them under bench_results/ with the
# machine named.
set -euo pipefail
cd "$(dirname "$0")/../.."
GPU_DIR=.gpu
DATA_SRC=${ISAN_SHARED_DATA:-../shared/data}

if [ "${1:-}" = "--prepare" ]; then
    mkdir -p "$GPU_DIR/whl" "$GPU_DIR/data/text8_head" "$GPU_DIR/data/tinyshakespeare" "$GPU_DIR/data/wikitext2"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$GPU_DIR/whl" $(python3 - <<'PY'
import importlib.metadata as m
# what isan needs beyond that machine's image: marisa-trie (the core), zstandard (corpora), and the
# server's stack for `isan bench serve` (its image has anyio, h11, httpx, uvloop, prometheus-client)
names = ["marisa-trie", "zstandard", "fastapi", "starlette", "pydantic", "pydantic_core", "annotated-types",
         "typing-inspection", "uvicorn", "websockets", "httptools", "orjson", "platformdirs"]
print(" ".join(f"{n}=={m.version(n)}" for n in names))
PY
)
    cp "$DATA_SRC/text8_head/text8_head.txt" "$GPU_DIR/data/text8_head/"
    cp "$DATA_SRC/tinyshakespeare/input.txt" "$GPU_DIR/data/tinyshakespeare/"
    cp "$DATA_SRC/wikitext2/"*.txt "$GPU_DIR/data/wikitext2/"
    # gzip makes the copy a third of the bytes (keep the repository and .gpu under 64 MiB to copy)
    find "$GPU_DIR/data" -name '*.txt' -exec gzip -9f {} +
    du -sh "$GPU_DIR"
    exit 0
fi

OUT_DIR=${OUT:-$GPU_DIR/out}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1 ISAN_SHARED_DATA="$PWD/$GPU_DIR/data"
[ -d "$GPU_DIR/whl" ] || { echo "no $GPU_DIR/whl: run 'bash isan/bench/gpu_check.sh --prepare' first and carry $GPU_DIR" >&2; exit 2; }
find "$GPU_DIR/data" -name '*.txt.gz' -exec gzip -dkf {} +
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/isan-site "$GPU_DIR"/whl/*.whl
export PYTHONPATH=/tmp/isan-site${PYTHONPATH:+:$PYTHONPATH}
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -3
python3 - <<'EOF'
import torch
from isan.engine.kernels import native_status
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, GPU: "
      f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'}; isan kernels {native_status()}")
EOF
TEXT8="$GPU_DIR/data/text8_head/text8_head.txt"
ISAN="python3 -m isan.cli"  # the console script may land outside PATH there
nvidia-smi -L 2>/dev/null || true
# each step runs whatever the one before gave (a device run is scarce); the status of each is said at the end
status=()
# each step under a time limit (seconds), so that a slow one cannot take the steps after it with it
step() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
         if timeout "$limit" "$@"; then status+=("$name: ok ($((SECONDS - t0)) s)")
         else status+=("$name: FAILED ($? after $((SECONDS - t0)) s; 124 = over its ${limit} s)"); fi; }
MODE=${1:-}
MARK="-m gpu"  # the tests' CPU halves run in CI; here the ones marked gpu, on CUDA
# issue #48's probe (results/structured/probe.sh): three training runs at once on the GPU (each leaves
# most of it idle), in the background while the tests run; waited for before the benchmarks
PROBE_PID=""
if [ "$MODE" = "" ] && [ "${ISAN_GPU_PROBE:-1}" = 1 ] && [ -f results/structured/probe.sh ]; then
    ( RUNS=/tmp/isan-probe DEVICE=cuda PARALLEL=1 timeout 420 bash results/structured/probe.sh \
        > "$OUT_DIR/probe.log" 2>&1; echo "probe exit $?" >> "$OUT_DIR/probe.log" ) &
    PROBE_PID=$!
fi
TESTS=${ISAN_GPU_TESTS:-tests/test_torch_backend.py tests/test_torch_engine.py tests/test_torch_determinism.py tests/test_backends.py tests/test_gpu_pipeline.py tests/test_scan_dense.py}
[ "$TESTS" = - ] || step tests 150 bash -c "python3 -m pytest -q -p no:cacheprovider -rs $MARK $TESTS 2>&1 | tee '$OUT_DIR/gpu_tests.log' | tail -15; exit \${PIPESTATUS[0]}"
if [ -n "$PROBE_PID" ]; then
    t0=$SECONDS; wait "$PROBE_PID" || true
    status+=("probe: $(tail -1 "$OUT_DIR/probe.log") (waited $((SECONDS - t0)) s after the tests)")
    python3 results/structured/table.py /tmp/isan-probe >> "$OUT_DIR/probe.log" 2>&1 || true
    tar -czf "$OUT_DIR/probe_runs.tar.gz" -C /tmp/isan-probe --exclude='*.safetensors' --exclude='*.pt' . 2>/dev/null || true
fi
STEPS_ARG=${ISAN_GPU_STEPS:-float32:triton,float64:triton}
step "bench gpu" 300 bash -c "$ISAN bench gpu --data '$TEXT8' --profile --steps $STEPS_ARG ${ISAN_GPU_BENCH_ARGS:-} --out '$OUT_DIR/gpu.json' 2>&1 | tee -a '$OUT_DIR/check.log'; exit \${PIPESTATUS[0]}"
step "bench host" 150 bash -c "$ISAN bench host --device cuda --data '$TEXT8' --out '$OUT_DIR/host.json' 2>&1 | tee -a '$OUT_DIR/check.log'; exit \${PIPESTATUS[0]}"
if [ "$MODE" = "" ] || [ -n "${ISAN_GPU_CORPUS_MB:-}" ]; then  # issue #47 part 3: a JSONL (zstd) corpus, one GPU process
step "corpus gpu" 200 bash -c "bash isan/bench/gpu_corpus.sh '$GPU_DIR/data' ${ISAN_GPU_CORPUS_MB:-400} '$OUT_DIR' 2>&1 | tee -a '$OUT_DIR/check.log'; exit \${PIPESTATUS[0]}"
fi
SCALING=${ISAN_GPU_SCALING:-}
if [ "$MODE" = "" ] && [ -z "$SCALING" ]; then SCALING=engine,corpus,serve; fi
if [ -n "$SCALING" ]; then
CORES=$(nproc)
COUNTS=$(python3 -c "n=$CORES; c=[1]; [c.append(c[-1]*2) for _ in range(8) if c[-1]*2<=n]; print(','.join(map(str,c+([n] if c[-1]!=n else []))))")
if [[ ,$SCALING, == *,engine,* ]]; then
    step "engine scaling" 150 bash -c "$ISAN bench engine --data '$TEXT8' --repeats 1 --no-peers --no-progress --threads $COUNTS --out '$OUT_DIR/scaling_engine.json' 2>&1 | tee -a '$OUT_DIR/check.log'; exit \${PIPESTATUS[0]}"
fi
if [[ ,$SCALING, == *,corpus,* ]]; then
    step "corpus scaling" 100 bash -c "$ISAN bench corpus --data-dir '$GPU_DIR/data' --mb 20 --no-ray --workers $COUNTS --out '$OUT_DIR/scaling_corpus.json' 2>&1 | tee -a '$OUT_DIR/check.log'; exit \${PIPESTATUS[0]}"
fi
if [[ ,$SCALING, == *,serve,* ]]; then
    step "serve scaling" 100 bash -c "$ISAN bench serve --data '$TEXT8' --only http --duration ${ISAN_GPU_SERVE_SECONDS:-5} --workers 1,2,4,8 --out '$OUT_DIR/scaling_serve.json' 2>&1 | tee -a '$OUT_DIR/check.log'; exit \${PIPESTATUS[0]}"
fi
fi
if [ "${ISAN_GPU_PROBE:-}" = last ] && [ -f results/structured/probe.sh ]; then
    # the probe alone on the GPU after the measurements (none of them shares the card with it); its
    # training logs are copied to $OUT_DIR as they grow, so that a run cut short still brings them back
    copy_probe_logs() { for f in /tmp/isan-probe/*/train_log.jsonl; do
                            [ -f "$f" ] && cp "$f" "$OUT_DIR/probe_$(basename "$(dirname "$f")").jsonl"; done; return 0; }
    ( while sleep 10; do copy_probe_logs; done ) &
    COPIER=$!
    LIMIT=${ISAN_GPU_PROBE_SECONDS:-600}  # or until ISAN_GPU_DEADLINE seconds after the check began
    if [ -n "${ISAN_GPU_DEADLINE:-}" ] && [ $((ISAN_GPU_DEADLINE - SECONDS)) -lt "$LIMIT" ]; then LIMIT=$((ISAN_GPU_DEADLINE - SECONDS)); fi
    [ "$LIMIT" -ge 10 ] || LIMIT=10  # timeout 0 would mean no limit
    step probe "$LIMIT" bash -c "RUNS=/tmp/isan-probe DEVICE=cuda PARALLEL=1 THREADS=4 bash results/structured/probe.sh 2>&1 | tail -20 | tee -a '$OUT_DIR/check.log'"
    kill "$COPIER" 2>/dev/null || true
    copy_probe_logs
fi
printf "%s\n" "${status[@]}" | tee -a "$OUT_DIR/check.log"
echo "results in $OUT_DIR"
