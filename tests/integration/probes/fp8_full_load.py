"""The real stack with real weights (no skeleton): LlamaFactory's get_train_args + load_model on the tiny native-FP8
checkpoint (`ktdeploy tiny-model --format fp8`), on the CPU, without KT. Prints one JSON line per fine-tuning type:
loaded or refused, and the model's quantization_method after loading. Run in the full image by
tests/integration/test_stack_skeleton.py."""

import json
import os
import sys

os.environ["DISABLE_VERSION_CHECK"] = "1"
from llamafactory.hparams import get_train_args  # noqa: E402
from llamafactory.model import load_model, load_tokenizer  # noqa: E402

model_dir, data_dir = sys.argv[1], sys.argv[2]
for ft in ("full", "lora"):
    args = {"model_name_or_path": model_dir, "stage": "sft", "do_train": True, "finetuning_type": ft,
            "lora_target": "all", "dataset": "tiny_sft", "dataset_dir": data_dir, "template": "qwen3",
            "output_dir": f"/tmp/out-{ft}", "use_cpu": True, "report_to": "none"}
    try:
        model_args, _data_args, _training_args, finetuning_args, _ = get_train_args(args)
        tok = load_tokenizer(model_args)["tokenizer"]
        model = load_model(tok, model_args, finetuning_args, is_trainable=True)
        row = {"finetuning_type": ft, "loaded": True,
               "quantization_method": str(getattr(model, "quantization_method", None))}
    except Exception as e:  # noqa: BLE001 - the verdict is the exception
        row = {"finetuning_type": ft, "loaded": False, "error": f"{type(e).__name__}: {e}"[:400]}
    print("PROBE " + json.dumps(row), flush=True)
