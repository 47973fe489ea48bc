#!/usr/bin/env bash
# Run ON THE GPU NODE (no network at all): install the wheels that travelled in shared/wheels (made here by
# scripts/device_wheels.sh) where hydra-core / omegaconf are missing, then the device check, writing
# $OUT/gpu_check.json and $OUT/gpu_check.log.
#
#   bash scripts/device_check.sh [python -m graft.gpu_check arguments, e.g. --parts 1,4]
#
# It ends itself inside 8 minutes: the check skips parts that would start after --budget-s (420 s), and
# `timeout` stops it at LIMIT_S (480 s) with SIGTERM, after which it still writes what it has.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-outputs/device_check}
WHEELS=${WHEELS:-shared/wheels}
PYTHON=${PYTHON:-python3}
LIMIT_S=${LIMIT_S:-480}
mkdir -p "$OUT"

if ! "$PYTHON" -c "import hydra, omegaconf" 2>/dev/null; then
  if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    echo "hydra-core / omegaconf are missing and $WHEELS has no wheels: run scripts/device_wheels.sh where" \
      "there is network, then send the working tree again" >&2
    exit 2
  fi
  # into the node's own Python, from the carried wheels only (its other needs, PyYAML and packaging, are there)
  if ! "$PYTHON" -m pip install -q --no-index --no-cache-dir --find-links "$WHEELS" "$WHEELS"/*.whl; then
    # where that Python's site-packages cannot be written: a folder on PYTHONPATH instead
    "$PYTHON" -m pip install -q --no-index --no-deps --no-cache-dir --target /tmp/graft-site "$WHEELS"/*.whl || exit 2
    export PYTHONPATH=/tmp/graft-site${PYTHONPATH:+:$PYTHONPATH}
  fi
fi

export PYTHONUNBUFFERED=1 WANDB_MODE=disabled HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
timeout --signal=TERM --kill-after=30 "$LIMIT_S" \
  "$PYTHON" -m graft.gpu_check --out "$OUT/gpu_check.json" "$@" 2>&1 | tee "$OUT/gpu_check.log"
status=${PIPESTATUS[0]}
echo "python -m graft.gpu_check exit status $status (124: stopped at LIMIT_S=$LIMIT_S s); report in $OUT/gpu_check.json"
exit "$status"
