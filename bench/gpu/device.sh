#!/bin/bash
# One-command GPU proof, run on the GPU machine from a clean checkout plus the carried wheels:
#   device tool: run(command="bash bench/gpu/device.sh full", carry=["bench/gpu/.carry"])
# Prepare the carry here first: python bench/gpu/fetch_wheels.py   (-> bench/gpu/.carry/wheels, ~33 MiB)
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OUT="${OUT:-/tmp/ktdeploy-gpu-out}"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mode="${1:-full}"
case "$mode" in   # smoke lives in gpu_bench.py; full and repeat in full_runs.py, which imports gpu_bench
  full|repeat) exec python3 bench/gpu/full_runs.py "$mode" --out "$OUT" ${2:+--budget "$2"} ;;
  formats) exec python3 bench/gpu/formats.py "$mode" --out "$OUT" ${2:+--budget "$2"} ;;
  eval) exec python3 bench/gpu/eval_proof.py --out "$OUT" ;;   # issue 43: carry made with fetch_wheels.py --eval
  *) exec python3 bench/gpu/gpu_bench.py "$mode" --out "$OUT" ${2:+--budget "$2"} ;;
esac
