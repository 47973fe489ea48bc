#!/usr/bin/env bash
# Run HERE (pip reaches a package index), before a device check: wheels of what the GPU node's image lacks,
# at the versions this checkout's .venv runs, into outputs/device_wheels (ignored by git, so the device run
# must carry it). hydra-core, omegaconf and its parser antlr4-python3-runtime are what `python -m
# graft.gpu_check` needs; gguf comes along for the harness's other entry points. All are pure Python, so they
# install on the node's Python 3.12. wandb stays out: the check never imports it (tests/gpu/test_gpu_check.py runs
# the check with every import outside the node's image and these wheels refused, wandb included).
#
#   bash scripts/device_wheels.sh [DEST]        # DEST defaults to outputs/device_wheels
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
DEST=${1:-outputs/device_wheels}
NODE_PYTHON=3.12
PACKAGES=(hydra-core omegaconf antlr4-python3-runtime gguf)
BUILT_HERE=(antlr4-python3-runtime) # 4.9.x, the one omegaconf 2.3 takes, is published as a source archive only

downloaded=() built=()
for name in "${PACKAGES[@]}"; do
  pin="$name==$("$PYTHON" -c 'import importlib.metadata, sys; print(importlib.metadata.version(sys.argv[1]))' "$name")"
  if [[ " ${BUILT_HERE[*]} " == *" $name "* ]]; then built+=("$pin"); else downloaded+=("$pin"); fi
done
rm -rf "$DEST" && mkdir -p "$DEST" # one version of each package: two would stop the install on the node
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$NODE_PYTHON" --dest "$DEST" \
  "${downloaded[@]}"
"$PYTHON" -m pip wheel --quiet --no-deps --wheel-dir "$DEST" "${built[@]}"

# what the node will do, offline: any Python takes a pure-Python wheel, and --no-index reads DEST alone
if ls "$DEST"/*.whl | grep -v -- '-none-any\.whl$'; then
  echo "the wheels above are not pure Python: the node's Python $NODE_PYTHON may refuse them" >&2
  exit 1
fi
trial=$(mktemp -d)
"$PYTHON" -m pip install --quiet --no-index --no-deps --find-links "$DEST" --target "$trial" "$DEST"/*.whl
rm -rf "$trial"
echo "wheels for ${downloaded[*]} ${built[*]} in $DEST (installs offline); carry $DEST to the device:"
ls -l "$DEST"
