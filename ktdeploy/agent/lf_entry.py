"""Training entry point that ``ktdeploy train`` hands to ``accelerate launch -m``.

It is LlamaFactory's own ``run_exp`` (the same code as ``llamafactory.launcher``) with small
callbacks added:

* ``RunMetrics`` appends one JSON line per logged step to ``$KTDEPLOY_METRICS`` (loss, tokens seen,
  step time, peak GPU memory: ``torch.cuda.max_memory_allocated`` and the caching allocator's
  ``max_memory_reserved``, which is what the GPU really holds) so ``ktdeploy`` can follow a run and
  calibrate its resource model without parsing logs;
* ``SaveOnStopRequest`` (when ``ktdeploy train`` names the stop request, agent/stop_request.py): a scheduler's
  warning before the time limit or a preemption makes the trainer save a checkpoint at the next step boundary and
  stop cleanly, so the requeued job resumes from exactly that step;
* ``ProbeLogits`` (only when ``$KTDEPLOY_PROBE_PROMPTS`` names a JSON list of prompts) runs the
  fine-tuned model - KT experts and all - on those prompts at the end of training and saves the
  logits, the reference ``ktdeploy convert`` output is checked against.

Usage: ``accelerate launch --config_file acc.yaml -m ktdeploy.agent.lf_entry train.yaml``
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from ktdeploy.agent.stop_request import EXIT_SAVED, StoppedAfterSave, StopRequest
from ktdeploy.core import run_record as rr
from ktdeploy.core.safeio import appending, read_text, write_path

PROBE_TEMPLATE = "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"


def _rank0() -> bool:
    return os.environ.get("RANK", "0") == "0"


class GcClock:
    """Python's garbage collector, timed (a ``gc.callbacks`` hook): seconds spent collecting and full
    (generation 2) collections since the last ``take()``, written per step to metrics.jsonl. On the GPU machine
    the collector took <= 0.021 s per 14-step run with no full collection (issue 18 P1: the stalled step there
    was CUDA's JIT, see run_record.trainer_workdir)."""

    def __init__(self) -> None:
        self.seconds, self.full = 0.0, 0
        self._t0: float | None = None

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self._t0 is not None:
            self.seconds += time.perf_counter() - self._t0
            self._t0 = None
            if info.get("generation") == 2:
                self.full += 1

    def take(self) -> tuple[float, int]:
        out = (self.seconds, self.full)
        self.seconds, self.full = 0.0, 0
        return out


def freeze_heap() -> bool:
    """With KTDEPLOY_GC_FREEZE=1: collect once, then move every object that exists now (the model, the libraries,
    the dataset) to the permanent generation, so collections during training walk only what training allocates
    (objects frozen here that die later are freed at exit). Off by default: measured, the collector costs a
    training step nothing worth it (GcClock)."""
    import gc

    if os.environ.get("KTDEPLOY_GC_FREEZE", "0") != "1":
        return False
    gc.collect()
    gc.freeze()
    return True


def _callbacks() -> list[Any]:
    import gc

    from transformers import TrainerCallback

    class RunMetrics(TrainerCallback):
        def __init__(self, path: str):
            self.path = path
            self.t_last: float | None = None
            self.gc = GcClock()
            gc.callbacks.append(self.gc)

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            frozen = freeze_heap()
            self.gc.take()
            self._write({"step": state.global_step, "gc_frozen": frozen, "gc_frozen_objects": gc.get_freeze_count()})

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if self.t_last is None:
                self.t_last = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            import torch

            now = time.perf_counter()
            gc_s, gc_full = self.gc.take()
            row = {"step": state.global_step, "time": time.time(), "step_s": now - self.t_last if self.t_last is not None else 0.0,
                   "tokens_seen": int(state.num_input_tokens_seen or 0), "gc_s": round(gc_s, 4), "gc_full": gc_full}
            self.t_last = now
            if torch.cuda.is_available():
                row["peak_gpu_mem_bytes"] = int(torch.cuda.max_memory_allocated())
                row["peak_gpu_reserved_bytes"] = int(torch.cuda.max_memory_reserved())
            if state.log_history and state.log_history[-1].get("step") == state.global_step:
                loss = state.log_history[-1].get("loss")
                if loss is not None:
                    row["loss"] = float(loss)
            self._write(row)

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
            if logs and "loss" in logs:
                self._write({"step": state.global_step, "loss": float(logs["loss"])})

        def _write(self, row: dict[str, Any]) -> None:
            if _rank0():
                with appending(self.path) as f:
                    f.write(rr.metrics_line(row))

    class ProbeLogits(TrainerCallback):
        def __init__(self, prompts_path: str, out_path: str):
            self.prompts = json.loads(open(prompts_path).read())
            self.out_path = out_path

        def on_train_end(self, args: Any, state: Any, control: Any, model: Any = None, processing_class: Any = None,
                         **kw: Any) -> None:
            if not _rank0() or model is None or processing_class is None:
                return
            try:
                self._probe(model, processing_class)
            except Exception as err:  # never fail a finished training run over the probe
                write_path(self.out_path + ".error", f"{type(err).__name__}: {err}\n", overwrite=True)

        def _probe(self, model: Any, processing_class: Any) -> None:
            import torch
            from safetensors.torch import save

            tok = getattr(processing_class, "tokenizer", processing_class)
            device = next(p for p in model.parameters() if p.device.type != "meta").device
            was_training = model.training
            model.eval()
            out = {}
            with torch.no_grad():
                for i, prompt in enumerate(self.prompts):
                    ids = tok(PROBE_TEMPLATE.format(prompt=prompt), add_special_tokens=False,
                              return_tensors="pt")["input_ids"]
                    if torch.cuda.is_available():
                        device = torch.device("cuda", torch.cuda.current_device())
                    logits = model(input_ids=ids.to(device)).logits
                    out[f"input_ids.{i}"] = ids[0].to(torch.int64).cpu().contiguous()
                    out[f"logits.{i}"] = logits[0].float().cpu().contiguous()
            model.train(was_training)
            write_path(self.out_path, save(out, metadata={"prompts": json.dumps(self.prompts)}), overwrite=True)

    cbs: list[Any] = []
    stop = StopRequest.from_env(os.environ)
    if stop is not None:
        cbs.append(save_on_stop_request(TrainerCallback, stop))
    if os.environ.get("KTDEPLOY_METRICS"):
        cbs.append(RunMetrics(os.environ["KTDEPLOY_METRICS"]))
    if os.environ.get("KTDEPLOY_PROBE_PROMPTS") and os.environ.get("KTDEPLOY_PROBE_OUT"):
        cbs.append(ProbeLogits(os.environ["KTDEPLOY_PROBE_PROMPTS"], os.environ["KTDEPLOY_PROBE_OUT"]))
    return cbs


def agreed(flag: bool) -> bool:
    """Every rank's answer when any rank says yes (a MAX all-reduce): the ranks must stop at the same step, since
    the checkpoint they save there is a collective operation. One process: the flag itself."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return flag
    import torch

    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def save_on_stop_request(base: type, stop: StopRequest, agree: Callable[[bool], bool] = agreed) -> Any:
    """A TrainerCallback (``base`` is transformers' TrainerCallback) that honours ``stop`` (agent/stop_request.py):
    at the step boundary after the request appears it makes the Trainer save a checkpoint there and stop; once the
    checkpoint is on disk (``on_save``, called after the Trainer wrote it) rank 0 names it in the stopped marker and
    every rank raises StoppedAfterSave, so LlamaFactory never writes its final model and results."""

    class SaveOnStopRequest(base):
        def __init__(self) -> None:
            self.stopping = False

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
            if not self.stopping and agree(stop.requested()):
                self.stopping = True
                control.should_save = True
                control.should_training_stop = True
            return control

        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
            if not self.stopping:
                return control
            checkpoint = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            if _rank0():
                stop.mark_saved(int(state.global_step), checkpoint)
            raise StoppedAfterSave(int(state.global_step), checkpoint)

    return SaveOnStopRequest()


def _vm_hwm_bytes() -> int:
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def finish(rc: int) -> None:
    """`ktdeploy train --exec`: no parent watches the run, so each rank leaves its peak RSS in the record
    (ranks.jsonl) and rank 0 writes rc, status and summary.json (peak = rank 0's own, hwm = the sum over the
    ranks that finished before it)."""
    import resource
    from pathlib import Path

    run_dir = os.environ.get("KTDEPLOY_RUN_DIR")
    if not run_dir:
        return
    d = Path(run_dir)
    hwm = _vm_hwm_bytes()
    with appending(d / rr.RANKS) as f:
        f.write(rr.rank_line(int(os.environ.get("RANK", "0")), rc, hwm))
    if not _rank0():
        return
    from ktdeploy.agent.train import finish_record

    rows = rr.parse_ranks(read_text(d / rr.RANKS, 16 << 20, "ranks record"))
    t0 = float(os.environ.get("KTDEPLOY_T0") or time.time())
    finish_record(d, Path(os.environ.get("KTDEPLOY_OUTPUT_DIR") or "."), rc, time.time() - t0,
                  resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, sum(r["hwm_bytes"] for r in rows))


def main() -> None:
    from llamafactory.train.tuner import run_exp

    rc = 1
    try:
        run_exp(callbacks=_callbacks())
        rc = 0
    except StoppedAfterSave as saved:
        print(f"ktdeploy: {saved}; start again with --resume auto", flush=True)
        rc = EXIT_SAVED
    finally:
        finish(rc)
    if rc == EXIT_SAVED:
        sys.exit(rc)


if __name__ == "__main__":
    main()
