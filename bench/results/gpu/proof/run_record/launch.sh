#!/bin/sh
# rendered by ktdeploy train from tiny-moe-lora.yaml
set -eu
cd "$(dirname "$0")"
export CUDA_VISIBLE_DEVICES=0
exec accelerate launch --main_process_port 0 --config_file accelerate.yaml -m llamafactory.launcher train.yaml
