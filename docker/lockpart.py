#!/usr/bin/env python3
"""Split a hashed lock into the CUDA+torch part and the rest (stdlib only; runs inside the build).

    python lockpart.py LOCK cuda|rest > PART.lock

The Dockerfile installs the `cuda` part in the deps-cuda stage and the `rest` in deps, so a bump of
the serving stack (sglang-kt, LlamaFactory, ...) rebuilds only the second layer and leaves the
multi-GB CUDA+torch layer (and its ID) as it was. The two parts together are exactly the lock.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

# Distributions of the CUDA+torch layer: torch and what ships CUDA libraries or compiles for CUDA.
CUDA = re.compile(r"^(torch|torchvision|torchaudio|triton|nvidia-[a-z0-9-]+)==")


def entries(text: str) -> list[str]:
    """Each requirement with its continuation lines (`name==v \\` + `--hash=...`)."""
    out: list[str] = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if line[0].isspace() and out:
            out[-1] += "\n" + line
        else:
            out.append(line)
    return out


def part(text: str, which: str) -> str:
    picked = [e for e in entries(text) if bool(CUDA.match(e)) == (which == "cuda")]
    return "".join(e + "\n" for e in picked)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[2] not in ("cuda", "rest"):
        sys.exit("usage: lockpart.py LOCK cuda|rest")
    sys.stdout.write(part(Path(sys.argv[1]).read_text(), sys.argv[2]))
