#!/usr/bin/env bash
# One-shot launcher: detect the hardware, plan, write the run directory, train.
# A thin wrapper over `python -m autotune launch`; see --help for every flag.
#   ./launch_distributed_training.sh --config configs/default_config.yaml
#   ./launch_distributed_training.sh --dry-run --hardware 4xL4
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ -n "${AUTOTUNE_PYTHON:-}" ]]; then
  py="$AUTOTUNE_PYTHON"
elif [[ -x "$here/.venv/bin/python" ]]; then
  py="$here/.venv/bin/python"
else
  py="$(command -v python3 || command -v python)"
fi
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
exec "$py" -m autotune launch "$@"
