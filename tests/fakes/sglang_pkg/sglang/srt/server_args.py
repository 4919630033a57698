"""TEST DOUBLE of sglang.srt.server_args (see tests/fakes/sglang_pkg/README.md)."""
import argparse
import getpass
import hashlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ServerArgs:
    model_path: str = ""
    api_key: str | None = None
    lora_paths: list = field(default_factory=list)
    enable_lora: bool = False
    kt_expert_lora_path: str | None = None
    rest: list = field(default_factory=list)


def _prepare_kt_composite_lora_adapter(adapter_path):
    """What sglang-kt 0.7.2 (srt/server_args.py) does with a merged KT adapter before serving: split it into
    expert/nonexpert folders under ``$SGLANG_KT_LORA_CACHE_DIR``, else under
    ``<tempdir>/sglang_kt_lora_cache_{getpass.getuser()}`` (getpass raises for a uid absent from passwd)."""
    adapter_dir = Path(adapter_path).expanduser().resolve()
    weights, config = adapter_dir / "adapter_model.safetensors", adapter_dir / "adapter_config.json"
    if not adapter_dir.is_dir() or not weights.is_file() or not config.is_file():
        return None
    cache_root = (Path(os.environ.get("SGLANG_KT_LORA_CACHE_DIR", "")) if os.environ.get("SGLANG_KT_LORA_CACHE_DIR")
                  else Path(tempfile.gettempdir()) / f"sglang_kt_lora_cache_{getpass.getuser()}")
    cache_dir = cache_root / hashlib.sha256(str(adapter_dir).encode()).hexdigest()[:16]
    for part in ("expert", "nonexpert"):
        (cache_dir / part).mkdir(parents=True, exist_ok=True)
    return str(cache_dir / "expert"), str(cache_dir / "nonexpert")


def prepare_server_args(argv):
    p = argparse.ArgumentParser(prog="fake-sglang")
    p.add_argument("--model-path", required=True)
    p.add_argument("--api-key")
    p.add_argument("--lora-paths", nargs="*", default=[])
    p.add_argument("--enable-lora", action="store_true")
    ns, rest = p.parse_known_args(argv)
    args = ServerArgs(model_path=ns.model_path, api_key=ns.api_key, lora_paths=ns.lora_paths,
                      enable_lora=ns.enable_lora, rest=rest)
    for ref in ns.lora_paths:
        prepared = _prepare_kt_composite_lora_adapter(ref.split("=", 1)[-1])
        if prepared:
            args.kt_expert_lora_path = prepared[0]
    return args
