"""Job state on the host: the job's containers, the image, the output dir's checkpoints. What makes a second
``up`` change nothing. ``STATE_SCRIPT`` is fixed text; every recipe value reaches it as a positional argument
(``sh -c STATE_SCRIPT ktdeploy-state CONTAINER SERVE_CONTAINER IMAGE OUTPUT_DIR ADAPTER_DIR``); ``parse_state``
is pure."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ktdeploy.core import checkpoints as ckpt
from ktdeploy.core.markers import parse_fields, sh_block, sh_fields
from ktdeploy.core.safeio import parse_json

STATE_SCRIPT = "\n".join([
    "",
    "c=$1 s=$2 img=$3 out=$4 ad=$5",
    sh_fields("home", '"$HOME"'),
    sh_fields("user", '"$(id -u):$(id -g)"'),
    sh_fields("container", newline=False)
    + "; docker inspect --type container --format '{{json .State}}' -- \"$c\" 2>/dev/null || echo",
    sh_fields("container_image", newline=False)
    + "; docker inspect --type container --format '{{.Config.Image}}' -- \"$c\" 2>/dev/null || echo",
    sh_fields("serve", newline=False)
    + "; docker inspect --type container --format '{{json .State}}' -- \"$s\" 2>/dev/null || echo",
    sh_fields("image", newline=False) + "; docker image inspect --format '{{.Id}}' -- \"$img\" 2>/dev/null || echo",
    'e=no; [ -e "$out" ] && e=yes; ' + sh_fields("output_exists", '"$e"'),
    'a=no; { [ -f "$ad/adapter_config.json" ] || [ -f "$ad/ktdeploy_convert.json" ]; } && a=yes; '
    + sh_fields("adapter", '"$a"'),
    sh_block("listing"),
    # -H: a linked output dir is listed (it is the user's own link); names end in NUL and tr turns a newline
    # INSIDE a name into '?', so a file name can never forge a '@@' line of this answer
    "[ -d \"$out\" ] && find -H \"$out\" -mindepth 1 -maxdepth 3 -printf '%P\\0' 2>/dev/null | tr '\\n\\0' '?\\n'"
    " | head -n 20000",
    sh_block("end"),
    ""])


@dataclass(frozen=True)
class ContainerState:
    status: str                      # created | running | exited | dead | paused | restarting
    exit_code: int | None = None
    oom_killed: bool = False
    error: str = ""
    started_at: str | None = None
    finished_at: str | None = None
    image: str | None = None

    @property
    def running(self) -> bool:
        return self.status in ("running", "restarting", "paused")

    @property
    def succeeded(self) -> bool:
        return self.status == "exited" and self.exit_code == 0

    @property
    def failed(self) -> bool:
        return self.status in ("exited", "dead") and self.exit_code != 0

    def describe(self) -> str:
        if self.running:
            return f"{self.status} since {self.started_at}"
        bits = [f"{self.status}", f"exit code {self.exit_code}"]
        if self.oom_killed:
            bits.append("OOM-killed")
        if self.exit_code == 137 and not self.oom_killed:
            bits.append("killed (SIGKILL)")
        if self.error:
            bits.append(self.error)
        return ", ".join(bits)


@dataclass
class JobState:
    home: str = ""
    user: str = ""                   # uid:gid of the connecting user: the containers run as it (output ownership)
    container: ContainerState | None = None
    serve: ContainerState | None = None
    image_id: str | None = None
    output_exists: bool = False
    adapter_present: bool = False
    listing: dict[str, list[str]] = field(default_factory=dict)   # checkpoint name -> entries
    top_level: list[str] = field(default_factory=list)            # names directly in the output dir

    @property
    def finished(self) -> bool:
        """The output dir holds a completed training run (LlamaFactory writes these after the last step)."""
        return bool(ckpt.finished_markers(self.top_level))

    @property
    def checkpoints(self) -> list[ckpt.Checkpoint]:
        return ckpt.checkpoints(self.listing)

    def to_json(self) -> dict[str, Any]:
        return {"home": self.home, "user": self.user, "container": self.container.__dict__ if self.container else None,
                "serve": self.serve.__dict__ if self.serve else None, "image_id": self.image_id,
                "output_exists": self.output_exists, "adapter_present": self.adapter_present,
                "finished": self.finished, "top_level": self.top_level,
                "checkpoints": [{"name": c.name, "complete": c.complete, "missing": list(c.missing),
                                 "world_size": c.world_size} for c in self.checkpoints]}


def parse_container_state(text: str, image: str | None = None) -> ContainerState | None:
    text = text.strip()
    if not text.startswith("{"):
        return None
    try:
        d = parse_json(text)
    except ValueError:
        return None
    if not isinstance(d, dict):
        return None
    return ContainerState(status=str(d.get("Status", "unknown")), exit_code=d.get("ExitCode"),
                          oom_killed=bool(d.get("OOMKilled")), error=str(d.get("Error") or ""),
                          started_at=d.get("StartedAt"), finished_at=d.get("FinishedAt"), image=image or None)


def parse_state(text: str) -> JobState:
    st = JobState()
    fields, blocks = parse_fields(text, blocks=("listing",))
    listing = blocks["listing"]
    st.home = fields.get("home", "")
    st.user = fields.get("user", "") if re.fullmatch(r"\d+:\d+", fields.get("user", "")) else ""
    st.container = parse_container_state(fields.get("container", ""), fields.get("container_image", "").strip())
    st.serve = parse_container_state(fields.get("serve", ""))
    st.image_id = fields.get("image", "").strip() or None
    st.output_exists = fields.get("output_exists") == "yes"
    st.adapter_present = fields.get("adapter") == "yes"
    st.listing = ckpt.parse_listing("\n".join(listing))
    st.top_level = sorted({ln.strip().split("/", 1)[0] for ln in listing if ln.strip()})
    return st
