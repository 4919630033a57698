"""The standing adversarial suite (issue 16): hypothesis-generated hostile inputs at every CLI entry point.

Every class runs a fixed, derandomised set of examples in-process (see harness.py for the invariants) and fails
if any example broke one. Budget: the whole file stays well under a minute on a loaded 2-core machine."""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.adversarial.harness import SECRET, failures, invoke, problems, snapshot, tally

REPO = Path(__file__).resolve().parents[3]
TINY = (REPO / "recipes" / "tiny-moe-lora.yaml").read_text()
MODEL_CFG = json.loads((REPO / "recipes" / "models" / "tiny-qwen3-moe.json").read_text()) \
    if (REPO / "recipes" / "models" / "tiny-qwen3-moe.json").exists() else None

def _n(default: int) -> int:
    """Examples per class: the default keeps CI fast; KTDEPLOY_ADV_EXAMPLES=N runs N for every class."""
    return int(os.environ.get("KTDEPLOY_ADV_EXAMPLES", default))


SETTINGS = settings(max_examples=_n(20), deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))

ESCAPES = ["\x1b]0;PWNED\x07", "\x1b[2J", "\x9b31m", "\u202eevil", "\x7f", "\r\x1b[1A", "\x1bP+q\x1b\\", "\u2066x"]
META = ESCAPES + ["$(touch pwned)", "`touch pwned`", "a;touch pwned", "x\ntouch${IFS}pwned\nuse_unsloth: true\n#",
        "&a [*a]", "*a", "!!python/object:os.system", "{a: 1}", "'", '"', "\\", "\u2028use_unsloth: true", "\r\n#",
        "\x85x", "--privileged", "-o", "../../etc/passwd", "//srv/ktdeploy/models", "/srv/./ktdeploy/models/",
        "\ud800", "é🚀", "%s%n", "${HOME}", "a b", "", " ", "#", "key: value", "null", "~", "no", "yes", "0x1F"]
hostile_text = st.one_of(st.sampled_from(META), st.text(max_size=30))
NUMS = ["1e9", "1e400", "-1e400", ".nan", ".inf", "-.inf", "-1", "0", "9" * 400, "1e-400", "0x7fffffffffffffff",
        "3.5", "true", "'12'", "[]", "{}"]
hostile_number = st.one_of(st.sampled_from(NUMS), st.integers(min_value=-(10**20), max_value=10**20).map(str),
                           st.floats(allow_nan=True, allow_infinity=True).map(repr))


def _name_ok(s: str) -> bool:
    try:
        b = s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return bool(s) and "/" not in s and "\x00" not in s and s not in (".", "..") and len(b) < 200


hostile_name = st.one_of(st.sampled_from([m for m in META if _name_ok(m)]), st.text(min_size=1, max_size=20)) \
    .map(lambda s: s + ".yaml").filter(_name_ok)
KINDS = ["regular", "fifo", "devzero", "dir", "link-out", "dangling", "empty", "big", "latin1", "alias-bomb",
         "deep", "list"]

BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=False))


class Box:
    """A sandbox: root/work is where the command runs, root/outside must never change."""

    def __init__(self):
        self.root = Path(tempfile.mkdtemp(prefix="harden-adv-"))
        self.work = self.root / "work"
        self.outside = self.root / "outside"
        self.work.mkdir()
        self.outside.mkdir()
        (self.outside / "victim").write_text("keep me\n")
        (self.outside / "runs-victim" / "status.json").parent.mkdir(parents=True)
        (self.outside / "runs-victim" / "status.json").write_text(json.dumps({"id": "x", "state": "running",
                                                                               "host": "localhost"}))
        self.home = self.work / "home"
        os.environ["KTDEPLOY_HOME"] = str(self.home)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        os.environ.pop("KTDEPLOY_HOME", None)
        shutil.rmtree(self.root, ignore_errors=True)

    def make(self, name: str, kind: str, text: str = TINY) -> Path:
        p = self.work / name
        if kind == "regular":
            p.write_text(text, encoding="utf-8", errors="surrogatepass")
        elif kind == "fifo":
            os.mkfifo(p)
        elif kind == "devzero":
            p.symlink_to("/dev/zero")
        elif kind == "dir":
            p.mkdir()
        elif kind == "link-out":
            p.symlink_to(self.outside / "victim")
        elif kind == "dangling":
            p.symlink_to(self.outside / "nothing-here")
        elif kind == "empty":
            p.write_text("")
        elif kind == "big":
            p.write_bytes(b"#" * ((1 << 20) + 1))
        elif kind == "latin1":
            p.write_bytes("train: {a: 'é'}\n".encode("latin-1"))
        elif kind == "alias-bomb":
            p.write_text(BOMB)
        elif kind == "deep":
            p.write_text("[" * 5000 + "]" * 5000)
        elif kind == "list":
            p.write_text("- 1\n- 2\n")
        return p


def _recipe_with(key: str, value: str) -> str:
    """TINY with one `key: value` line replaced (value inserted verbatim, as hostile YAML text)."""
    lines = TINY.splitlines()
    for i, ln in enumerate(lines):
        if ln.strip().startswith(key + ":"):
            indent = ln[: len(ln) - len(ln.lstrip())]
            lines[i] = f"{indent}{key}: {value}"
            break
    return "\n".join(lines) + "\n"


KEYS = ["cutoff_len", "per_device_train_batch_size", "lora_rank", "output_dir", "model_name_or_path", "model",
        "output", "data", "dataset_dir", "num_processes", "gpus", "kt_max_cache_depth", "image", "save_steps"]


def _yaml11(text: str):
    """Read YAML the way LlamaFactory does (PyYAML, YAML 1.1) when PyYAML is installed, else with ruamel."""
    try:
        import yaml

        return yaml.safe_load(text)
    except ImportError:
        from ruamel.yaml import YAML

        return YAML(typ="safe", pure=True).load(text)


def _run_class(cls: str, fn) -> None:
    fn()
    bad = failures(cls)
    assert not bad, f"{len(bad)} hostile input(s) broke an invariant in {cls}:\n" + "\n".join(bad[:5])


def _one(cls: str, label: str, args: list[str], box: Box, allowed: tuple[str, ...] = (), secrets=(SECRET,),
         then=None):
    """One generated input = one tally entry: the invariants, plus ``then(rc, out)`` -> more problems, if given."""
    before = snapshot(box.root)
    rc, out, _ = invoke(args, cwd=box.work)
    after = snapshot(box.root)
    allowed = allowed + ("work/home",)
    bad = problems(rc, out, secrets=secrets, records=box.home, before=before, after=after, allowed=allowed)
    if then is not None:
        bad += then(rc, out)
    tally(cls, label, bad)
    return rc, out


# ---------------------------------------------------------------- check

@SETTINGS
@given(name=hostile_name, kind=st.sampled_from(KINDS), key=st.sampled_from(KEYS),
       value=st.one_of(hostile_text, hostile_number))
def _check(name, kind, key, value):
    with Box() as box:
        p = box.make(name, kind, _recipe_with(key, value))
        _one("check", f"{name} {kind} {key}={value}", ["check", p.name], box)


def test_check():
    _run_class("check", _check)


# ---------------------------------------------------------------- render

OUTS = ["out", "", " ", "link-out-dir", "under-file/x", "/proc/harden-x", "existing", "with-link", "with-dangling",
        "a;b", "$(x)", "-o"]


@SETTINGS
@given(name=hostile_name, kind=st.sampled_from(["regular"] * 4 + KINDS), out=st.one_of(
    st.sampled_from(OUTS), hostile_text.filter(lambda s: ".." not in s and not s.startswith(("/", "~", "-"))
                                               and s.strip() == s and s.split("/")[0] not in ("", "."))),
       value=hostile_text)
def _render(name, kind, out, value):
    with Box() as box:
        p = box.make(name, kind)
        (box.work / "a-file").write_text("x")
        if out == "link-out-dir":
            (box.work / out).symlink_to(box.outside)
        if out == "under-file/x":
            (box.work / "under-file").write_text("x")
        if out == "existing":
            (box.work / out).mkdir()
            (box.work / out / "train.yaml").write_text("mine\n")
        if out in ("with-link", "with-dangling"):
            (box.work / out).mkdir()
            target = box.outside / ("victim" if out == "with-link" else "new-file")
            (box.work / out / "launch.sh").symlink_to(target)
        allowed = ("work/out", "work/a;b", "work/$(x)", "work/-o") + (("work/" + out,) if out == "existing" else ())
        if out not in OUTS and out:
            allowed += ("work/" + out.split("/")[0],)

        def content(rc, _out):
            bad = []
            if rc == 0 and out == "out":
                launch = (box.work / out / "launch.sh").read_text().splitlines()
                # shebang, origin, set -eu, cd, CUDA_VISIBLE_DEVICES, the allocator default, exec: nothing else
                if len(launch) != 7 or not launch[1].startswith("# rendered by ktdeploy from ") \
                        or launch[5] != 'export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF-expandable_segments:True}"':
                    bad.append("launch.sh gained lines")
                train = _yaml11((box.work / out / "train.yaml").read_text())
                if "use_unsloth" in train or set(train) - set(_yaml11(TINY)["train"]):
                    bad.append("train.yaml gained keys")
            return bad

        _one("render", f"{name} {kind} -o {out!r}", ["render", p.name, "-o", out], box, allowed, then=content)


def test_render():
    _run_class("render", _render)


def test_render_name_injection_is_quoted_data(tmp_path):
    """The issue's example: a recipe named r<NL>touch${IFS}x<NL>use_unsloth: true<NL>#.yaml adds no line."""
    with Box() as box:
        name = "r\ntouch${IFS}x\nuse_unsloth: true\n#.yaml"
        box.make(name, "regular")
        rc, out, _ = invoke(["render", name, "-o", "out"], cwd=box.work)
        assert rc == 0, out
        launch = (box.work / "out" / "launch.sh").read_text().splitlines()
        assert len(launch) == 7 and not any(ln.startswith("touch") for ln in launch)
        assert "use_unsloth" not in {ln.split(":")[0] for ln in (box.work / "out" / "train.yaml").read_text().splitlines()}


# ---------------------------------------------------------------- plan

CFG_KEYS = ["num_hidden_layers", "hidden_size", "num_experts", "moe_intermediate_size", "num_experts_per_tok",
            "vocab_size", "num_attention_heads", "head_dim", "decoder_sparse_step", "mlp_only_layers"]


@SETTINGS
@given(key=st.sampled_from(CFG_KEYS), value=st.one_of(hostile_number, hostile_text.map(json.dumps)),
       rkey=st.sampled_from(["cutoff_len", "per_device_train_batch_size", "lora_rank", "kt_max_cache_depth"]),
       rvalue=hostile_number, kind=st.sampled_from(["regular"] * 6 + ["fifo", "devzero", "dir", "big", "deep"]))
def _plan(key, value, rkey, rvalue, kind):
    with Box() as box:
        recipe = box.make("r.yaml", "regular", _recipe_with(rkey, rvalue) if rvalue != "0" else TINY)
        cfg = dict(MODEL_CFG or {})
        text = json.dumps(cfg)
        try:
            v = json.loads(value) if not value.startswith(("1e4", "-1e4")) else value
            cfg[key] = v
            text = json.dumps(cfg, allow_nan=True)
        except ValueError:
            text = json.dumps(cfg)[:-1] + f', "{key}": {value}}}'
        c = box.make("config.json", kind, text)
        _one("plan", f"{key}={value} {rkey}={rvalue} {kind}", ["plan", recipe.name, "--model-config", c.name], box)


def test_plan():
    _run_class("plan", _plan)


def test_plan_layers_1e9_refused_at_once(tmp_path):
    with Box() as box:
        cfg = dict(MODEL_CFG, num_hidden_layers=1e9)
        box.make("config.json", "regular", json.dumps(cfg))
        box.make("r.yaml", "regular")
        rc, out, secs = invoke(["plan", "r.yaml", "--model-config", "config.json"], cwd=box.work)
        assert rc == 2 and "num_hidden_layers" in out and secs < 5


# ---------------------------------------------------------------- convert

def _st_bytes(header: dict | bytes, data: bytes = b"", claim: int | None = None) -> bytes:
    blob = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(blob) if claim is None else claim) + blob + data


shape_dim = st.one_of(st.integers(min_value=0, max_value=4), st.sampled_from([0, 2_000_000, 2**62, -1, 64]))
tensor_spec = st.fixed_dictionaries({
    "dtype": st.sampled_from(["BF16", "F32", "X", 3, None]),
    "shape": st.one_of(st.lists(shape_dim, max_size=4), st.just("abc"), st.none()),
    "data_offsets": st.one_of(st.lists(st.integers(min_value=-5, max_value=2**63), min_size=2, max_size=2),
                              st.just([0, 0]), st.none(), st.just("x")),
})
fused_names = st.sampled_from(["layers.0.experts.gate_lora_a", "layers.0.experts.up_lora_b", "layers.99999.experts.down_lora_a",
                               "x", "__metadata__"])
json_value = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30), st.text(max_size=8),
                       st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))


def _group(experts: int, rank: int, x: int, y: int) -> dict:
    """One layer's six fused expert-LoRA tensors with consistent shapes (lora_a [E, r, x], lora_b [E, y, r]); with
    x = y = 0 they hold no bytes at all, so any E fits in a tiny file: a lying header."""
    return {f"layers.0.experts.{p}_lora_{w}": {"dtype": "BF16", "shape": [experts, rank, x] if w == "a" else [experts, y, rank],
                                               "data_offsets": [0, 0]} for p in ("gate", "up", "down") for w in ("a", "b")}


lying_groups = st.builds(_group, st.sampled_from([0, 1, 2, 70_000, 2_000_000]), st.sampled_from([0, 1, 64, 2**40]),
                         st.just(0), st.just(0))


@SETTINGS
@given(tensors=st.one_of(st.dictionaries(fused_names, tensor_spec, max_size=3), lying_groups), claim=st.one_of(st.none(), st.sampled_from(
    [0, 7, 2**63, 2**40])), data=st.binary(max_size=64), config=st.dictionaries(
    st.sampled_from(["r", "lora_alpha", "use_rslora", "target_modules", "base_model_name_or_path"]), json_value, max_size=4),
    out=st.sampled_from(["adapter", "", "link", "in"]), raw=st.one_of(st.none(), st.binary(max_size=40)),
    fused_kind=st.sampled_from(["regular"] * 5 + ["fifo", "devzero", "dir"]),
    manifest=st.one_of(st.none(), json_value, st.dictionaries(st.sampled_from(["lora", "base", "files", "rank"]),
                                                              json_value, max_size=3)),
    adapter=st.one_of(st.none(), st.dictionaries(st.sampled_from(
        ["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", "m.mlp.experts.0.x", "plain"]),
        tensor_spec, max_size=2)), config_raw=st.one_of(st.none(), json_value))
def _convert(tensors, claim, data, config, out, raw, fused_kind, manifest, adapter, config_raw):
    with Box() as box:
        src = box.work / "run"
        src.mkdir()
        if fused_kind == "regular":
            (src / "fused_expert_lora.safetensors").write_bytes(raw if raw is not None else _st_bytes(tensors, data, claim))
        else:
            box.make("run/fused_expert_lora.safetensors", fused_kind)
        (src / "adapter_config.json").write_text(json.dumps(config if config_raw is None else config_raw))
        if manifest is not None:
            (src / "kt_adapter_manifest.json").write_text(json.dumps(manifest))
        if adapter is not None:
            (src / "adapter_model.safetensors").write_bytes(_st_bytes(adapter, data))
        if out == "link":
            (box.work / "link").symlink_to(box.outside)
        target = "run/in" if out == "in" else out
        _one("convert", f"{tensors} claim={claim} {config} {config_raw} m={manifest} a={adapter} -o {out!r} {fused_kind}",
             ["convert", "run", "-o", target], box, allowed=("work/adapter", "work/run"))


def test_convert():
    _run_class("convert", _convert)


def test_convert_lying_header_refused_at_once():
    """600 bytes claiming 2,000,000 x 64 x 64 (zero-size) experts: refused, nothing written."""
    with Box() as box:
        src = box.work / "run"
        src.mkdir()
        hdr = _group(2_000_000, 64, 0, 0)
        (src / "fused_expert_lora.safetensors").write_bytes(_st_bytes(hdr))
        (src / "adapter_config.json").write_text(json.dumps({"r": 64, "lora_alpha": 16}))
        rc, out, secs = invoke(["convert", "run", "-o", "adapter"], cwd=box.work)
        assert rc not in (0, 70) and secs < 5, out
        assert not (box.work / "adapter").exists()


# ---------------------------------------------------------------- doctor's host parsing and secrets

host_text = st.one_of(hostile_text, st.builds(lambda u, h, p: f"ssh://{u}:{SECRET}{p}@{h}:1",
                                              st.sampled_from(["u", "", "root", "a b", "$(x)"]),
                                              st.sampled_from(["127.0.0.1", "[::1]", "h;x", "-oProxyCommand=x", ""]),
                                              st.sampled_from(["", ";x", "'", "%40", ":colon"])))


@SETTINGS
@given(host=host_text)
def _hosts(host):
    from ktdeploy.controller.connectors import connect
    from ktdeploy.core.errors import KtdeployError

    try:
        from ktdeploy.core.safeio import redact  # what the CLI applies before printing an error
    except ImportError:  # code from before issue 16 (the suite's "before" figures were made that way)
        def redact(text):
            return text

    bad = []
    try:
        conn = connect(host)
        if SECRET in repr(getattr(conn, "name", "")) or SECRET in repr(vars(conn)):
            bad.append("secret kept by the connector")
    except KtdeployError as err:
        if SECRET in redact(err.message) or SECRET in redact(err.fix or ""):
            bad.append("secret in the error")
    except Exception as err:  # noqa: BLE001
        bad.append(f"{type(err).__name__} escaped connect()")
    tally("doctor-host", host, bad)


def test_doctor_host_parsing():
    _run_class("doctor-host", _hosts)


@settings(SETTINGS, max_examples=_n(12))
@given(host=host_text.filter(lambda h: SECRET in h), cmd=st.sampled_from(["up", "doctor"]))
def _secrets(host, cmd):
    with Box() as box:
        box.make("r.yaml", "regular")
        args = ["up", "--dry-run", "--host", host, "r.yaml"] if cmd == "up" else ["doctor", "--host", host]
        _one("secrets", f"{cmd} {host}", args, box)


def test_secrets_never_recorded():
    _run_class("secrets", _secrets)


# ---------------------------------------------------------------- up --dry-run

@settings(SETTINGS, max_examples=_n(12))
@given(key=st.sampled_from(KEYS), value=st.one_of(hostile_text, hostile_number), kind=st.sampled_from(
    ["regular"] * 4 + ["fifo", "devzero", "alias-bomb", "link-out"]))
def _up(key, value, kind):
    with Box() as box:
        p = box.make("r.yaml", kind, _recipe_with(key, value))
        _one("up-dry-run", f"{key}={value} {kind}", ["up", "--dry-run", "--host", "localhost", p.name], box)


def test_up_dry_run():
    _run_class("up-dry-run", _up)


# ---------------------------------------------------------------- status / logs / down --run

run_ids = st.one_of(hostile_text.filter(lambda s: s != ""),
                    st.sampled_from(["../../../outside/runs-victim", "../../../outside", "/etc", "..", ".",
                                     "20260101-x", "../../" * 20 + "tmp", "x/../../../../outside/runs-victim", "corrupt"]),
                    st.just(None).map(lambda _: "../../../outside/runs-victim"))


@SETTINGS
@given(run=run_ids, cmd=st.sampled_from(["status", "logs", "down"]), corrupt=st.booleans())
def _runs(run, cmd, corrupt):
    with Box() as box:
        runs = box.home / "runs"
        (runs / "20260101-000000-good-abc").mkdir(parents=True)
        (runs / "20260101-000000-good-abc" / "status.json").write_text(json.dumps(
            {"id": "20260101-000000-good-abc", "state": "dry-run", "host": "localhost", "created": 1}))
        if corrupt:
            (runs / "corrupt").mkdir()
            (runs / "corrupt" / "status.json").write_text("{not json")
        def more(rc, _out):
            bad = []
            if ("/" in run or run in (".", "..")) and rc != 2:  # a path must be refused as a usage error
                bad.append(f"--run accepted a path (exit {rc}, not 2)")
            if cmd == "status" and corrupt:  # one corrupt record must not stop the listing
                rc2, out2, _ = invoke(["status", "--all"], cwd=box.work)
                bad += [f"status --all: {b}" for b in problems(rc2, out2)] + ([] if rc2 == 0 else [f"status --all rc {rc2}"])
            return bad

        # runs/<id> -> the sandbox's outside/runs-victim is three levels up: a path must never reach it
        _one("runs", f"{cmd} --run {run!r} corrupt={corrupt}", [cmd, "--run", run], box, then=more)


def test_runs_by_id():
    _run_class("runs", _runs)


# ---------------------------------------------------------------- tune, serve --print

@settings(SETTINGS, max_examples=_n(15))
@given(kind=st.sampled_from(KINDS), key=st.sampled_from(KEYS), value=st.one_of(hostile_text, hostile_number),
       workdir=st.sampled_from(["", "wd", "link-out-dir", "/proc/harden"]))
def _tune(kind, key, value, workdir):
    with Box() as box:
        p = box.make("r.yaml", kind, _recipe_with(key, value))
        if workdir == "link-out-dir":
            (box.work / workdir).symlink_to(box.outside)
        args = ["tune", p.name, "--budget-minutes", "1"] + (["--workdir", workdir] if workdir else [])
        _one("tune", f"{kind} {key}={value} wd={workdir}", args, box, allowed=("work/wd",))


def test_tune():
    _run_class("tune", _tune)


@settings(SETTINGS, max_examples=_n(15))
@given(kind=st.sampled_from(["regular"] * 3 + KINDS), adapter=st.sampled_from(
    ["adapter", "", "missing", "/dev/zero", "link-out", "a;b"]), cfg=st.one_of(st.just("{}"), hostile_text),
    key=st.sampled_from(KEYS), value=st.one_of(hostile_text, hostile_number))
def _serve(kind, adapter, cfg, key, value):
    with Box() as box:
        p = box.make("r.yaml", kind, _recipe_with(key, value))
        if adapter == "adapter":
            (box.work / "adapter").mkdir()
            (box.work / "adapter" / "adapter_config.json").write_text(cfg)
        if adapter == "link-out":
            (box.work / adapter).symlink_to(box.outside)
        _one("serve-print", f"{kind} {key}={value} --adapter {adapter!r} cfg={cfg!r}",
             ["serve", p.name, "--adapter", adapter, "--print", "--kt-cpuinfer", "4", "--kt-threadpool-count", "1"], box)


def test_serve_print():
    _run_class("serve-print", _serve)


# ---------------------------------------------------------------- serve settings and volumes (issue 35)

SERVE_KEYS = ["deploy.serve.api_key_env", "deploy.serve.host", "deploy.serve.served_model_name",
              "deploy.serve.lora_name", "deploy.serve.extra_args", "deploy.volumes.data", "deploy.volumes.model",
              "train.model_name_or_path"]
ENV_NAMES = ["AWS_SECRET_ACCESS_KEY", "OPENAI_API_KEY", "HOME", "PATH", "KTDEPLOY_HOME", "KTDEPLOY_API_KEY",
             "KTDEPLOY_SERVE_KEY", "ktdeploy_api_key", "SSH_AUTH_SOCK", "GITHUB_TOKEN", "KTDEPLOY_KEY"]
FLAGS = ["-x", "--api-key", "-api-key", "--", "-", "-1", "--host=0.0.0.0", "-h", "--enable-lora", "-tp"]


@settings(SETTINGS, max_examples=_n(25))
@given(key=st.sampled_from(SERVE_KEYS), value=st.one_of(st.sampled_from(ENV_NAMES + FLAGS), hostile_text,
                                                        st.sampled_from(["/", "/srv/ktdeploy/models",
                                                                         "/srv/ktdeploy/output", "//srv/ktdeploy/output/"])))
def _serve_settings(key, value):
    import re

    with Box() as box:
        box.make("r.yaml", "regular")
        if key == "deploy.serve.extra_args":
            setting = f"{key}={json.dumps([value, 'v'])}"
        elif key == "train.model_name_or_path":
            setting = f"{key}={json.dumps('/srv/ktdeploy/models/' + value)}"
        else:
            setting = f"{key}={json.dumps(value)}"

        def more(rc, _out):
            bad = []
            if rc != 0:
                return bad
            if key == "deploy.serve.api_key_env" and not re.match(r"^KTDEPLOY_[A-Z0-9_]*KEY[A-Z0-9_]*$", value):
                bad.append(f"api_key_env {value!r} passed check")
            flagged = value.startswith("-") and not re.match(r"^-\d+(\.\d+)?$", value)
            one_dash = flagged and not value.startswith("--")   # extra_args may hold long options, never these
            if (key in ("deploy.serve.host", "deploy.serve.served_model_name", "deploy.serve.lora_name") and flagged) \
                    or (key == "deploy.serve.extra_args" and one_dash):
                bad.append(f"{key} {value!r} passed check")
            if key == "deploy.volumes.data" and value in ("/", "/srv/ktdeploy/models", "/srv/ktdeploy/output",
                                                          "//srv/ktdeploy/output/"):
                bad.append(f"data volume {value!r} passed check")
            return bad

        _one("serve-settings", f"{setting}", ["check", "r.yaml", "--set", setting], box, then=more)


def test_serve_settings():
    _run_class("serve-settings", _serve_settings)


# ---------------------------------------------------------------- convert: values it cannot serve (issue 35)

def _fused_group(dtype: str, fill: bytes, shapes: dict) -> tuple[dict, bytes]:
    size = {"BF16": 2, "F16": 2, "F32": 4, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I32": 4}[dtype]
    header, data = {}, b""
    for key, shape in shapes.items():
        proj, ab = key.split("_")
        n = shape[0] * shape[1] * shape[2] * size
        raw = (fill * n)[:n]
        header[f"layers.0.experts.{proj}_lora_{ab}"] = {"dtype": dtype, "shape": shape,
                                                       "data_offsets": [len(data), len(data) + n]}
        data += raw
    return header, data


SHAPES = {"gate_a": [2, 2, 4], "up_a": [2, 2, 4], "down_a": [2, 2, 3],
          "gate_b": [2, 3, 2], "up_b": [2, 3, 2], "down_b": [2, 4, 2]}


@settings(SETTINGS, max_examples=_n(25))
@given(dtype=st.sampled_from(["BF16", "F16", "F32", "I8", "U8", "BOOL", "F8_E4M3", "F8_E5M2", "I32"]),
       fill=st.sampled_from([b"\x00", b"\x3c\x3c", b"\xc0\x7f", b"\x80\x7f", b"\x00\x00\x80\x7f", b"\x01",
                             b"\x7c\x00"]),
       tweak=st.sampled_from([None, ("up_b", [2, 5, 2]), ("down_a", [2, 2, 7]), ("down_b", [2, 9, 2]),
                              ("gate_a", [2, 2, 6])]),
       module=st.sampled_from(["q_proj", "", "q proj", "q\x1b[2Jproj", "q_proj#", "o_proj"]))
def _convert_values(dtype, fill, tweak, module):
    with Box() as box:
        shapes = dict(SHAPES)
        if tweak:
            shapes[tweak[0]] = tweak[1]
        header, data = _fused_group(dtype, fill, shapes)
        src = box.work / "run"
        src.mkdir()
        (src / "fused_expert_lora.safetensors").write_bytes(_st_bytes(header, data))
        (src / "adapter_config.json").write_text(json.dumps({"r": 2, "lora_alpha": 4}))
        name = f"base_model.model.model.layers.0.self_attn.{module}.lora_A.weight"
        (src / "adapter_model.safetensors").write_bytes(_st_bytes(
            {name: {"dtype": "BF16", "shape": [2, 4], "data_offsets": [0, 16]}}, b"\x3c\x3c" * 8))

        def more(rc, _out):
            servable = dtype in ("BF16", "F16", "F32") and tweak is None and module in ("q_proj", "o_proj")
            if rc == 0 and not servable:
                return [f"published {dtype} fill={fill!r} tweak={tweak} module={module!r}"]
            if rc == 0 and dtype in ("BF16", "F16", "F32"):
                size = 2 if dtype != "F32" else 4
                mask = {"BF16": 0x7F80, "F16": 0x7C00, "F32": 0x7F800000}[dtype]
                word = int.from_bytes((fill * size)[:size], "little")
                if word & mask == mask:
                    return [f"published NaN/Inf values ({dtype} {fill!r})"]
            return []

        _one("convert-values", f"{dtype} {fill!r} {tweak} {module!r}", ["convert", "run", "-o", "adapter"], box,
             allowed=("work/adapter", "work/run"), then=more)


def test_convert_values():
    _run_class("convert-values", _convert_values)


# ---------------------------------------------------------------- image load: archives read two ways (issue 45)

ARCHIVE_NAMES = ["manifest.json", "./manifest.json", "a/../manifest.json", "manifest.json/", "d/manifest.json",
                 "repositories", "index.json", "c.json", "l/layer.tar", "l", "d", "MANIFEST.JSON", "manifest.json\x00x",
                 "/manifest.json", "a//manifest.json", " manifest.json", "../manifest.json", "é.json"]
ARCHIVE_KINDS = ["file", "file", "dir", "symlink", "hardlink", "v7", "gnu", "nul-checksum", "pax-path", "pax-junk",
                 "fifo"]
MANIFEST_KEYS = ["RepoTags", "repotags", "REPOTAGS", "RepoTag\u017f", "Repotags", "RepoTags"]


@st.composite
def archive_entries(draw):
    """docker save's layout (a config, a layer, manifest.json) with 0-3 entries added anywhere: some harmless (a
    file, a folder, a layer link as docker writes it, a pax name), most hostile (ARCHIVE_NAMES x ARCHIVE_KINDS)."""
    from tests.unit.adversarial import hostile_archives as ha

    def manifest(key: str, tags: list[str]) -> bytes:
        return json.dumps([{"Config": "c.json", key: tags, "Layers": ["l/layer.tar"]}]).encode()

    tags = draw(st.lists(st.sampled_from(["ktdeploy-adv:amx", "ubuntu:22.04", "docker.io/library/ktdeploy-adv:avx2",
                                          "ktdeploy-adv:amx@sha256:" + "0" * 64]), max_size=2))
    parts = [ha.entry("c.json", b"{}"), ha.entry("l/", kind=b"5"), ha.entry("l/layer.tar", bytes(1024)),
             ha.entry("manifest.json", manifest(draw(st.sampled_from(MANIFEST_KEYS)), tags))]
    harmless = [ha.entry("extra.json", b"{}"), ha.entry("e/", kind=b"5"),
                ha.entry("l2/", kind=b"5") + ha.entry("l2/layer.tar", kind=b"2", link="../l/layer.tar"),
                ha.pax({"path": "p.json"}) + ha.entry("other", b"{}"),
                ha.entry("repositories", json.dumps({"ktdeploy-adv": {"amx": "x"}}).encode())]
    for _ in range(draw(st.integers(0, 3))):
        if draw(st.booleans()):
            part = draw(st.sampled_from(harmless))
        else:
            name, kind = draw(st.sampled_from(ARCHIVE_NAMES)), draw(st.sampled_from(ARCHIVE_KINDS))
            body = manifest(draw(st.sampled_from(MANIFEST_KEYS)), ["ubuntu:22.04"])
            link = draw(st.sampled_from(["c.json", "manifest.json", "../x", "/etc/passwd", "."]))
            try:
                part = _hostile_part(name, kind, body, link)
            except (UnicodeEncodeError, ValueError):
                continue
        parts.insert(draw(st.integers(0, len(parts))), part)
    return b"".join(parts) + ha.end() + draw(st.sampled_from([b"", bytes(10240), bytes(512), b"\x01" * 512]))


def _hostile_part(name: str, kind: str, body: bytes, link: str) -> bytes:
    from tests.unit.adversarial import hostile_archives as ha

    if kind in ("dir", "symlink", "hardlink", "fifo"):
        return ha.entry(name, kind={"dir": b"5", "symlink": b"2", "hardlink": b"1", "fifo": b"6"}[kind], link=link)
    if kind in ("pax-path", "pax-junk"):
        return ha.pax({"path" if kind == "pax-path" else "GNU.sparse.name": name}) + ha.entry("other", body)
    extra = {"file": {}, "v7": {"prefix": "zz", "magic": bytes(8)}, "gnu": {"magic": b"ustar  \x00"},
             "nul-checksum": {"checksum": "nul-first"}}[kind]
    return ha.entry(name, body, **extra)


def _second_reading(path: Path) -> tuple[list[tuple[str, bytes]], set[str]] | None:
    """Python's tarfile, a lenient reader: every member (cleaned name, type), manifest.json's exact RepoTags and
    the names in repositories."""
    import posixpath
    import tarfile

    def read(t: tarfile.TarFile, name: str, empty: object) -> object:
        f = t.extractfile(t.getmember(name)) if name in t.getnames() else None
        return json.loads(f.read()) if f is not None else empty

    try:
        with tarfile.open(path) as t:
            members = [(posixpath.normpath(m.name), m.type) for m in t]
            manifest, repos = read(t, "manifest.json", []), read(t, "repositories", {})
    except (tarfile.TarError, OSError, ValueError, KeyError):
        return None
    tags = {str(x) for e in manifest if isinstance(e, dict) for x in (e.get("RepoTags") or [])} \
        if isinstance(manifest, list) else set()
    tags |= {f"{r}:{tag}" for r, ts in repos.items() for tag in ts} if isinstance(repos, dict) else set()
    return members, tags


@settings(SETTINGS, max_examples=_n(40))
@given(data=archive_entries())
def _image_archive(data):
    from ktdeploy.controller.images.archive import archive_tags, normalise
    from ktdeploy.core.errors import ImageError

    with Box() as box:
        (box.work / "a.tar").write_bytes(data)
        calls = box.root / "docker-calls"

        def more(rc, _out):
            loaded = calls.exists() and "load" in calls.read_text()
            try:
                ours = archive_tags(box.work / "a.tar")
            except ImageError:
                return ["the engine was asked to load an archive the reading refuses"] if loaded else []
            asked = ours <= {"ktdeploy-adv:amx", "ktdeploy-adv:avx2"}
            bad = [] if (rc == 0 and loaded) == asked and (rc == 5 or asked) else \
                [f"names {sorted(ours)}: exit {rc}, {'loaded' if loaded else 'not loaded'}"]
            second = _second_reading(box.work / "a.tar")
            if second is None:
                return bad + ["an archive ktdeploy accepts, Python's tarfile cannot read"]
            members, tags = second
            if len({n for n, _k in members}) != len(members):
                bad.append(f"accepted with a name twice in Python's reading: {members}")
            if {normalise(t) for t in tags} != ours:
                bad.append(f"two readings of the names: ours {sorted(ours)}, tarfile's {sorted(tags)}")
            return bad

        old = os.environ["PATH"]
        os.environ["PATH"] = f"{box.root / 'bin'}{os.pathsep}{old}"
        (box.root / "bin").mkdir()
        (box.root / "bin" / "docker").write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
        (box.root / "bin" / "docker").chmod(0o755)
        try:
            _one("image-archive", repr(data[:120]), ["image", "load", "a.tar", "--repo", "ktdeploy-adv"], box,
                 allowed=("docker-calls",), then=more)
        finally:
            os.environ["PATH"] = old


def test_image_archive():
    _run_class("image-archive", _image_archive)


# ---------------------------------------------------------------- the CLI's own contract

@pytest.mark.parametrize("args,code", [(["--bogus"], 2), ([], 2), (["render", "x.yaml"], 2), (["--version"], 0),
                                       (["check", "--json", "--json", "--nope"], 2)])
def test_usage_errors_exit_2_not_70(args, code, tmp_path):
    rc, out, _ = invoke(args, cwd=tmp_path)
    assert rc == code, out
    assert "internal error" not in out
    if args == ["--version"]:
        assert out.startswith("ktdeploy ")


# ---------------------------------------------------------------- SIGINT

def test_ctrl_c_in_a_command_exits_130(tmp_path, monkeypatch):
    import ktdeploy.core.recipe

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(ktdeploy.core.recipe, "validate", interrupted)
    monkeypatch.setattr("ktdeploy.cli.recipe_cmds.validate", interrupted)
    (tmp_path / "r.yaml").write_text(TINY)
    rc, out, _ = invoke(["check", "r.yaml"], cwd=tmp_path)
    assert rc == 130 and out.strip() == "interrupted"


def test_ctrl_c_during_start_up_exits_130(tmp_path):
    """SIGINT while the CLI still imports its command modules: one line, exit 130, no traceback."""
    import subprocess
    import sys

    code = ("import sys, importlib.abc\n"
            "class Stop(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'ktdeploy.cli.tune_cmds':\n"
            "            raise KeyboardInterrupt\n"
            "sys.meta_path.insert(0, Stop())\n"
            "from ktdeploy.cli import main\n"
            "main(['--version'])\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert p.returncode == 130, p.stderr
    assert p.stderr.strip() == "interrupted" and "Traceback" not in p.stderr
