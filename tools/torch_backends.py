"""Which `ddp_backend` names the image's torch takes: run inside the full image, prints JSON for tools/gen_key_catalog.py.

transformers lists the names it passes on (TrainingArguments.ddp_backend's metadata choices); whether torch knows one
is a fact of the torch build (the c10d backends compiled in), not of any source file, so it is measured here: each
name is handed to ``torch.distributed.init_process_group`` in a one-process group, as accelerate's PartialState hands
it on the GPU host. ``nccl`` needs a GPU; its refusal without one ("only supported with GPUs") still shows torch knows
it.

    docker run --rm --network none -v "$PWD":/src -w /src --entrypoint python3 ktsft:amx tools/torch_backends.py \
        > docker/requirements/torch_backends.json
"""

from __future__ import annotations

import json
import os
import socket
import sys
import warnings

NEEDS_A_GPU = "only supported with GPUs"


def probe(name: str, port: int) -> str | None:
    """None when torch takes the name; else its own message."""
    import torch.distributed as dist

    try:
        dist.init_process_group(backend=name, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    except Exception as err:  # noqa: BLE001 - the message is the answer
        text = f"{type(err).__name__}: {err}".splitlines()[0]
        return None if NEEDS_A_GPU in text else text
    dist.destroy_process_group()
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    import torch
    import transformers.training_args as ta

    warnings.simplefilter("ignore")
    field = ta.TrainingArguments.__dataclass_fields__["ddp_backend"]
    names = list(field.metadata["choices"])
    out = os.dup(1)
    os.dup2(2, 1)   # c10d's C++ writes to fd 1 ("[Gloo] Rank 0 is connected ..."): keep stdout for the JSON
    try:
        refused = {n: why for n in names if (why := probe(n, free_port())) is not None}
    finally:
        sys.stdout.flush()
        os.dup2(out, 1)
    json.dump({"torch": torch.__version__, "choices": names, "refused": refused}, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
