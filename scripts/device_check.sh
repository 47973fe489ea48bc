#!/usr/bin/env bash
# The device check in one step, ON THE GPU NODE (no network; wheels made beforehand by scripts/device_wheels.sh
# and carried in outputs/device_wheels): installs what the node lacks from those wheels, runs `python -m
# graft.gpu_check` and writes $OUT/gpu_check.json, gpu_check.log and report.md (the JSON as Markdown tables;
# OUT defaults to results/gpu).
#
#   bash scripts/device_check.sh [python -m graft.gpu_check arguments, e.g. --parts 1,4]
#
# It ends by itself within 8 minutes (DEADLINE_S): the check gets what the install leaves, less the grace
# below, as its --budget-s (each part has its own budget in graft/gpu_check/plan.py, 390 s in all, and a part
# that would not fit is skipped with the reason); `timeout` sends SIGTERM at the deadline's share, after which
# the check still writes what it has, and report.md is written from whatever JSON there is.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/gpu}
WHEELS=${WHEELS:-outputs/device_wheels}
PYTHON=${PYTHON:-python3}
DEADLINE_S=${DEADLINE_S:-470} # the whole script, install to report.md: 8 minutes less 10 s
GRACE_S=40                    # the check's start-up imports and the part in flight when its budget runs out
KILL_S=10                     # between SIGTERM and SIGKILL
TABLE_S=10                    # kept for writing report.md
mkdir -p "$OUT"

if ! "$PYTHON" -c "import hydra, omegaconf" 2>/dev/null; then
  if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    echo "hydra-core / omegaconf are missing and $WHEELS has no wheels: run scripts/device_wheels.sh where" \
      "pip reaches an index, and carry $WHEELS to the node" >&2
    exit 2
  fi
  # --no-deps: what they need besides each other (PyYAML, packaging, numpy, tqdm) comes with transformers
  if ! "$PYTHON" -m pip install -q --no-index --no-deps --no-cache-dir --find-links "$WHEELS" "$WHEELS"/*.whl; then
    # where that Python's site-packages cannot be written: a folder on PYTHONPATH instead
    "$PYTHON" -m pip install -q --no-index --no-deps --no-cache-dir --target /tmp/graft-site "$WHEELS"/*.whl || exit 2
    export PYTHONPATH=/tmp/graft-site${PYTHONPATH:+:$PYTHONPATH}
  fi
fi
echo "wheels ready after $SECONDS s"

export PYTHONUNBUFFERED=1 WANDB_MODE=disabled HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
limit=$((DEADLINE_S - SECONDS - KILL_S - TABLE_S))
timeout --signal=TERM --kill-after="$KILL_S" "$limit" \
  "$PYTHON" -m graft.gpu_check --out "$OUT/gpu_check.json" --budget-s "$((limit - GRACE_S))" "$@" 2>&1 |
  tee "$OUT/gpu_check.log"
status=${PIPESTATUS[0]}
"$PYTHON" -m graft.gpu_check.markdown "$OUT/gpu_check.json" || status=1
echo "python -m graft.gpu_check exit status $status (124: stopped at $limit s) after $SECONDS s; report in $OUT"
exit "$status"
