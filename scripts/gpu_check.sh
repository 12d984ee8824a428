#!/usr/bin/env bash
# AccelPact's device check (README, "The GPU path"): the NCCL path on real GPUs, at most 5 minutes.
# Needs NVIDIA GPUs (2 for steps B-D, 4 adds FSDP2 HSDP) and a Python whose torch is a CUDA build
# and can import this project (make install, or pip install -e .). Exit 0: nothing failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for candidate in .venv/bin/python python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 &&
       "$candidate" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
      PY=$candidate
      break
    fi
  done
fi
if [ -z "$PY" ]; then
  echo "gpu_check: no Python with a CUDA build of torch and a visible GPU (set PYTHON=...)"
  exit 2
fi
if ! "$PY" -c "import transitions" 2>/dev/null; then
  echo "gpu_check: $PY cannot import 'transitions' (a dependency of accelpact): run 'pip install -e .' first"
  exit 2
fi
exec timeout 300 "$PY" scripts/gpu_check.py "$@"
