#!/usr/bin/env bash
# lm-evaluation-harness through isan-serve (docs/guide/server.md, "lm-evaluation-harness"): the two tasks of
# tests/evalharness on the first 20 Tiny Shakespeare paragraphs, against a real isan-serve on localhost,
# for the default model and the previous one. Writes results/scoring/evalharness.MODEL.json: the harness's
# own results (bits_per_byte, byte and word perplexity, last-word accuracy) and the command.
# Needs the evalharness extra (lm-eval). Usage, from the repository root: bash results/scoring/evalharness.sh
set -euo pipefail
out=results/scoring
tmp=$(mktemp -d)
server=""
trap '[ -n "$server" ] && kill "$server" 2>/dev/null; rm -rf "$tmp"' EXIT
for model in text8-d216-distil text8-d216-stable; do
  port=$(python -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
  ISAN_NUM_THREADS=1 isan-serve --host 127.0.0.1 --port "$port" --model "isan/models/$model" > "$tmp/serve.log" 2>&1 &
  server=$!
  for _ in $(seq 120); do
    curl -sf "http://127.0.0.1:$port/healthz" 2>/dev/null | grep -q '"ready"' && break
    sleep 1
  done
  cmd=(lm_eval --model local-completions
       --model_args "model=$model,base_url=http://127.0.0.1:$port/v1/completions,max_length=1000000"
       --include_path tests/evalharness --tasks isan_shakespeare_rolling,isan_shakespeare_lastword --limit 20
       --output_path "$tmp/$model")
  HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 HF_HOME="$tmp/hf" OPENAI_API_KEY=none "${cmd[@]}" > "$tmp/$model.log" 2>&1 \
    || { tail -30 "$tmp/$model.log"; exit 1; }
  kill "$server"; wait "$server" 2>/dev/null || true; server=""
  MODEL=$model TMP=$tmp OUT=$out CMD="${cmd[*]}" python - <<'PY'
import json, os, pathlib
model, tmp = os.environ["MODEL"], pathlib.Path(os.environ["TMP"])
res = json.loads(next((tmp / model).rglob("results_*.json")).read_text())
cmd = os.environ["CMD"].replace(str(tmp / model), "OUT").split("base_url=http://127.0.0.1:")
cmd = cmd[0] + "base_url=http://127.0.0.1:PORT" + cmd[1][cmd[1].index("/v1/"):]
out = {"model": model, "limit": 20,
       "command": f"isan-serve --port PORT --model isan/models/{model} & then " + cmd,
       "lm_eval_version": res.get("lm_eval_version"),
       "results": res["results"], "n-samples": res.get("n-samples")}
path = pathlib.Path(os.environ["OUT"]) / f"evalharness.{model}.json"
path.write_text(json.dumps(out, indent=2) + "\n")
r = res["results"]
print(path, "bits_per_byte", r["isan_shakespeare_rolling"]["bits_per_byte,none"],
      "acc", r["isan_shakespeare_lastword"]["acc,none"])
PY
done
