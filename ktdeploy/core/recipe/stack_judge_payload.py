"""The stack as the final judge of a recipe (pure half): what is sent to the image, how the answer is read, and
how the stack's refusals become ktdeploy findings.

``ktdeploy check --stack``, ``up``'s IMAGE stage (``stack.judge`` in the image check), ``doctor --image/--stack
--recipe`` and ``train`` in the image all run the same thing: ``BOOTSTRAP`` with the image's own ``python3``,
the rendered files on its stdin (``payload``). Inside, ``ktdeploy/agent/stack_judge.py`` runs accelerate's,
LlamaFactory's and kt-kernel's own validation on them and prints one line ``KTDEPLOY_JUDGE {json}``. Exit
status: 0 accepted, 2 refused, 7 the stack (or the judge) is not in the image, 1 the judge itself failed.

``findings`` maps each refusal to a Finding on the key the message names (``train.…``/``accelerate.…``), the
real message quoted, rule ``stack.<stage>``; ``merge`` puts them beside ktdeploy's own findings.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ktdeploy.core.recipe import catalog as cat
from ktdeploy.core.recipe.catalog_data import ENUM_CHOICES
from ktdeploy.core.recipe.finding import Finding
from ktdeploy.core.recipe.render import Rendered
from ktdeploy.core.recipe.train_keys import TrainKeys

MARKER = "KTDEPLOY_JUDGE "
SCHEMA = 1
EXIT_ACCEPTED, EXIT_REFUSED, EXIT_ABSENT, EXIT_BROKEN = 0, 2, 7, 1
JUDGE_SECONDS = 240       # inside: torch + transformers + LlamaFactory import (~10-20 s cold) and the three stages
MAX_PAYLOAD = 1 << 20     # the rendered files are a few KB
MAX_MESSAGE = 1500        # a refusal's message as quoted back
MAX_CONFIG = 512 << 10    # a model's config.json sent to the judge (a few KB; the payload limit is 1 MiB)
STAGES = ("accelerate", "llamafactory", "kt-kernel", "model")
STAGE_LABELS = {"accelerate": "accelerate-kt", "llamafactory": "LlamaFactory-KT", "kt-kernel": "kt-kernel",
                "model": "transformers"}

# Run by the image's own python3 (stdlib only until the judge is imported): a test double or an image built before
# the judge existed reports "absent" distinctly instead of a traceback.
BOOTSTRAP = r'''
import json, sys
MARK = "KTDEPLOY_JUDGE "
try:
    from ktdeploy.agent import stack_judge
except ImportError as e:
    name = getattr(e, "name", None) or "ktdeploy.agent.stack_judge"
    print(MARK + json.dumps({"schema": 1, "status": "absent", "missing": [name],
                             "detail": (type(e).__name__ + ": " + str(e))[:300]}), flush=True)
    sys.exit(7)
sys.exit(stack_judge.main(sys.argv[1:]))
'''.strip() + "\n"


@dataclass(frozen=True)
class ModelConfig:
    """The model's config.json as the controller found it (its text, and where from), for the model skeleton."""

    text: str
    source: str


def payload(rendered: Rendered, model_config: ModelConfig | None = None) -> str:
    """What the judge reads on stdin: the rendered files exactly as the launcher gets them, the launch env, and the
    model's config.json when the controller has one (the judge prefers the model's own directory where it runs)."""
    data: dict[str, Any] = {"schema": SCHEMA, "train_yaml": rendered.train_yaml,
                            "accelerate_yaml": rendered.accelerate_yaml, "launch_argv": list(rendered.launch_argv),
                            "env": dict(rendered.env)}
    if model_config is not None and len(model_config.text) <= MAX_CONFIG:
        data["model_config"] = {"text": model_config.text, "source": model_config.source}
    return json.dumps(data)


@dataclass(frozen=True)
class Refusal:
    stage: str            # accelerate | llamafactory | kt-kernel
    error_type: str       # the exception's class name
    message: str          # the real message
    where: str = ""       # the stack's function that raised
    key: str = ""         # the recipe key, when the judge knows it (the model skeleton's refusals)
    choices: tuple[str, ...] = ()   # what that key could name on this model (LoRA: its linear modules)


@dataclass
class JudgeResult:
    status: str                        # accepted | refused | absent | broken
    refusals: list[Refusal] = field(default_factory=list)
    stages: dict[str, str] = field(default_factory=dict)   # stage -> accepted | refused | not reached | skipped
    bypassed: list[str] = field(default_factory=list)      # GPU-only gates told what the target GPU host has
    versions: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)       # status absent: what the image lacks
    detail: str = ""                                       # status absent/broken: why
    seconds: float | None = None
    peak_rss_mib: float | None = None
    skeleton: dict[str, Any] = field(default_factory=dict)   # the model skeleton: status, source, steps, seconds

    @property
    def judged(self) -> bool:
        return self.status in ("accepted", "refused")

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "stages": self.stages, "bypassed": self.bypassed, "versions": self.versions,
                "missing": self.missing, "detail": self.detail, "seconds": self.seconds,
                "peak_rss_mib": self.peak_rss_mib, "skeleton": self.skeleton,
                "refusals": [r.__dict__ for r in self.refusals]}


def _text(v: Any, limit: int = MAX_MESSAGE) -> str:
    """Text from the image, made one printable line (a message may echo a recipe value: no control character or
    terminal escape reaches a screen or a record), bounded."""
    s = " ".join(str(v if v is not None else "").split("\n"))[:limit]
    return "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in s)


def parse_output(stdout: str, rc: int, stderr: str = "") -> JudgeResult:
    """The judge's answer (the last marker line), or why there is none."""
    line = next((ln for ln in reversed(stdout.splitlines()) if ln.startswith(MARKER)), None)
    if line is None:
        tail = [ln for ln in (stderr or stdout).strip().splitlines() if ln.strip()][-3:]
        why = " | ".join(tail)[-600:] or f"exit status {rc}, no output"
        return JudgeResult("broken", detail=f"the stack judge gave no answer ({why})")
    try:
        data = json.loads(line[len(MARKER):])
    except (ValueError, RecursionError):
        return JudgeResult("broken", detail="the stack judge's answer is not JSON")
    if not isinstance(data, dict):
        return JudgeResult("broken", detail="the stack judge's answer is not a JSON object")
    status = data.get("status")
    if status not in ("accepted", "refused", "absent", "broken"):
        return JudgeResult("broken", detail=f"the stack judge answered an unknown status {_text(status, 40)!r}")
    refusals = []
    for r in data.get("refusals") or []:
        if isinstance(r, dict) and r.get("stage") in STAGES:
            key = _text(r.get("key"), 120)
            raw = r.get("choices")
            choices: list[Any] = raw if isinstance(raw, list) else []
            refusals.append(Refusal(str(r["stage"]), _text(r.get("error_type"), 80), _text(r.get("message")),
                                    _text(r.get("where"), 200), key if _KEY.fullmatch(key) else "",
                                    tuple(_text(c, 80) for c in choices[:50])))
    if status == "refused" and not refusals:
        return JudgeResult("broken", detail="the stack judge refused without saying why")
    if status == "accepted" and refusals:
        status = "refused"

    def _strs(key: str) -> list[str]:
        v = data.get(key)
        return [_text(x, 300) for x in v][:50] if isinstance(v, list) else []

    def _num(key: str) -> float | None:
        v = data.get(key)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    stages: dict[str, Any] = data["stages"] if isinstance(data.get("stages"), dict) else {}
    versions: dict[str, Any] = data["versions"] if isinstance(data.get("versions"), dict) else {}
    return JudgeResult(status, refusals, {str(k)[:40]: _text(v, 120) for k, v in stages.items()}, _strs("bypassed"),
                       {str(k)[:60]: _text(v, 60) for k, v in versions.items()}, _strs("missing"),
                       _text(data.get("detail"), 600), _num("seconds"), _num("peak_rss_mib"),
                       _skeleton(data.get("skeleton")))


def _skeleton(v: Any) -> dict[str, Any]:
    """The model skeleton's summary, bounded: status/source text, steps, seconds, module count, LoRA targets."""
    if not isinstance(v, dict):
        return {}
    out: dict[str, Any] = {k: _text(v.get(k), 300) for k in ("status", "source") if v.get(k) is not None}
    if isinstance(v.get("steps"), dict):
        out["steps"] = {str(k)[:40]: _text(s, 300) for k, s in list(v["steps"].items())[:10]}
    for k in ("seconds", "modules"):
        if isinstance(v.get(k), (int, float)) and not isinstance(v.get(k), bool):
            out[k] = v[k]
    if isinstance(v.get("lora_targets"), list):
        out["lora_targets"] = [_text(t, 80) for t in v["lora_targets"][:50]]
    return out


# ---------------------------------------------------------------- refusals -> findings

# KTConfig / LlamaFactory names of values the recipe sets under another key.
_KT_FIELD_HOME = {
    "kt_lora_rank": "train.lora_rank", "kt_lora_alpha": "train.lora_alpha", "kt_lora_dropout": "train.lora_dropout",
    "lora_rank": "train.lora_rank", "lora_dropout": "train.lora_dropout",
    "kt_train_mode": "train.finetuning_type", "kt_full_weight_grad": "train.finetuning_type",
    "kt_activation_policy": "train.kt_cpu_activation", "activation_policy.cpu": "train.kt_cpu_activation",
    "kt_weight_path": "train.kt_weight_path", "kt_non_expert_weight_path": "train.kt_non_expert_weight_path",
    "kt_expert_checkpoint_path": "train.kt_expert_checkpoint_path",
    "kt_use_lora_experts": "train.kt_use_lora_experts", "kt_lora_expert_num": "train.kt_lora_expert_num",
    "kt_lora_expert_intermediate_size": "train.kt_lora_expert_intermediate_size",
    "FSDP1": "accelerate.fsdp_config.fsdp_version", "FSDP2": "accelerate.fsdp_config.fsdp_version",
    "fsdp_version": "accelerate.fsdp_config.fsdp_version",
    "threadpool_count": "train.kt_config.kt_threadpool_count",
}
_ENUM_FIELDS: dict[str, list[str]] = {}
for _field, (_enum, _values) in ENUM_CHOICES.items():
    _ENUM_FIELDS.setdefault(_enum, []).append(_field)
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
_UNUSED = re.compile(r"not used by the HfArgumentParser: \[([^\]]*)\]")
_UNKNOWN_KEYS = re.compile(r"unknown keys \(\[([^\]]*)\]\)")
_KEY = re.compile(r"(train|accelerate)(\.[A-Za-z_][A-Za-z0-9_]*){1,3}")


def _listed(text: str) -> list[str]:
    return [w.strip().strip("'\"") for w in text.split(",") if w.strip()]


def key_of(refusal: Refusal, train: dict[str, Any], accelerate: dict[str, Any]) -> str:
    """The recipe key a refusal is about: a key it names (HfArgumentParser's unused keys, accelerate's unknown
    keys, a `name` in the message), preferring one the recipe sets; the section when none is named."""
    if refusal.key:
        return refusal.key
    msg = refusal.message
    section = "accelerate" if refusal.stage == "accelerate" else "train"
    m = _UNUSED.search(msg)
    if m and _listed(m.group(1)):
        return f"train.{_listed(m.group(1))[0]}"
    m = _UNKNOWN_KEYS.search(msg)
    if m and _listed(m.group(1)):
        return f"accelerate.{_listed(m.group(1))[0]}"
    kt = TrainKeys(train).kt_config
    fsdp: dict[str, Any] = accelerate["fsdp_config"] if isinstance(accelerate.get("fsdp_config"), dict) else {}
    named: list[str] = []
    for word in _WORD.findall(msg):
        word = word.strip(".")
        if word in _KT_FIELD_HOME:
            named.append(_KT_FIELD_HOME[word])
        elif word in cat.KT_CONFIG_KEYS or word in kt:
            named.append(f"train.kt_config.{word}")
        elif word in fsdp or word in cat.FSDP_CONFIG_KEYS:
            named.append(f"accelerate.fsdp_config.{word}")
        elif section == "accelerate" and word in cat.ACCELERATE_KEY_SET:
            named.append(f"accelerate.{word}")
        elif section == "accelerate" and word in ("DistributedType", "SageMakerDistributedType"):
            named.append("accelerate.distributed_type")
        elif section == "train" and word in cat.TRAIN_KEY_SET:
            named.append(f"train.{word}")
        elif section == "train" and word in _ENUM_FIELDS:   # "X is not a valid SchedulerType"
            named += [f"train.{f}" for f in _ENUM_FIELDS[word]]
    if not named and refusal.stage == "accelerate" and "distributed_type" not in msg and (
            "FSDP" in msg or "distributed" in msg.lower() or "DistributedType" in msg):
        named.append("accelerate.distributed_type")
    if not named:
        return section

    def is_set(path: str) -> bool:
        node: Any = {"train": train, "accelerate": accelerate}
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True

    return next((p for p in named if is_set(p)), named[0])


def _fix(refusal: Refusal, path: str) -> str:
    stage = {"accelerate": "accelerate", "llamafactory": "LlamaFactory", "kt-kernel": "kt-kernel",
             "model": "transformers"}[refusal.stage]
    if refusal.stage == "accelerate" and "FSDP1" in refusal.message:
        return "set accelerate.fsdp_config.fsdp_version: 2 (accelerate starts FSDP1 when it is not set)"
    if path in _MODULE_FIXES:
        return _MODULE_FIXES[path] + (f" (this model's linear modules: {', '.join(refusal.choices)})"
                                      if refusal.choices else "")
    what = f"change {path}" if "." in path else f"change the {path} value the message names"
    return f"{what} as {stage}'s message asks (ktdeploy's own advice on the same recipe, if any, is listed beside it)"


# The model skeleton's refusals: what the key must name instead.
_MODULE_FIXES = {
    "train.lora_target": "set lora_target to module names this model has (comma-separated), or all (LlamaFactory "
                         "then targets every linear layer it finds)",
    "train.additional_target": "remove additional_target, or name modules this model has",
    "train.model_name_or_path": "check model_name_or_path and trust_remote_code: transformers could not build this "
                                "model from its config.json",
    "train.trust_remote_code": "set trust_remote_code: true: this model type is not in transformers, and only the "
                               "checkpoint's own code (its auto_map) builds it, which transformers runs only then",
}


def findings(result: JudgeResult, train: dict[str, Any], accelerate: dict[str, Any],
             where: Callable[[str], tuple[Any, Any]] = lambda path: (None, None)) -> list[Finding]:
    """One error per refusal, on the key it names (``where(path)`` -> (file, line) of that key)."""
    out = []
    for r in result.refusals:
        path = key_of(r, train, accelerate)
        file, line = where(path)
        label = STAGE_LABELS[r.stage]
        msg = f"{label} refuses it: {r.error_type}: {r.message}" + (f" ({r.where})" if r.where else "")
        out.append(Finding("error", path, msg, _fix(r, path), f"stack.{r.stage}", file, line))
    return out


def merge(own: list[Finding], stack: list[Finding]) -> list[Finding]:
    """ktdeploy's findings and the stack's, errors first, in file order (the same order `check` prints)."""
    return sorted([*own, *stack], key=lambda f: (f.severity != "error", f.file or "", f.line or 0, f.path))
