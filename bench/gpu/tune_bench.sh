#!/bin/bash
# ktdeploy tune vs all-cores vs a manual sweep, one device call:
#   device tool: run(command="bash bench/gpu/tune_bench.sh", carry=["bench/gpu/.carry"])
# Prepare the carry here first: python bench/gpu/fetch_wheels.py
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OUT="${OUT:-/tmp/ktdeploy-tune-out}"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec python3 bench/gpu/tune_bench.py
