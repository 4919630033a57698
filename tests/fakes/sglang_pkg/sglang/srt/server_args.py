"""TEST DOUBLE of sglang.srt.server_args (see tests/fakes/sglang_pkg/README.md)."""
import argparse
from dataclasses import dataclass, field


@dataclass
class ServerArgs:
    model_path: str = ""
    api_key: str | None = None
    lora_paths: list = field(default_factory=list)
    enable_lora: bool = False
    rest: list = field(default_factory=list)


def prepare_server_args(argv):
    p = argparse.ArgumentParser(prog="fake-sglang")
    p.add_argument("--model-path", required=True)
    p.add_argument("--api-key")
    p.add_argument("--lora-paths", nargs="*", default=[])
    p.add_argument("--enable-lora", action="store_true")
    ns, rest = p.parse_known_args(argv)
    return ServerArgs(model_path=ns.model_path, api_key=ns.api_key, lora_paths=ns.lora_paths,
                      enable_lora=ns.enable_lora, rest=rest)
