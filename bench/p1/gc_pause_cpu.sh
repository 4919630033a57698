#!/usr/bin/env bash
# Issue 18 P1, the mechanism on this machine's CPU: does Python's garbage collector pause a LlamaFactory step in
# ktdeploy's trainer entry point, and does freezing the heap before step 1 remove the pause?
# In the full image (ktsft:amx built here; entrypoint bypassed: no KT, no GPU), a tiny Qwen3-MoE (`ktdeploy
# tiny-model --size small`) is LoRA-trained on the CPU by `python -m ktdeploy.agent.lf_entry` (LlamaFactory's
# run_exp + ktdeploy's callbacks) with KTDEPLOY_GC_FREEZE=0 and =1, alternated; lf_entry's GcClock writes the
# collector's seconds and full collections per step into metrics.jsonl. Writes $OUT/gc_pause_cpu.json.
#   bash bench/p1/gc_pause_cpu.sh            (OUT defaults to bench/results/p1)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-bench/results/p1}"
IMAGE="${IMAGE:-ktsft:amx}"
STEPS="${STEPS:-40}"
ROUNDS="${ROUNDS:-2}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
chmod 777 "$work"
docker run --rm --network none -v "$work:/w" -e STEPS="$STEPS" -e ROUNDS="$ROUNDS" --entrypoint bash "$IMAGE" -c '
set -e
python -m ktdeploy tiny-model /w/model --data-dir /w/data --size small --samples 400 >/w/tiny.log 2>&1
for r in $(seq 1 "$ROUNDS"); do
  for freeze in 0 1; do
    name=r${r}-freeze${freeze}
    cat >/w/$name.yaml <<Y
model_name_or_path: /w/model
stage: sft
do_train: true
finetuning_type: lora
lora_rank: 8
lora_target: all
dataset: tiny_sft
dataset_dir: /w/data
template: qwen3_nothink
cutoff_len: 256
output_dir: /w/out-$name
logging_steps: 1
save_strategy: "no"
report_to: none
per_device_train_batch_size: 2
max_steps: $STEPS
learning_rate: 1.0e-4
use_cpu: true
bf16: false
dataloader_num_workers: 0
preprocessing_num_workers: 1
Y
    KTDEPLOY_GC_FREEZE=$freeze KTDEPLOY_METRICS=/w/$name.metrics.jsonl HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
      python -m ktdeploy.agent.lf_entry /w/$name.yaml >/w/$name.log 2>&1 || { tail -30 /w/$name.log; exit 1; }
  done
done
'
python3 - "$work" "$OUT/gc_pause_cpu.json" "$IMAGE" "$STEPS" <<'PY'
import json, statistics, sys
from pathlib import Path
work, out, image, steps = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
runs = []
for m in sorted(work.glob("*.metrics.jsonl")):
    rows = [json.loads(x) for x in m.read_text().splitlines() if x.strip()]
    head = next((r for r in rows if "gc_frozen" in r), {})
    st = [r for r in rows if "step_s" in r][1:]          # steady: leave out the first step
    gc_s = [r.get("gc_s", 0.0) for r in st]
    step_s = [r["step_s"] for r in st]
    runs.append({"run": m.name.split(".")[0], "gc_frozen": head.get("gc_frozen"),
                 "gc_frozen_objects": head.get("gc_frozen_objects"), "steps": len(st),
                 "full_collections": sum(r.get("gc_full", 0) for r in st),
                 "gc_s_total": round(sum(gc_s), 3), "gc_s_max_step": round(max(gc_s), 3),
                 "gc_share_of_step_time": round(sum(gc_s) / sum(step_s), 4),
                 "step_s_median": round(statistics.median(step_s), 4), "step_s_max": round(max(step_s), 3)})
res = {"command": "bash bench/p1/gc_pause_cpu.sh", "image": image, "steps": steps,
       "what": "tiny Qwen3-MoE LoRA on the CPU through ktdeploy.agent.lf_entry, KTDEPLOY_GC_FREEZE=0 vs 1 "
               "alternated; gc_* from lf_entry's GcClock (gc.callbacks)", "runs": runs}
for key, frozen in (("not_frozen", False), ("frozen", True)):
    sel = [r for r in runs if r["gc_frozen"] is frozen]
    if sel:
        res[f"{key}_gc_s_per_run_median"] = statistics.median(r["gc_s_total"] for r in sel)
        res[f"{key}_full_collections"] = [r["full_collections"] for r in sel]
        res[f"{key}_gc_s_max_step"] = max(r["gc_s_max_step"] for r in sel)
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps(res, indent=2) + "\n")
print(json.dumps(res, indent=2))
PY
