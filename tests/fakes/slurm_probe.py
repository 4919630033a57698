"""The login node's answer to ktdeploy's cluster probe (core/sched/cluster.py PROBE_SH), made by running the REAL
probe script under sh with stand-ins for the commands it asks about: ``scontrol show config`` prints a config
recorded from the integration tier's Debian Slurm 22.05 cluster (tests/slurm-recorded/), ``srun --help`` lists
pyxis's options only when asked to, and the runtimes named exist as empty commands on PATH."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from ktdeploy.core.sched.cluster import PROBE_SH

GOLDEN = Path(__file__).resolve().parents[1] / "slurm-recorded"


def recorded_config(name: str = "scontrol-show-config-cgroup.txt") -> str:
    return (GOLDEN / name).read_text()


def probe_answer(tmp: Path, runtimes: tuple[str, ...] = ("podman",), config: str | None = None) -> str:
    bindir = tmp / "probe-bin"
    bindir.mkdir(parents=True, exist_ok=True)
    (tmp / "probe-config.txt").write_text(recorded_config() if config is None else config)
    stubs = {"scontrol": f"#!/bin/sh\ncat {tmp / 'probe-config.txt'}\n",
             "srun": "#!/bin/sh\necho 'Usage: srun [OPTIONS(0)... [executable(0) [args(0)...]]]'\n"
                     + ("echo '      --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH'\n" if "pyxis" in runtimes
                        else "")}
    for name in ("podman", "apptainer", "docker"):
        if name in runtimes:
            stubs[name] = "#!/bin/sh\nexit 0\n"
    for f in bindir.iterdir():
        f.unlink()
    for name, text in stubs.items():
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
    tools = tmp / "probe-tools"     # only what the probe itself runs: no real runtime of this machine is found
    tools.mkdir(exist_ok=True)
    for tool in ("mktemp", "head", "rm", "cat", "sh"):
        if not (tools / tool).exists():
            (tools / tool).symlink_to(shutil.which(tool) or f"/bin/{tool}")
    env = {**os.environ, "PATH": f"{bindir}:{tools}"}
    return subprocess.run([str(tools / "sh"), "-c", PROBE_SH], capture_output=True, text=True, env=env, timeout=30).stdout
