"""Build a tiny random Qwen3-MoE model, a byte-level BPE tokenizer and a synthetic SFT dataset locally.

Used to prove the whole KT path (train -> convert -> check) on a small machine with no hub access.
Needs torch, transformers and tokenizers (the image / GPU machine has them); they are imported
inside the functions so the controller, which never installs torch, can still import this module.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from ktdeploy.core.errors import UsageError
from ktdeploy.core.safeio import MAX_JSON, load_json, staging_dir, write_file

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
DATASET_NAME = "tiny_sft"
FORMATS = ("bf16", "fp8")
# Long samples (~200-450 tokens): a step then holds enough tokens for the CPU experts to dominate it.
LONG_DATASET_NAME = "tiny_sft_long"


@dataclass(frozen=True)
class TinySize:
    """Shape of a tiny Qwen3-MoE (every layer sparse, no shared expert, like Qwen3-30B-A3B)."""

    hidden_size: int
    num_hidden_layers: int
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    head_dim: int = 64
    vocab_size: int = 4096

    def config_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
            intermediate_size=self.moe_intermediate_size * 4, decoder_sparse_step=1, mlp_only_layers=[],
            norm_topk_prob=True, max_position_embeddings=4096, rms_norm_eps=1e-6, hidden_act="silu",
            tie_word_embeddings=False,
        )
        return d


# small: the model of the first end-to-end run; medium: CPU expert compute dominates a step;
# large: a third point for the planner's memory model.
SIZES: dict[str, TinySize] = {
    "small": TinySize(512, 4, 16, 4, 256),
    "medium": TinySize(1024, 8, 64, 8, 512),
    "large": TinySize(1536, 12, 64, 8, 768, num_attention_heads=12),
}


@dataclass
class TinyResult:
    model_dir: str
    data_dir: str
    size: str
    format: str = "bf16"
    config: dict[str, Any] = field(default_factory=dict)
    num_samples: int = 0
    heldout: str = ""


_WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "  # noqa: SIM905 (one string reads best)
          "quebec romeo sierra tango uniform victor whiskey xray yankee zulu red green blue amber violet "
          "north south east west river stone cloud ember frost maple cedar").split()


def _sample(rng: random.Random, lo: int = 3, hi: int = 12) -> dict[str, Any]:
    """One instruction/answer pair from a few deterministic tasks, so the loss has something to learn."""
    words = [rng.choice(_WORDS) for _ in range(rng.randint(lo, hi))]
    task = rng.randrange(4)
    text = " ".join(words)
    if task == 0:
        return {"instruction": f"Reverse the words: {text}", "input": "", "output": " ".join(reversed(words))}
    if task == 1:
        return {"instruction": f"Uppercase: {text}", "input": "", "output": text.upper()}
    if task == 2:
        return {"instruction": f"Count the words: {text}", "input": "", "output": str(len(words))}
    return {"instruction": f"Sort the words: {text}", "input": "", "output": " ".join(sorted(words))}


DATASET_FILES = (f"{DATASET_NAME}.json", f"{LONG_DATASET_NAME}.json", "heldout_prompts.json")


def _dataset_info(data_dir: Path) -> dict[str, Any]:
    """The folder's dataset_info.json (LlamaFactory's registry, which the tiny datasets are added to), or {}."""
    info_path = data_dir / "dataset_info.json"
    if not info_path.exists() and not info_path.is_symlink():
        return {}
    info = load_json(info_path, MAX_JSON, "dataset_info.json")
    if not isinstance(info, dict):
        raise UsageError(f"{info_path}: not a JSON object", fix="fix or remove dataset_info.json, or choose another --data")
    return info


def check_dataset_target(data_dir: Path, overwrite: bool) -> dict[str, Any]:
    """Before anything is built: the dataset files are new (or --overwrite) and dataset_info.json is readable;
    returns that registry (or {})."""
    for name in DATASET_FILES + ("dataset_info.json",):
        p = data_dir / name
        if p.is_symlink():
            raise UsageError(f"{p} is a symbolic link; ktdeploy never writes through a link",
                             fix="remove the link or choose another --data folder")
    present = [n for n in DATASET_FILES if (data_dir / n).exists()]
    if present and not overwrite:
        raise UsageError(f"{data_dir} already holds {', '.join(present)}",
                         fix="choose another --data folder or pass --overwrite")
    return _dataset_info(data_dir)


def build_dataset(data_dir: Path, num_samples: int, seed: int = 0, heldout: int = 8, overwrite: bool = False) -> Path:
    """Write ``tiny_sft.json`` (alpaca format), its ``dataset_info.json`` entry and held-out prompts."""
    data_dir = Path(data_dir)
    info = check_dataset_target(data_dir, overwrite)
    rng = random.Random(seed)
    rows = [_sample(rng) for _ in range(num_samples)]
    write_file(data_dir, f"{DATASET_NAME}.json", json.dumps(rows, indent=1), overwrite=overwrite)
    long_rows = [_sample(rng, 90, 200) for _ in range(num_samples)]
    write_file(data_dir, f"{LONG_DATASET_NAME}.json", json.dumps(long_rows, indent=1), overwrite=overwrite)
    info[DATASET_NAME] = {"file_name": f"{DATASET_NAME}.json"}
    info[LONG_DATASET_NAME] = {"file_name": f"{LONG_DATASET_NAME}.json"}
    write_file(data_dir, "dataset_info.json", json.dumps(info, indent=2), overwrite=True)  # a registry: entries added
    held = [_sample(random.Random(10_000 + seed + i)) for i in range(heldout)]
    return write_file(data_dir, "heldout_prompts.json", json.dumps([h["instruction"] for h in held], indent=1),
                      overwrite=overwrite)


def _corpus(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        s = _sample(rng)
        lines.append(f"<|im_start|>user\n{s['instruction']}<|im_end|>\n<|im_start|>assistant\n{s['output']}<|im_end|>\n")
    return lines


def build_tokenizer(model_dir: Path, vocab_size: int, seed: int = 0) -> Any:
    """Train a byte-level BPE tokenizer on the synthetic corpus and save it HF-style."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(4000, seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None, model_max_length=4096)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(model_dir))
    return fast


def build_model(model_dir: Path, size: TinySize, seed: int = 0, device: str | None = None) -> dict[str, Any]:
    """Random-initialised Qwen3-MoE saved as bf16 safetensors; returns its config.json as a dict."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = size.config_dict()
    config = AutoConfig.for_model(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")},
                                  model_type="qwen3_moe")
    config.architectures = ["Qwen3MoeForCausalLM"]
    torch.manual_seed(seed)
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.config.eos_token_id = None
    model.save_pretrained(str(model_dir), safe_serialization=True)
    return json.loads((model_dir / "config.json").read_text())


def build_all(model_dir: str | Path, data_dir: str | Path, size: str = "small", num_samples: int = 400,
              seed: int = 0, overwrite: bool = False, fmt: str = "bf16") -> TinyResult:
    """``model_dir`` (config, weights, tokenizer) and ``data_dir`` (dataset + dataset_info.json).

    ``fmt`` ``fp8``: the same random model, its linear layers stored as a native block-FP8 checkpoint
    (``ktdeploy.agent.tiny_fp8``)."""
    if size not in SIZES:
        raise UsageError(f"unknown tiny model size {size!r}", fix=f"use one of: {', '.join(SIZES)}")
    if fmt not in FORMATS:
        raise UsageError(f"unknown tiny model format {fmt!r}", key="--format", fix=f"use one of: {', '.join(FORMATS)}")
    if fmt == "fp8":
        from ktdeploy.agent.tiny_fp8 import check_fp8_shape

        spec = SIZES[size]
        check_fp8_shape(spec.hidden_size, spec.moe_intermediate_size, spec.head_dim * spec.num_key_value_heads)
    model_dir, data_dir = Path(model_dir), Path(data_dir)
    if (model_dir / "config.json").exists() and not overwrite:
        raise UsageError(f"{model_dir} already holds a model", fix="choose another directory or pass --overwrite")
    import importlib.util

    missing = [m for m in ("torch", "transformers", "tokenizers") if _find_spec(importlib.util, m) is None]
    if missing:  # before anything is written: a controller without the ML stack leaves no folder behind
        raise ImportError(f"No module named {', '.join(repr(m) for m in missing)}")
    check_dataset_target(data_dir, overwrite)  # before the model is built: a refusal leaves nothing behind
    spec = SIZES[size]
    with _staged(model_dir) as tmp:   # built in a temp sibling, moved into model_dir only when complete
        tok = build_tokenizer(tmp, spec.vocab_size, seed)
        config = build_model(tmp, spec, seed)
        # Special-token ids for generation and LlamaFactory's template (replace_eos uses <|im_end|>).
        config.update(eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
                      pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"), bos_token_id=None)
        if fmt == "fp8":
            from ktdeploy.agent.tiny_fp8 import quantize_checkpoint

            config["quantization_config"] = quantize_checkpoint(tmp, config)
        write_file(tmp, "config.json", json.dumps(config, indent=2), overwrite=True)
        gen = tmp / "generation_config.json"
        if gen.exists():
            g = json.loads(gen.read_text())
            g.update(eos_token_id=config["eos_token_id"], pad_token_id=config["pad_token_id"])
            write_file(tmp, gen.name, json.dumps(g, indent=2), overwrite=True)
    heldout = build_dataset(data_dir, num_samples, seed, overwrite=overwrite)
    return TinyResult(str(model_dir), str(data_dir), size, fmt, config, num_samples, str(heldout))


def _find_spec(util: Any, name: str) -> Any:
    try:
        return util.find_spec(name)
    except (ImportError, ValueError):  # sys.modules[name] is None (hidden) or has no spec
        return None


class _staged:
    """``with _staged(target) as tmp``: build in a temp sibling of ``target``; on success its files move into
    ``target`` (renamed whole when ``target`` does not exist); on any failure the temp folder, and every parent
    folder this created, are removed: nothing is left behind."""

    def __init__(self, target: Path):
        self.target = Path(target)

    def __enter__(self) -> Path:
        parent = self.target.parent
        self.created = []
        p = parent
        while not p.exists():
            self.created.append(p)
            p = p.parent
        parent.mkdir(parents=True, exist_ok=True)
        self.tmp = staging_dir(parent, f".{self.target.name}.partial-")
        return self.tmp

    def __exit__(self, exc_type: object, exc: object, tb: object) -> Literal[False]:
        import os
        import shutil

        if exc_type is None:
            # safetensors writes its files 0600: the training and serving user (another uid in the image) must read
            # the model, so every file gets the mode a plain create gives.
            umask = os.umask(0)
            os.umask(umask)
            for f in self.tmp.iterdir():
                if f.is_file() and not f.is_symlink():
                    os.chmod(f, 0o666 & ~umask)
            if not self.target.exists():
                os.rename(self.tmp, self.target)
                return False
            for entry in self.tmp.iterdir():
                dest = self.target / entry.name
                if dest.is_dir() and not dest.is_symlink():
                    shutil.rmtree(dest)
                os.replace(entry, dest)
            self.tmp.rmdir()
            return False
        shutil.rmtree(self.tmp, ignore_errors=True)
        for p in self.created:  # innermost first
            try:
                p.rmdir()
            except OSError:
                break
        return False
