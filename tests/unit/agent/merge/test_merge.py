"""ktdeploy merge on real-layout tensors (tests/fakes/kt_layout.py): values, files, manifest, refusals, resume.

The reference here is written independently of the merge: its own safetensors reader, its own name mapping
(expert e of layer L <-> slice e of the fused tensor), the documented float32 steps in one numpy expression."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ktdeploy.agent.merge import MergeError, merge
from ktdeploy.agent.merge.run import JOURNAL, MERGE_MANIFEST, STAGING_SUFFIX
from ktdeploy.core.errors import OverwriteRefused
from tests.fakes import kt_layout as kl

MINI = {"hidden": 64, "layers": 2, "experts": 4, "moe_inter": 32, "heads": 2, "kv_heads": 1, "head_dim": 32,
        "vocab": 128, "top_k": 2}
REPO = Path(__file__).resolve().parents[4]
NP = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32, "F8_E4M3": np.uint8}


def read(path: Path) -> tuple[dict[str, tuple[str, np.ndarray]], bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, spec in header.items():
        b, e = spec["data_offsets"]
        out[name] = (spec["dtype"], np.frombuffer(raw[8 + n + b:8 + n + e], dtype=NP[spec["dtype"]]).reshape(spec["shape"]))
    return out, raw[:8 + n]


def read_dir(d: Path) -> dict[str, tuple[str, np.ndarray]]:
    out: dict = {}
    for p in sorted(d.glob("*.safetensors")):
        out.update(read(p)[0])
    return out


def assert_merged(got: np.ndarray, ref: np.ndarray, name: str) -> None:
    """BF16 bits ``got`` vs the float32 reference: the same bits almost everywhere (BLAS may sum the r products in
    another order), and everywhere within one BF16 rounding of the reference (plus f32 noise on cancellation)."""
    want = bf16(ref)
    assert np.mean(got == want) >= 0.999, name
    g = f32("BF16", got)
    assert np.all(np.abs(g - ref) <= np.abs(ref) * 2.0 ** -8 + 1e-6), name


def f32(dt: str, a: np.ndarray) -> np.ndarray:
    if dt == "BF16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def bf16(x: np.ndarray) -> np.ndarray:
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def lora_of(name: str, fused, peft):
    """(A, B) as float32 for a per-expert or PEFT-targeted base tensor name, else None."""
    m = re.match(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$", name)
    if m:
        L, e, p = m.group(1), int(m.group(2)), m.group(3)
        return (f32(*fused[f"layers.{L}.experts.{p}_lora_a"])[e], f32(*fused[f"layers.{L}.experts.{p}_lora_b"])[e])
    key = f"base_model.model.{name.removesuffix('.weight')}"
    if f"{key}.lora_A.weight" in peft:
        return f32(*peft[f"{key}.lora_A.weight"]), f32(*peft[f"{key}.lora_B.weight"])
    return None


@pytest.fixture
def pair(tmp_path):
    """A MINI base (per-expert, 2 shards, BF16) and a random-valued KT adapter for it."""
    kl.write_base_model(str(tmp_path / "base"), m=MINI, shards=2)
    kl.write_lora_adapter(str(tmp_path / "out"), base=str(tmp_path / "base"), m=MINI, seed=3)
    return tmp_path / "out", tmp_path / "base"


def test_merged_values_names_files_and_manifest(pair, tmp_path):
    out, base = pair
    s = merge(out, base, tmp_path / "merged")
    dst = tmp_path / "merged"
    assert (s.rank, s.lora_alpha, s.scale, s.layout) == (8, 16.0, 2.0, "per-expert")
    assert (s.expert_layers, s.num_experts, s.expert_tensors, s.nonexpert_tensors) == (2, 4, 2 * 4 * 3, 2 * 5)
    base_t, got = read_dir(base), read_dir(dst)
    fused, _ = read(out / "fused_expert_lora.safetensors")
    peft, _ = read(out / "adapter_model.safetensors")
    assert list(got) == list(base_t)                          # same names, same order
    same = total = changed = 0
    for name, (dt, w) in base_t.items():
        gdt, g = got[name]
        assert gdt == dt and g.shape == w.shape
        ab = lora_of(name, fused, peft)
        if ab is None:
            assert np.array_equal(g, w), name                 # untouched tensors: bit for bit
            continue
        a, b = ab
        ref32 = f32(dt, w) + (b @ a) * np.float32(2.0)
        assert_merged(g, ref32, name)
        ref = bf16(ref32)
        same += int(np.count_nonzero(g == ref))
        total += g.size
        changed += int(np.count_nonzero(g != w))
    assert same / total >= 0.9999 and changed / total > 0.5
    # shards keep the base's header byte for byte (tensor names, dtypes, offsets, metadata)
    for p in base.glob("*.safetensors"):
        assert read(dst / p.name)[1] == read(p)[1]
    # the other files: copied; the index covers every tensor; the manifest hashes every input and output file
    for f in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (dst / f).read_bytes() == (base / f).read_bytes()
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(base_t)
    assert index["metadata"]["total_size"] == sum(a.nbytes for _, a in got.values())
    man = json.loads((dst / MERGE_MANIFEST).read_text())
    files = sorted(p.name for p in dst.iterdir() if p.name != MERGE_MANIFEST)
    assert sorted(man["output"]["files"]) == files
    for name, rec in man["output"]["files"].items():
        assert rec == {"size": (dst / name).stat().st_size, "sha256": hashlib.sha256((dst / name).read_bytes()).hexdigest()}
    for name, rec in man["base"]["files"].items():
        assert rec["sha256"] == hashlib.sha256((base / name).read_bytes()).hexdigest(), name
    for name, rec in man["adapter"]["files"].items():
        assert rec["sha256"] == hashlib.sha256((out / name).read_bytes()).hexdigest(), name
    assert man["scale"] == 2.0 and "one rounding" in man["arithmetic"]
    assert not list(tmp_path.glob(f".*{STAGING_SUFFIX}"))          # the staging folder became the output


def test_fused_expert_layout_takes_gate_then_up_rows(tmp_path):
    kl.write_base_model(str(tmp_path / "base"), m=MINI, shards=1, layout="fused")
    kl.write_lora_adapter(str(tmp_path / "out"), base="b", m=MINI, seed=4)
    s = merge(tmp_path / "out", tmp_path / "base", tmp_path / "m")
    assert s.layout == "fused" and s.expert_tensors == 2 * 2
    base_t, got = read_dir(tmp_path / "base"), read_dir(tmp_path / "m")
    fused, _ = read(tmp_path / "out" / "fused_expert_lora.safetensors")
    E, I = MINI["experts"], MINI["moe_inter"]  # noqa: E741
    for L in range(MINI["layers"]):
        dt, w = base_t[f"model.layers.{L}.mlp.experts.gate_up_proj"]
        ww = f32(dt, w).copy()
        dn_dt, dn = base_t[f"model.layers.{L}.mlp.experts.down_proj"]
        dd = f32(dn_dt, dn).copy()
        for e in range(E):
            for p, rows in (("gate", slice(0, I)), ("up", slice(I, 2 * I))):
                a = f32(*fused[f"layers.{L}.experts.{p}_lora_a"])[e]
                b = f32(*fused[f"layers.{L}.experts.{p}_lora_b"])[e]
                ww[e, rows] = ww[e, rows] + (b @ a) * np.float32(2.0)
            a = f32(*fused[f"layers.{L}.experts.down_lora_a"])[e]
            b = f32(*fused[f"layers.{L}.experts.down_lora_b"])[e]
            dd[e] = dd[e] + (b @ a) * np.float32(2.0)
        for name, ref in ((f"model.layers.{L}.mlp.experts.gate_up_proj", ww), (f"model.layers.{L}.mlp.experts.down_proj", dd)):
            assert_merged(got[name][1], ref, name)


def test_fp8_base_is_dequantized_to_bf16(tmp_path):
    kl.write_base_model(str(tmp_path / "base"), m=MINI, shards=2, fp8_block=16)
    kl.write_lora_adapter(str(tmp_path / "out"), base="b", m=MINI, seed=5)
    s = merge(tmp_path / "out", tmp_path / "base", tmp_path / "m")
    assert s.fp8_dequantized > 0 and any("BF16" in n for n in s.notes)
    base_t, got = read_dir(tmp_path / "base"), read_dir(tmp_path / "m")
    fused, _ = read(tmp_path / "out" / "fused_expert_lora.safetensors")
    peft, _ = read(tmp_path / "out" / "adapter_model.safetensors")
    assert not any(n.endswith("_scale_inv") for n in got)
    from ktdeploy.agent.merge.arith import FP8_TABLE

    for name, (dt, w) in base_t.items():
        if name.endswith("_scale_inv"):
            continue
        gdt, g = got[name]
        ab = lora_of(name, fused, peft)
        if dt != "F8_E4M3":                                   # BF16 tensors (the router) stay BF16
            assert gdt == dt
            if ab is None:
                assert np.array_equal(g, w), name
            else:
                assert_merged(g, f32(dt, w) + (ab[1] @ ab[0]) * np.float32(2.0), name)
            continue
        assert gdt == "BF16"
        sc = base_t[name + "_scale_inv"][1]
        full = np.repeat(np.repeat(sc, 16, 0), 16, 1)[:w.shape[0], :w.shape[1]]
        deq = (FP8_TABLE[w].astype(np.float64) * full.astype(np.float64)).astype(np.float32)
        ref = deq if ab is None else deq + (ab[1] @ ab[0]) * np.float32(2.0)
        if ab is None:
            assert np.array_equal(g, bf16(ref)), name            # dequantization alone: exact
        else:
            assert_merged(g, ref, name)
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["torch_dtype"] == "bfloat16"


# ---------------------------------------------------------------- refusals: clear error, nothing published

def _edit_json(p: Path, **kw):
    d = json.loads(p.read_text())
    d.update(kw)
    p.write_text(json.dumps(d))


def _rewrite(path: Path, drop=(), change=None):
    """Rewrite a safetensors file without the tensors in ``drop`` / with ``change[name] = (dtype, shape)``; the
    folder's index follows."""
    t, _ = read(path)
    spec = {n: (dt, list(a.shape)) for n, (dt, a) in t.items() if n not in drop}
    spec.update(change or {})
    kl.write_safetensors(str(path), spec, {"format": "pt"}, kl.random_values(9))
    index = path.parent / "model.safetensors.index.json"
    if index.exists():
        d = json.loads(index.read_text())
        d["weight_map"] = {k: v for k, v in d["weight_map"].items() if v != path.name} | dict.fromkeys(spec, path.name)
        index.write_text(json.dumps(d))


def _change(b: Path, name: str, dtype_shape=None):
    """Drop base tensor ``name`` (``dtype_shape`` None) or give it another (dtype, shape), in whichever shard holds it."""
    shard = json.loads((b / "model.safetensors.index.json").read_text())["weight_map"][name]
    if dtype_shape is None:
        _rewrite(b / shard, drop={name})
    else:
        _rewrite(b / shard, change={name: dtype_shape})


def _no_manifest(out: Path):
    (out / "kt_adapter_manifest.json").unlink()


HOSTILE = {
    "rank mismatch": (lambda o, b: (_no_manifest(o), _edit_json(o / "adapter_config.json", r=4)),
                      "r=4 differs from the expert LoRA rank 8"),
    "index mismatch": (lambda o, b: _edit_json(b / "model.safetensors.index.json", weight_map={
        **json.loads((b / "model.safetensors.index.json").read_text())["weight_map"],
        "model.embed_tokens.weight": "model-00002-of-00002.safetensors"}), "which does not hold it"),
    "rslora": (lambda o, b: (_no_manifest(o), _edit_json(o / "adapter_config.json", use_rslora=True)), "use_rslora"),
    "dora": (lambda o, b: (_no_manifest(o), _edit_json(o / "adapter_config.json", use_dora=True)), "use_dora"),
    "rank pattern": (lambda o, b: (_no_manifest(o), _edit_json(o / "adapter_config.json", rank_pattern={"q_proj": 4})),
                     "rank_pattern"),
    "bias": (lambda o, b: (_no_manifest(o), _edit_json(o / "adapter_config.json", bias="all")), "bias"),
    "changed adapter": (lambda o, b: _rewrite(o / "adapter_model.safetensors"), "differs from the manifest"),
    "nan in adapter": (lambda o, b: (_no_manifest(o), _nan(o / "fused_expert_lora.safetensors")), "NaN/Inf"),
    "missing expert": (lambda o, b: _change(b, "model.layers.0.mlp.experts.3.up_proj.weight"),
                       "lacks expert 3 up_proj of layer 0"),
    "shape mismatch": (lambda o, b: _change(b, "model.layers.0.self_attn.q_proj.weight", ("BF16", [64, 32])),
                       "q_proj.weight is [64, 32] but its LoRA needs [64, 64]"),
    "expert shape": (lambda o, b: _change(b, "model.layers.0.mlp.experts.1.down_proj.weight", ("BF16", [32, 32])),
                     "needs [64, 32]"),
    "kt converted base": (lambda o, b: _rewrite(b / "model-00001-of-00002.safetensors",
                                                change={"blk.0.ffn_up_exps.0.numa.0.weight": ("I8", [64])}),
                          "KT-converted"),
    "gptq base": (lambda o, b: _edit_json(b / "config.json", quantization_config={"quant_method": "gptq"}), "gptq"),
    "no safetensors": (lambda o, b: [p.unlink() for p in b.glob("*.safetensors*")] and None, "no safetensors"),
    "int weights": (lambda o, b: _change(b, "model.layers.0.self_attn.q_proj.weight", ("I32", [64, 64])),
                    "is I32"),
    "base has more experts": (lambda o, b: _rewrite(b / "model-00002-of-00002.safetensors",
                                                    change={"model.layers.1.mlp.experts.9.up_proj.weight": ("BF16", [32, 64])}),
                              "10+ experts"),
    "millions of empty experts": (lambda o, b: _rewrite(o / "fused_expert_lora.safetensors", change={
        f"layers.{L}.experts.{p}_lora_{x}": ("BF16", [65536, 1, 0] if x == "a" else [65536, 0, 1])
        for L in range(2) for p in ("gate", "up", "down") for x in "ab"}) or _no_manifest(o)
        or _edit_json(o / "adapter_config.json", r=1), "non-zero"),
    "adapter for other model": (lambda o, b: _rewrite(o / "fused_expert_lora.safetensors", change={
        f"layers.5.experts.{p}_lora_{x}": ("BF16", [4, 8, 64] if x == "a" else [4, 32, 8])
        for p in ("gate", "up", "down") for x in "ab"}) or _no_manifest(o), "no routed experts there"),
}


def _nan(path: Path):
    t, _ = read(path)
    raw = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    hdr = json.loads(raw[8:8 + n])
    b = hdr["layers.1.experts.down_lora_b"]["data_offsets"][0]
    raw[8 + n + b + 6: 8 + n + b + 8] = struct.pack("<H", 0x7FC0)
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_inputs_are_refused_and_nothing_is_published(pair, tmp_path, case):
    out, base = pair
    spoil, phrase = HOSTILE[case]
    spoil(out, base)
    t0 = time.monotonic()
    with pytest.raises(MergeError) as err:
        merge(out, base, tmp_path / "merged")
    assert time.monotonic() - t0 < 30                         # refused from the headers, not after the data
    assert phrase in err.value.message, err.value.message
    assert err.value.fix
    assert not (tmp_path / "merged").exists() and not list(tmp_path.glob(f".*{STAGING_SUFFIX}"))


def test_destination_rules(pair, tmp_path):
    out, base = pair
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("mine")
    with pytest.raises(OverwriteRefused, match="not empty") as refused:   # exit 6, as README's table says
        merge(out, base, tmp_path / "full")
    assert refused.value.exit_code == 6
    assert (tmp_path / "full" / "x").read_text() == "mine"
    for inside in (base / "merged", out / "merged", out / "checkpoint-1"):
        with pytest.raises(MergeError, match="outside"):
            merge(out, base, inside)
    with pytest.raises(OverwriteRefused, match="not empty"):
        merge(out, base, base)
    os.symlink(tmp_path / "nowhere", tmp_path / "link")
    with pytest.raises(MergeError, match="symbolic link"):
        merge(out, base, tmp_path / "link")
    (tmp_path / "empty").mkdir()
    merge(out, base, tmp_path / "empty")                       # an empty folder is fine
    assert (tmp_path / "empty" / MERGE_MANIFEST).is_file()


def test_links_out_of_the_model_volume_are_refused(pair, tmp_path):
    out, base = pair
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shard = base / "model-00002-of-00002.safetensors"
    shard.rename(elsewhere / shard.name)
    os.symlink(elsewhere / shard.name, shard)
    with pytest.raises(MergeError, match="outside the model volume"):
        merge(out, base, tmp_path / "m")
    merge(out, base, tmp_path / "m", base_root=tmp_path)        # the volume that holds both: allowed
    assert (tmp_path / "m" / shard.name).is_file() and not (tmp_path / "m" / shard.name).is_symlink()
    os.symlink(tmp_path / "elsewhere", out / "linked")
    (out / "fused_expert_lora.safetensors").rename(tmp_path / "elsewhere" / "f.safetensors")
    os.symlink(tmp_path / "elsewhere" / "f.safetensors", out / "fused_expert_lora.safetensors")
    with pytest.raises(Exception, match="symbolic link"):
        merge(out, base, tmp_path / "m2")


def test_full_finetune_output_is_told_apart(tmp_path):
    kl.write_full_model(str(tmp_path / "out"), m=MINI)
    kl.write_base_model(str(tmp_path / "base"), m=MINI)
    with pytest.raises(MergeError, match="full fine-tune"):
        merge(tmp_path / "out", tmp_path / "base", tmp_path / "m")


# ---------------------------------------------------------------- resume after a kill

def _cli(*args, **kw):
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    return subprocess.Popen([sys.executable, "-m", "ktdeploy", "merge", *args], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _journaled(staging: Path) -> int:
    try:
        return len(json.loads((staging / JOURNAL).read_text())["shards"])
    except (OSError, ValueError, KeyError):
        return 0


def test_killed_merge_resumes_keeps_verified_shards_and_equals_a_clean_run(tmp_path):
    kl.write_base_model(str(tmp_path / "base"), shards=8)              # SMALL: 65 MB in 8 shards
    kl.write_lora_adapter(str(tmp_path / "out"), base="b", seed=6)
    clean = tmp_path / "clean"
    p = _cli(str(tmp_path / "out"), "--base", str(tmp_path / "base"), "-o", str(clean), "--threads", "1")
    assert p.wait(120) == 0, p.stderr.read()
    dst = tmp_path / "m"
    staging = tmp_path / f".m{STAGING_SUFFIX}"
    for _attempt in range(5):                    # a kill must land after >= 1 shard and before the publish
        p = _cli(str(tmp_path / "out"), "--base", str(tmp_path / "base"), "-o", str(dst), "--threads", "1")
        deadline = time.monotonic() + 120
        while _journaled(staging) < 1 and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        p.send_signal(signal.SIGSTOP)            # frozen where it is, then killed: no handler runs
        done = dst.exists()
        p.kill()
        p.wait()
        if not done:
            break
        import shutil
        shutil.rmtree(dst)
    else:
        pytest.fail("the merge always finished before the kill")
    kept_before = _journaled(staging)
    assert 1 <= kept_before < 8 and not dst.exists()
    r = _cli(str(tmp_path / "out"), "--base", str(tmp_path / "base"), "-o", str(dst), "--json")
    stdout, stderr = r.communicate(timeout=120)
    assert r.returncode == 0, stderr
    s = json.loads(stdout)
    assert s["kept_shards"] >= kept_before and s["shards"] == 8
    a = json.loads((dst / MERGE_MANIFEST).read_text())["output"]["files"]
    b = json.loads((clean / MERGE_MANIFEST).read_text())["output"]["files"]
    assert a == b                                # byte-identical to the uninterrupted merge
    assert not staging.exists()


def test_resume_redoes_a_damaged_kept_shard_and_drops_partials(pair, tmp_path):
    out, base = pair
    clean = merge(out, base, tmp_path / "clean")
    assert clean.kept_shards == 0
    # an interrupted merge: the staging folder with one journaled shard, one damaged, one partial
    dst = tmp_path / "m"
    merge(out, base, dst)
    staging = tmp_path / f".m{STAGING_SUFFIX}"
    os.rename(dst, staging)
    man = json.loads((staging / MERGE_MANIFEST).read_text())
    from ktdeploy.agent.merge.run import _plan_id  # noqa: F401 (the journal's identity is recomputed by merge)

    shards = {n: {"size": r["size"], "sha256": r["sha256"], "input_sha256": man["base"]["files"][n]["sha256"]}
              for n, r in man["output"]["files"].items() if n.endswith(".safetensors")}
    (staging / MERGE_MANIFEST).unlink()
    first, second = sorted(shards)
    raw = bytearray((staging / second).read_bytes())
    raw[-1] ^= 0xFF
    (staging / second).write_bytes(bytes(raw))
    (staging / "model-00003.safetensors.partial").write_bytes(b"junk")
    # the journal must carry the plan id merge computes: take it from a fresh staging folder's journal
    probe = tmp_path / "probe"
    from ktdeploy.agent.merge import run as mr

    ident = _plan_identity(out, base, mr)
    (staging / JOURNAL).write_text(json.dumps({"plan": ident, "shards": shards}))
    said: list[str] = []
    s = merge(out, base, dst, say=said.append)
    assert s.kept_shards == 1 and any("SHA-256 changed" in m for m in said), said
    assert json.loads((dst / MERGE_MANIFEST).read_text())["output"]["files"] == \
        json.loads((tmp_path / "clean" / MERGE_MANIFEST).read_text())["output"]["files"]
    assert not (dst / "model-00003.safetensors.partial").exists() and not probe.exists()


def _plan_identity(out: Path, base: Path, mr) -> str:
    src = mr.find_adapter_dir(Path(os.path.realpath(out)))
    adapter = mr._adapter(src, True)
    b = mr._base(Path(os.path.realpath(base)), Path(os.path.realpath(base)))
    return mr._plan_id(adapter, b, False)


def test_a_second_merge_into_the_same_folder_is_refused_while_one_runs(pair, tmp_path):
    import fcntl

    out, base = pair
    staging = tmp_path / f".m{STAGING_SUFFIX}"
    staging.mkdir()
    fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(MergeError, match="another ktdeploy merge"):
            merge(out, base, tmp_path / "m")
    finally:
        os.close(fd)


def test_cli_errors_exit_2_without_traceback(pair, tmp_path):
    out, base = pair
    _edit_json(out / "adapter_config.json", use_dora=True)
    (out / "kt_adapter_manifest.json").unlink()
    p = _cli(str(out), "--base", str(base), "-o", str(tmp_path / "m"))
    _stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 2 and "use_dora" in stderr and "Traceback" not in stderr


@pytest.mark.parametrize("direct", [True, False])
def test_direct_io_writer_writes_exact_bytes_and_size(tmp_path, monkeypatch, direct):
    """The O_DIRECT writer (page-aligned buffer, padded tail truncated away) and its plain fallback (a filesystem
    that refuses O_DIRECT: fcntl raises) both write exactly the bytes given, in any chunking."""
    import fcntl as real_fcntl

    from ktdeploy.agent.merge import stream

    if not direct:
        original = real_fcntl.fcntl

        def refuse(fd, cmd, *arg):
            if cmd == real_fcntl.F_SETFL:
                raise OSError(22, "Invalid argument")
            return original(fd, cmd, *arg)
        monkeypatch.setattr(stream.fcntl, "fcntl", refuse)
    rng = np.random.default_rng(1)
    cap = stream._Out.CAP
    data = rng.integers(0, 256, 3 * cap + 12345, dtype=np.uint8).tobytes()
    out = stream._Out(tmp_path / "f")
    assert out.direct is direct
    pos = 0
    for n in (1, 4095, 4097, cap, 3, cap + 7, 10**6):
        out.write(memoryview(data)[pos:pos + n])
        pos += n
    out.write(memoryview(data)[pos:])
    out.close()
    assert (tmp_path / "f").read_bytes() == data
    with pytest.raises(FileExistsError):
        stream._Out(tmp_path / "f")                             # never over an existing file
