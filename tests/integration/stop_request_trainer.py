"""Run inside an image with torch and transformers (the full ktsft image): ktdeploy's SaveOnStopRequest callback
(ktdeploy/agent/lf_entry.py, from the working tree mounted first on PYTHONPATH) against transformers' own Trainer,
and ``agreed`` across two real processes (gloo). Prints one JSON object; tests/integration/test_stop_request_trainer.py
judges it.

    python stop_request_trainer.py WORKDIR
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from transformers import Trainer, TrainerCallback, TrainingArguments

from ktdeploy.agent.lf_entry import agreed, save_on_stop_request
from ktdeploy.agent.stop_request import StoppedAfterSave, StopRequest

REQUEST_DURING_STEP = 7


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 1)

    def forward(self, x, labels=None):
        y = self.lin(x).squeeze(-1)
        return {"loss": ((y - labels) ** 2).mean(), "logits": y}


class Data(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 512

    def __getitem__(self, i: int):
        x = torch.randn(4, generator=torch.Generator().manual_seed(i))
        return {"x": x, "labels": x.sum()}


class RequestDuring(TrainerCallback):
    """The scheduler's side: the request file appears while step ``step`` runs (as the batch script's trap writes it)."""

    def __init__(self, step: int, req: StopRequest) -> None:
        self.step, self.req = step, req

    def on_step_begin(self, args, state, control, **kw):
        if state.global_step + 1 == self.step:
            os.makedirs(os.path.dirname(self.req.request), exist_ok=True)
            with open(self.req.request, "w") as f:
                f.write("USR1\n")


class Steps(TrainerCallback):
    def __init__(self) -> None:
        self.seen: list[int] = []

    def on_step_end(self, args, state, control, **kw):
        self.seen.append(state.global_step)


def arguments(out: str, max_steps: int) -> TrainingArguments:
    return TrainingArguments(output_dir=out, max_steps=max_steps, per_device_train_batch_size=4, save_steps=1000,
                             save_strategy="steps", logging_steps=1, report_to=[], use_cpu=True, learning_rate=0.01,
                             disable_tqdm=True, seed=0)


def rank_main(rank: int, work: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29517")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    got = agreed(rank == 1)          # only rank 1 saw the request: both must stop at this step
    with open(os.path.join(work, f"rank{rank}.json"), "w") as f:
        json.dump(got, f)
    dist.destroy_process_group()


def main(work: str) -> None:
    out = os.path.join(work, "out")
    req = StopRequest.for_output(out)
    before = Steps()
    trainer = Trainer(model=Tiny(), args=arguments(out, 50), train_dataset=Data(),
                      callbacks=[RequestDuring(REQUEST_DURING_STEP, req), before,
                                 save_on_stop_request(TrainerCallback, req)])
    result: dict = {"transformers": __import__("transformers").__version__, "torch": torch.__version__}
    try:
        trainer.train()
        result["stopped"] = None
    except StoppedAfterSave as e:
        result["stopped"] = [e.step, e.checkpoint]
    result["steps_run"] = before.seen
    with open(req.stopped) as f:
        result["marker"] = json.load(f)
    result["out"] = sorted(os.listdir(out))
    ckpt = os.path.join(out, f"checkpoint-{REQUEST_DURING_STEP}")
    result["checkpoint_files"] = sorted(os.listdir(ckpt)) if os.path.isdir(ckpt) else []
    with open(os.path.join(ckpt, "trainer_state.json")) as f:
        result["checkpoint_step"] = json.load(f)["global_step"]
    # the requeued job: a new process resumes from exactly that checkpoint (what `train --resume auto` hands over)
    req.clear({})
    after = Steps()
    again = Trainer(model=Tiny(), args=arguments(out, 10), train_dataset=Data(),
                    callbacks=[after, save_on_stop_request(TrainerCallback, req)])
    again.train(resume_from_checkpoint=ckpt)
    result["resumed_steps"] = after.seen
    torch.multiprocessing.spawn(rank_main, args=(work,), nprocs=2)
    result["ranks_agree"] = [json.load(open(os.path.join(work, f"rank{r}.json"))) for r in (0, 1)]
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
