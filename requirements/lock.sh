#!/usr/bin/env bash
# Regenerate requirements/ci.txt, the locked test environment that .ci/run and the README's test
# command install with (`pip install -c requirements/ci.txt ...`), after a change of pyproject.toml's
# dependencies: the pins already there are kept. `--upgrade` moves every pin to the newest release
# the ranges allow: do that on purpose, then run the whole suite before committing the new lock.
#   pip install pip-tools && bash requirements/lock.sh [--upgrade]
# The gpu extra is locked too, so `pip install -c requirements/ci.txt ".[gpu]"` takes pinned versions;
# onnxruntime-gpu ships the same `onnxruntime` module as onnxruntime, so the two are pinned to one
# version (the newest that both publish: `--upgrade-package onnxruntime==X` moves them together).
set -euo pipefail
cd "$(dirname "$0")/.."
pip-compile -q "$@" --strip-extras --no-emit-index-url --no-emit-find-links \
    --extra train --extra onnx --extra gpu --extra serve --extra dev --extra plot --extra evalharness --extra docs \
    -c requirements/torch-cpu.in -o requirements/ci.txt pyproject.toml
# The CPU wheel carries a local version label (2.13.0+cpu); pin the public version, which pip
# satisfies with that wheel where it is offered, as `pip install torch==2.13.0` does.
sed -i -E 's/^torch==([0-9.]+)\+cpu$/torch==\1/' requirements/ci.txt
