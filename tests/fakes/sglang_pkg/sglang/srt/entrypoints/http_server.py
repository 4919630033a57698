"""TEST DOUBLE of sglang.srt.entrypoints.http_server (see tests/fakes/sglang_pkg/README.md)."""
import json
import multiprocessing as mp
import os
from pathlib import Path


def _holders(secret):
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if secret and secret.encode() in cmd:
            found.append({"pid": int(d.name), "cmdline": cmd.replace(b"\0", b" ").decode(errors="replace")})
    return found


def _scheduler(server_args, ready, done):
    ready.set()
    done.wait(30)


def launch_server(server_args, *a, **kw):
    ctx = mp.get_context("spawn")
    ready, done = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_scheduler, args=(server_args, ready, done))
    child.start()
    ready.wait(30)
    secret = os.environ.get("FAKE_SGLANG_SECRET", "")
    report = {"api_key_set": server_args.api_key == secret and bool(secret), "model_path": server_args.model_path,
              "lora_paths": server_args.lora_paths, "enable_lora": server_args.enable_lora,
              "child_alive": child.is_alive(), "argv_holders": _holders(secret), "self_pid": os.getpid(),
              "child_pid": child.pid, "kt_expert_lora_path": server_args.kt_expert_lora_path, "uid": os.getuid(),
              "home": os.environ.get("HOME")}
    done.set()
    child.join(30)
    Path(os.environ["FAKE_SGLANG_REPORT"]).write_text(json.dumps(report))
