#!/usr/bin/env python3
"""TEST DOUBLE of the training image's agent, for CPU-only test hosts. NOT the trainer.

    fake_llamafactory.py train RECIPE.yaml [--resume auto|PATH]  # writes what LlamaFactory + HF Trainer write
    fake_llamafactory.py convert OUT -o ADAPTER  # the REAL converter (ktdeploy.agent.convert, copied in the image)
    fake_llamafactory.py merge OUT --base M -o D # the REAL `ktdeploy merge` (with numpy, copied in the image)
    fake_llamafactory.py serve RECIPE --adapter DIR | --weights DIR | --merged DIR  # an HTTP server answering /health

What ``train`` saves (output_dir and every checkpoint-N) is what kt-kernel 0.7.2 + LlamaFactory-KT save
(tests/fakes/kt_layout.py, checked byte-size for byte-size against the GPU machine's recorded output): for
``finetuning_type: lora`` the PEFT adapter, ``fused_expert_lora.safetensors`` and ``kt_adapter_manifest.json``;
for ``finetuning_type: full`` the whole model (config.json, model.safetensors, tokenizer files).

``train`` writes ``trainer_log.jsonl`` lines with LlamaFactory's LogCallback keys (current_steps, total_steps,
loss, lr, epoch, percentage, elapsed_time, remaining_time, throughput, total_tokens) every ``logging_steps``,
and ``checkpoint-N`` folders every ``save_steps`` in HF Trainer's order (weights, optimizer, scheduler, RNG
state, trainer_state.json last), honours ``resume_from_checkpoint`` and ``overwrite_output_dir: false`` like
LlamaFactory, and at the end writes train_results.json / all_results.json / trainer_state.json and the loss
plot. Knobs (files in the data volume, so a test can set them without touching the recipe):
  fake_crash_at_step   crash (exit 1, traceback on stderr) when this step is reached
  fake_step_seconds    seconds per step (default 0.2)
Like the real entry point, it saves a checkpoint at the step boundary after a stop request appears and exits 75
(agent/stop_request.py), and in a scheduler's job it runs on the job's CPUs (agent/job_cpus.py); both are the real
package's code, copied into the image.
Total steps: train.max_steps (default 30).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# 1x1 transparent PNG: stands in for LlamaFactory's training_loss.png
PNG = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082")


def load_yaml(path):
    from ruamel.yaml import YAML

    with open(path, encoding="utf-8") as f:
        return YAML(typ="safe", pure=True).load(f)


def knob(data_dir, name, cast, default):
    p = os.path.join(data_dir or "/nonexistent", name)
    try:
        with open(p) as f:
            return cast(f.read().strip())
    except (OSError, ValueError):
        return default


def write(path, data, mode="w"):
    with open(path, mode) as f:
        f.write(data)


def save_weights(d, t):
    import kt_layout

    if str(t.get("finetuning_type", "lora")).lower() == "full":
        kt_layout.write_full_model(d)
    else:
        kt_layout.write_lora_adapter(d, base=str(t.get("model_name_or_path")), rank=int(t.get("lora_rank") or 8),
                                     alpha=t.get("lora_alpha") or 16)


def save_checkpoint(out, step, state, world_size, pause, t=None):
    d = os.path.join(out, f"checkpoint-{step}")
    os.makedirs(d, exist_ok=True)
    save_weights(d, t or {})
    time.sleep(pause)
    write(os.path.join(d, "optimizer.pt"), b"\0" * 128, "wb")
    time.sleep(pause)
    write(os.path.join(d, "scheduler.pt"), b"\0" * 8, "wb")
    for rank in range(world_size):
        name = "rng_state.pth" if world_size == 1 else f"rng_state_{rank}.pth"
        write(os.path.join(d, name), b"\0" * 8, "wb")
    write(os.path.join(d, "training_args.bin"), b"\0" * 8, "wb")
    time.sleep(pause)
    write(os.path.join(d, "trainer_state.json"), json.dumps(state, indent=2))


def resume_auto(out, world):
    """`ktdeploy train --resume auto`: the agent's choice (ktdeploy.core.checkpoints, the package copied into this
    image): the newest complete checkpoint saved by as many processes as this run has."""
    sys.path.insert(0, "/opt/ktdeploy-src")
    from ktdeploy.core.checkpoints import choose_resume, parse_listing

    lines = []
    for root, dirs, files in os.walk(out):
        rel = os.path.relpath(root, out)
        if rel.count(os.sep) >= 2:
            continue
        lines += [os.path.normpath(os.path.join(rel, n)) for n in dirs + files]
    choice = choose_resume(parse_listing("\n".join(lines)), "auto", world)
    if choice.checkpoint is None:
        print(f"error: --resume auto: no complete checkpoint in {out}", file=sys.stderr)
        return None
    return os.path.join(out, choice.checkpoint.name)


def job_cpus(reserve):
    """Not a double: `ktdeploy train`'s own pinning (agent/job_cpus.py, the package copied into this image): in a
    scheduler's job the trainer narrows its CPU mask to the job's CPUs and plans kt-kernel's threads on them."""
    sys.path.insert(0, "/opt/ktdeploy-src")
    from ktdeploy.agent.job_cpus import pin_to_job, threads_here

    pinned = pin_to_job()
    if pinned is not None:
        threads, pools = threads_here(reserve)
        print(f"ktdeploy: the job's CPUs {pinned.text} ({pinned.source}): kt_num_threads={threads} "
              f"kt_threadpool_count={pools}", flush=True)


def stop_request(out):
    """Not a double: the stop request's contract (agent/stop_request.py), as lf_entry's SaveOnStopRequest keeps it."""
    sys.path.insert(0, "/opt/ktdeploy-src")
    from ktdeploy.agent.stop_request import StopRequest

    req = StopRequest.for_output(out)
    req.clear()       # an earlier run's request, unless a supervising shell started this run (it cleared them)
    return req


def train(recipe_path, resume_arg=None):
    doc = load_yaml(recipe_path)
    t, acc = doc.get("train", {}), doc.get("accelerate", {})
    data_dir = t.get("dataset_dir")
    out = t["output_dir"]
    total = int(t.get("max_steps") or 30)
    log_every = int(t.get("logging_steps") or 5)
    save_every = int(t.get("save_steps") or 10)
    world = int(acc.get("num_processes") or 1)
    lr0 = float(t.get("learning_rate") or 1e-4)
    step_s = knob(data_dir, "fake_step_seconds", float, 0.2)
    crash_at = knob(data_dir, "fake_crash_at_step", int, None)
    tokens_per_step = int(t.get("cutoff_len") or 512) * int(t.get("per_device_train_batch_size") or 1) * world
    print(f"[fake-llamafactory] TEST DOUBLE training {out}: {total} steps", flush=True)
    held = ((doc.get("deploy") or {}).get("eval") or {})
    if held.get("holdout"):
        # not a double: `ktdeploy train`'s own carve (agent/holdout.py, the package copied into this image) writes
        # <output_dir>-holdout and the trainer reads that folder instead of the data folder
        sys.path.insert(0, "/opt/ktdeploy-src")
        from ktdeploy.agent.holdout import carve
        from ktdeploy.core.eval.dataset import names_of

        t["dataset_dir"] = carve(str(data_dir), names_of(t.get("dataset")), out, float(held["holdout"]),
                                 int(held.get("seed") or 0))
        print(f"[fake-llamafactory] training rows read from {t['dataset_dir']}", flush=True)
    resume = t.get("resume_from_checkpoint")
    if resume_arg == "auto":
        resume = resume_auto(out, world)
        if resume is None:
            return 2
    elif resume_arg:
        resume = resume_arg
    start = 0
    history = []
    if resume:
        with open(os.path.join(resume, "trainer_state.json")) as f:
            st = json.load(f)
        start, history = int(st["global_step"]), st.get("log_history", [])
        saved_world = len([n for n in os.listdir(resume) if n.startswith("rng_state")])
        if saved_world != world:
            print(f"ValueError: checkpoint saved with world size {saved_world}, now {world}", file=sys.stderr)
            return 1
        print(f"[fake-llamafactory] Resuming training from {resume} (step {start})", flush=True)
    elif os.path.isdir(out) and os.listdir(out) and not t.get("overwrite_output_dir"):  # noqa: SIM102 (mirrors LlamaFactory)
        if not any(n.startswith("checkpoint-") for n in os.listdir(out)):
            print("ValueError: Output directory already exists and is not empty. Please set `overwrite_output_dir`.",
                  file=sys.stderr)
            return 1
    job_cpus(int((doc.get("deploy") or {}).get("reserve_cores", 2)))
    os.makedirs(out, exist_ok=True)
    stop = stop_request(out)
    t0 = time.time()
    for step in range(start + 1, total + 1):
        time.sleep(step_s)
        if crash_at is not None and step == crash_at:
            print("Traceback (most recent call last):\n  File \"train.py\", line 1, in <module>\n"
                  f"RuntimeError: fake crash at step {step} (fake_crash_at_step)", file=sys.stderr, flush=True)
            return 1
        loss = round(2.5 * math.exp(-step / max(total, 1)) + 0.1, 4)
        lr = lr0 * 0.5 * (1 + math.cos(math.pi * step / total))
        epoch = round(step / total, 2)
        if step % log_every == 0 or step == total:
            history.append({"loss": loss, "learning_rate": lr, "epoch": epoch, "step": step})
            el = time.time() - t0
            done = step - start
            entry = {"current_steps": step, "total_steps": total, "loss": loss, "lr": lr, "epoch": epoch,
                     "percentage": round(step / total * 100, 2),
                     "elapsed_time": str(timedelta(seconds=int(el))),
                     "remaining_time": str(timedelta(seconds=int((total - step) * el / max(done, 1)))),
                     "throughput": round(done * tokens_per_step / max(el, 1e-6), 2),
                     "total_tokens": step * tokens_per_step}
            write(os.path.join(out, "trainer_log.jsonl"), json.dumps(entry) + "\n", "a")
            print(f"{{'loss': {loss}, 'learning_rate': {lr:.4e}, 'epoch': {epoch}}}", flush=True)
        asked = stop.requested()     # the step boundary: HF Trainer's on_step_end, where SaveOnStopRequest looks
        if step % save_every == 0 or asked:
            state = {"global_step": step, "max_steps": total, "log_history": history, "epoch": epoch}
            save_checkpoint(out, step, state, world, pause=step_s / 2, t=t)
        if asked:
            checkpoint = os.path.join(out, f"checkpoint-{step}")
            stop.mark_saved(step, checkpoint)
            print(f"ktdeploy: stopped on request after saving {checkpoint} (step {step}); start again with "
                  "--resume auto", flush=True)
            from ktdeploy.agent.stop_request import EXIT_SAVED

            return EXIT_SAVED
    metrics = {"epoch": 1.0, "train_loss": history[-1]["loss"] if history else None,
               "train_runtime": round(time.time() - t0, 3), "total_flos": 0}
    save_weights(out, t)
    write(os.path.join(out, "trainer_state.json"), json.dumps({"global_step": total, "log_history": history}))
    write(os.path.join(out, "train_results.json"), json.dumps(metrics))
    write(os.path.join(out, "all_results.json"), json.dumps(metrics))
    write(os.path.join(out, "training_loss.png"), PNG, "wb")
    print("[fake-llamafactory] training finished", flush=True)
    return 0


def convert(args):
    """Not a double: the real ktdeploy converter (the package is copied into this image)."""
    sys.path.insert(0, "/opt/ktdeploy-src")
    from ktdeploy.agent.convert import convert as real_convert
    from ktdeploy.core.errors import KtdeployError

    out, adapter = args[0], args[args.index("-o") + 1]
    try:
        s = real_convert(out, adapter)
    except KtdeployError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"[ktdeploy convert] {getattr(s, 'kind', 'lora')} output written: {s.output_dir} "
          f"({s.expert_tensors} expert tensors)", flush=True)
    return 0


def merge(args):
    """Not a double: the real ktdeploy merge (the package and numpy are copied into this image; the base image has
    no typer/rich for the CLI, so the function is called as the CLI calls it)."""
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    sys.path.insert(0, "/opt/ktdeploy-src")
    from ktdeploy.agent.merge import merge as real_merge
    from ktdeploy.core.errors import KtdeployError

    out, base, dst = args[0], args[args.index("--base") + 1], args[args.index("-o") + 1]
    root = args[args.index("--base-root") + 1] if "--base-root" in args else None
    try:
        s = real_merge(out, base, dst, base_root=root, say=lambda m: print(f"[ktdeploy merge] {m}", flush=True))
    except KtdeployError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"[ktdeploy merge] merged model written: {s.output_dir} ({s.expert_tensors} expert + {s.nonexpert_tensors} "
          f"other tensors, {s.kept_shards} shards kept)", flush=True)
    return 0


def serve(args):
    from http.server import BaseHTTPRequestHandler, HTTPServer

    doc = load_yaml(args[0])
    s = (doc.get("deploy") or {}).get("serve") or {}
    port = int(s.get("port", 30000))
    what = {}
    for flag, must in (("--adapter", "adapter_config.json"), ("--weights", "config.json"),
                       ("--merged", "ktdeploy_merge.json")):
        if flag in args:
            d = args[args.index(flag) + 1]
            if not os.path.isfile(os.path.join(d, must)):
                print(f"[fake-llamafactory] {flag} {d}: no {must}", file=sys.stderr, flush=True)
                return 2
            what[flag.lstrip("-")] = d

    served = s.get("served_model_name") or os.path.basename(str((doc.get("train") or {}).get("model_name_or_path",
                                                                                               "model")).rstrip("/"))
    lora = f"{served}:{s.get('lora_name', 'adapter')}" if "adapter" in what else None

    class H(BaseHTTPRequestHandler):
        def _json(self, code, data):
            body = json.dumps(data).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": m} for m in (served, lora) if m]})
                return
            self._json(200, {"ok": True, "fake": True, "lora": s.get("lora_name"), **what})

        def do_POST(self):
            # sglang-kt's OpenAI chat API, as a double (sglang-kt needs a GPU): the adapter (or the merged/full
            # model) answers the last user turn back, the base model a fixed sentence
            req = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.path != "/v1/chat/completions" or req.get("model") not in (served, lora):
                self._json(404, {"error": {"message": f"no model {req.get('model')!r} at {self.path}"}})
                return
            users = [m.get("content", "") for m in req.get("messages", []) if m.get("role") == "user"]
            text = (users[-1] if users else "") if req["model"] == (lora or served) else "I do not know."
            self._json(200, {"id": "fake", "object": "chat.completion", "model": req["model"],
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                          "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": 1, "completion_tokens": len(text.split()) or 1,
                                       "total_tokens": 1 + (len(text.split()) or 1)}})

        def log_message(self, *a):
            pass

    print(f"[fake-llamafactory] TEST DOUBLE server on port {port}", flush=True)
    HTTPServer((s.get("host", "127.0.0.1"), port), H).serve_forever()
    return 0


def tune(args):
    """TEST DOUBLE of `ktdeploy tune RECIPE --workdir W ...`: writes a tune record with a fixed choice."""
    workdir = args[args.index("--workdir") + 1]
    os.makedirs(workdir, exist_ok=True)
    record = {"fake": "TEST DOUBLE", "chosen": {"kt_num_threads": 3, "kt_threadpool_count": 1},
              "trials": [{"label": "threads=3 pools=1", "status": "ok", "tokens_per_s": 100.0}]}
    write(os.path.join(workdir, "tune.json"), json.dumps(record))
    print("[fake-llamafactory] TEST DOUBLE tune wrote", os.path.join(workdir, "tune.json"), flush=True)
    return 0


def main(argv):
    if not argv:
        print(__doc__)
        return 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "train":
        if "--tuned" in rest:  # `ktdeploy train --tuned tune.json`: record what would be applied
            tuned = json.load(open(rest[rest.index("--tuned") + 1]))
            out = load_yaml(rest[0])["train"]["output_dir"]
            os.makedirs(out, exist_ok=True)
            write(os.path.join(out, "ktdeploy_tuned_applied.json"), json.dumps(tuned["chosen"]))
        return train(rest[0], rest[rest.index("--resume") + 1] if "--resume" in rest else None)
    if cmd == "tune":
        return tune(rest)
    if cmd == "convert":
        return convert(rest)
    if cmd == "merge":
        return merge(rest)
    if cmd == "serve":
        return serve(rest)
    print(f"unknown command {cmd}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
