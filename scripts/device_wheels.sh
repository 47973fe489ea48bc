#!/usr/bin/env bash
# Run HERE (with network), before a device check: wheels of the harness's dependencies that the GPU node
# lacks (hydra-core, omegaconf and antlr4-python3-runtime; the rest is in its image), at the versions this
# checkout's .venv runs, into shared/wheels. A checkout's shared/ folder travels with the working tree to the
# device machine, where scripts/device_check.sh installs them with pip --no-index.
#
#   bash scripts/device_wheels.sh [DEST]        # DEST defaults to shared/wheels
#
# antlr4-python3-runtime 4.9.x is published as a source archive only: `pip wheel` builds it here. All three are
# pure Python, so the wheels install on the node's Python 3.12 as well.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
DEST=${1:-shared/wheels}
PACKAGES=(hydra-core omegaconf antlr4-python3-runtime)

pins=()
for name in "${PACKAGES[@]}"; do
  version=$("$PYTHON" -c 'import importlib.metadata, sys; print(importlib.metadata.version(sys.argv[1]))' "$name")
  pins+=("$name==$version")
done
mkdir -p "$DEST"
rm -f "$DEST"/*.whl  # one version of each package: two would stop the install on the node
"$PYTHON" -m pip wheel --quiet --no-deps --wheel-dir "$DEST" "${pins[@]}"

# Keep the wheels out of commits; shared/ travels to the device whether git ignores it or not.
if exclude=$(git rev-parse --git-path info/exclude 2>/dev/null); then
  mkdir -p "$(dirname "$exclude")"
  grep -qxF "/$DEST/" "$exclude" 2>/dev/null || echo "/$DEST/" >>"$exclude"
fi
echo "wheels for ${pins[*]} in $DEST:"
ls -l "$DEST"
