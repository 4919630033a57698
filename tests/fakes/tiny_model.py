"""TEST DOUBLE of the folder `ktdeploy tiny-model` writes (tests/fakes/tiny_model/SOURCE.md): its real small files
(config.json, tokenizer_config.json, ...), a tokenizer.json stand-in and a sparse model.safetensors of the real
size, so doctor's model.* checks see what they would see on a host where the tiny model was built. The fake
trainer never loads weights; nothing here is a model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

HERE = Path(__file__).with_name("tiny_model")
WEIGHTS_BYTES = 65_114_296        # model.safetensors of the real build (SOURCE.md)
SMALL_FILES = ("config.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja")


def write_tiny_model(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in SMALL_FILES:
        shutil.copy(HERE / name, folder / name)
    (folder / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {}}}))
    with open(folder / "model.safetensors", "wb") as f:
        f.truncate(WEIGHTS_BYTES)     # sparse: the size the host reports, no 65 MB written
    return folder
