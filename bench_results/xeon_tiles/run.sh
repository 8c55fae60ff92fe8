set -e
cd "$(dirname "$0")/../.."
GPU_DIR=.gpu
find "$GPU_DIR/data" -name '*.txt.gz' -exec gzip -dkf {} +
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/isan-site "$GPU_DIR"/whl/marisa_trie*.whl
export PYTHONPATH=/tmp/isan-site${PYTHONPATH:+:$PYTHONPATH}
t0=$(date +%s); python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -3; echo "build $(( $(date +%s) - t0 )) s"
lscpu | grep -E "Model name|^CPU\(s\)|Thread|Core|L1d|L2|L3|Flags" | cut -c1-150
export TEXT8="$PWD/$GPU_DIR/data/text8_head/text8_head.txt" ISAN_SHARED_DATA="$PWD/$GPU_DIR/data"
timeout 420 python3 bench_results/xeon_tiles/xeon.py 2>&1 | grep -v "composing"
