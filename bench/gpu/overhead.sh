#!/bin/bash
# P1 on the GPU machine: `ktdeploy train` vs a hand launch, interleaved, one device call:
#   device tool: run(command="bash bench/gpu/overhead.sh", carry=["bench/gpu/.carry"], timeout_s=580)
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OUT="${OUT:-/tmp/ktdeploy-gpu-out}"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec python3 bench/gpu/overhead.py
