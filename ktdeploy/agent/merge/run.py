"""``ktdeploy merge OUTPUT_DIR --base MODEL_DIR -o MERGED_DIR``: the KT LoRA folded into the base weights.

The result is a standard Hugging Face model folder: the base's config, tokenizer and generation files, its
safetensors shards (same file names, tensor names, dtypes and order) with every LoRA term added, an index, and
``ktdeploy_merge.json`` (the inputs' SHA-256s, the adapter's identity, each output file's size and SHA-256, the
arithmetic). Any engine serves it as a plain model; sglang-kt with ``--kt-method BF16`` and no LoRA flags.

Safety: the adapter and the base are validated from their headers before a byte is written (shapes, ranks,
missing experts, NaN/Inf in the adapter, rsLoRA/DoRA, quantized bases); the output is built in a sibling
``.<name>.ktdeploy-merge`` folder, shard by shard (each fsynced and journaled with its SHA-256), and published by
one rename. A killed merge resumes: finished shards are re-hashed and kept, the rest redone. A destination that
exists and is not empty, one inside the base or the training output, and links out of the model volume are
refused; nothing is written into the model folder.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from ktdeploy import __version__
from ktdeploy.agent import safetensors_io as st
from ktdeploy.agent.convert import (
    ADAPTER,
    CONFIG,
    FUSED,
    MANIFEST,
    ConvertError,
    _load_json,
    check_manifest,
    find_adapter_dir,
    find_full_dir,
)
from ktdeploy.agent.merge import arith, layout
from ktdeploy.agent.merge.layout import MergeError
from ktdeploy.agent.merge.stream import LoraCache, ShardPlan, check_contiguous, write_shard
from ktdeploy.core.errors import OverwriteRefused
from ktdeploy.core.hashing import sha256_file
from ktdeploy.core.safeio import MAX_JSON, inside, load_json, overlaps, redact, write_file, writing
from ktdeploy.core.ticks import tick

FORMAT, VERSION = "ktdeploy-merge", 1
MERGE_MANIFEST = "ktdeploy_merge.json"
JOURNAL = ".ktdeploy-merge-journal.json"
INDEX = "model.safetensors.index.json"
STAGING_SUFFIX = ".ktdeploy-merge"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".ckpt", ".onnx", ".index.json")
MAX_AUX_FILES = 1000
# PEFT LoraConfig fields whose non-default value changes what the adapter computes beyond s * (B @ A).
_UNMERGEABLE = {"use_rslora": "rsLoRA scales by alpha/sqrt(r)", "use_dora": "DoRA rescales each column",
                "fan_in_fan_out": "fan_in_fan_out stores the weights transposed", "lora_bias": "LoRA bias terms",
                "use_qalora": "QA-LoRA", "layer_replication": "layer replication",
                "modules_to_save": "fully trained modules (modules_to_save)",
                "trainable_token_indices": "trainable token embeddings", "target_parameters": "parameter targets",
                "rank_pattern": "per-module ranks", "alpha_pattern": "per-module alphas"}
ARITHMETIC = ("W' = round_to_nearest_even(float32(W) + float32(lora_alpha / r) * (B_f32 @ A_f32)) into the base "
              "dtype: float32 accumulation, one rounding (FP8 bases: float32(W) = float32(q) * weight_scale_inv, "
              "written as BF16)")


@dataclass
class MergeSummary:
    output_dir: str
    base_dir: str
    adapter_dir: str
    rank: int
    lora_alpha: float
    scale: float
    layout: str
    expert_layers: int
    num_experts: int
    expert_tensors: int
    nonexpert_tensors: int
    shards: int
    kept_shards: int
    bytes_in: int
    bytes_out: int
    seconds: float
    fp8_dequantized: int = 0
    notes: list[str] = field(default_factory=list)


@dataclass
class _Adapter:
    src: Path
    rank: int
    alpha: float
    scale: float
    config: dict
    manifest: dict
    fused: dict[str, st.TensorInfo]
    peft: dict[str, st.TensorInfo]
    files: dict[str, dict]


@dataclass
class _Base:
    dir: Path
    config: dict
    config_path: Path
    shards: dict[str, tuple[Path, dict[str, st.TensorInfo], int, int]]   # name -> (real path, tensors, size, mtime)
    aux: list[tuple[str, Path]]


def merge(output_dir: str | os.PathLike, base: str | os.PathLike, merged: str | os.PathLike, *,
          base_root: str | os.PathLike | None = None, verify_manifest: bool = True, workers: int | None = None,
          say: Callable[[str], None] | None = None) -> MergeSummary:
    """Merge the KT LoRA output ``output_dir`` into the base model ``base``; publish ``merged``. Bad input of any
    shape is a MergeError (exit 2) with nothing published, never a crash."""
    try:
        return _merge(Path(output_dir), Path(base), merged, base_root, verify_manifest, workers, say or (lambda _m: None))
    except ConvertError as err:      # the adapter checks shared with `ktdeploy convert`
        raise MergeError(err.message, fix=err.fix) from None
    except st.SafetensorsFormatError as err:
        raise MergeError(str(err), fix="the file is damaged or not a safetensors file") from None
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, ArithmeticError) as err:
        raise MergeError(f"the inputs hold a value of the wrong type ({type(err).__name__}: {str(err)[:160]})",
                         fix="the files are damaged, or not a KT LoRA output and a Hugging Face model") from None


# ---------------------------------------------------------------- inputs

def _destination(merged: str | os.PathLike) -> Path:
    if not str(merged).strip():
        raise MergeError("the merged model's folder is empty", fix="give -o DIR, e.g. <output_dir>-merged")
    if Path(merged).is_symlink():
        raise MergeError(f"{merged} is a symbolic link; ktdeploy never writes through a link", fix="give the real folder")
    dst = Path(os.path.realpath(merged))
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise OverwriteRefused(f"{dst} already exists and is not empty; ktdeploy never overwrites a model",
                               key="-o", fix="remove it yourself or choose another -o folder")
    return dst


def _plain(p: Path, what: str) -> Path:
    if p.is_symlink():
        raise MergeError(f"{p} ({what}) is a symbolic link; ktdeploy never reads an adapter through a link",
                         fix="replace the link with the file itself")
    return p


def _adapter(src: Path, verify_manifest: bool) -> _Adapter:
    manifest: dict = {}
    if (_plain(src / MANIFEST, "KT manifest")).exists():
        manifest = _load_json(src / MANIFEST, "KT adapter manifest")
        if verify_manifest:
            check_manifest(src, manifest)
    if not _plain(src / FUSED, "expert LoRA").is_file():
        raise MergeError(f"{src} has no {FUSED}: no routed-expert LoRA to merge",
                         fix="point at the output_dir of a KT LoRA run (kt_use_lora_experts: true)")
    config = _load_json(_plain(src / CONFIG, "adapter config"), "PEFT adapter config")
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise MergeError(f"adapter_config.json: peft_type {config.get('peft_type')!r} is not LORA",
                         fix="ktdeploy merges LoRA adapters only")
    for key, what in _UNMERGEABLE.items():
        v = config.get(key)
        if v not in (None, False, {}, [], "", 0):
            raise MergeError(f"adapter_config.json: {key} = {json.dumps(v)[:80]} ({what}); ktdeploy merges plain "
                             "LoRA, W + (alpha/r) * B @ A, exactly and nothing else",
                             fix=f"train with {key} unset (plain LoRA), or serve the adapter instead of merging")
    if str(config.get("bias", "none")) != "none":
        raise MergeError(f"adapter_config.json: bias = {config.get('bias')!r} trains bias terms",
                         fix="train with lora bias 'none', or serve the adapter instead of merging")
    fused, _ = st.read_header(src / FUSED)
    gate_a = [i for n, i in fused.items() if n.endswith(".experts.gate_lora_a") and len(i.shape) == 3]
    if not gate_a:
        raise MergeError(f"{src / FUSED} holds no expert LoRA tensors", fix="the run saved an empty expert LoRA")
    rank = gate_a[0].shape[1]
    if rank < 1:
        raise MergeError(f"{src / FUSED} holds LoRA tensors of rank {rank}: there is no update to merge (alpha/r "
                         "is undefined)", fix="merge the output of a run trained with lora_rank >= 1")
    r_cfg = config.get("r")
    if r_cfg is not None and int(r_cfg) != rank:
        raise MergeError(f"adapter_config.json r={r_cfg} differs from the expert LoRA rank {rank}",
                         fix="the two parts come from different runs; merge one checkpoint")
    kt_lora = manifest.get("lora") or {}
    alpha = config.get("lora_alpha")
    if alpha is None:
        alpha = kt_lora.get("alpha")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise MergeError(f"lora_alpha {alpha!r} is not a finite number", fix="the adapter config is damaged")
    if kt_lora.get("alpha") is not None and float(kt_lora["alpha"]) != float(alpha):
        raise MergeError(f"expert LoRA alpha {kt_lora['alpha']} differs from PEFT's lora_alpha {alpha}",
                         fix="one alpha/r scales both parts; retrain with matching values")
    if kt_lora.get("rank") is not None and int(kt_lora["rank"]) != rank:
        raise MergeError(f"manifest rank {kt_lora['rank']} differs from the fused tensors' rank {rank}",
                         fix="the output mixes runs; merge a single checkpoint")
    peft: dict[str, st.TensorInfo] = {}
    if _plain(src / ADAPTER, "PEFT adapter").exists():
        peft, _ = st.read_header(src / ADAPTER)
    files = {}
    for name, index in ((FUSED, fused), (ADAPTER, peft)):
        if (src / name).exists():
            _refuse_nonfinite(src / name, index)
    for name in (FUSED, ADAPTER, CONFIG, MANIFEST):
        if (src / name).exists():
            files[name] = {"size": (src / name).stat().st_size, "sha256": sha256_file(src / name)}
    return _Adapter(src, rank, float(alpha), float(alpha) / rank, config, manifest, fused, peft, files)


def _refuse_nonfinite(path: Path, index: dict[str, st.TensorInfo]) -> None:
    """NaN/Inf anywhere in the adapter: refused before anything is written (a diverged run)."""
    with open(path, "rb", buffering=0) as f:
        for name, info in index.items():
            if info.dtype not in layout.LORA_DTYPES:
                continue
            item = st.ITEMSIZE[info.dtype]
            step = (4 << 20) // item * item
            for off in range(0, info.nbytes, step):
                n = min(step, info.nbytes - off)
                f.seek(info.begin + off)
                raw = f.read(n)
                bad = arith.nonfinite_count(raw, info.dtype, len(raw) // item)
                if bad:
                    raise MergeError(f"{path.name}: {name} holds {bad} NaN/Inf value(s)",
                                     fix="the training diverged; merge an earlier checkpoint-* or retrain (lower "
                                         "learning_rate)")


def _inside_volume(p: Path, root: Path, what: str) -> Path:
    """``p`` as a real path, refused when a link takes it out of the model volume ``root``."""
    real = Path(os.path.realpath(p))
    if not inside(str(real), str(root)):
        raise MergeError(f"{p} ({what}) links to {real}, outside the model volume {root}",
                         fix="copy the file into the model folder (or pass --base-root with the volume that holds it)")
    if not real.is_file():
        raise MergeError(f"{p} ({what}) is not a regular file", fix="give the base model's folder")
    return real


def _base(base_dir: Path, root: Path) -> _Base:
    if not base_dir.is_dir():
        raise MergeError(f"{base_dir} is not a folder", fix="--base MODEL_DIR: the base model (config.json + safetensors)")
    config_path = _inside_volume(base_dir / "config.json", root, "config.json") if (base_dir / "config.json").exists() \
        else None
    if config_path is None:
        raise MergeError(f"{base_dir} has no config.json", fix="--base MODEL_DIR: a Hugging Face model folder")
    config = load_json(config_path, MAX_JSON, "config.json")
    if not isinstance(config, dict):
        raise MergeError(f"{config_path} is not a JSON object", fix="the model's config.json is damaged")
    weight_map: dict[str, str] | None = None
    if (base_dir / INDEX).exists():
        idx = load_json(_inside_volume(base_dir / INDEX, root, INDEX), MAX_JSON, INDEX)
        wm = idx.get("weight_map") if isinstance(idx, dict) else None
        if not isinstance(wm, dict) or not wm or not all(isinstance(v, str) for v in wm.values()):
            raise MergeError(f"{base_dir / INDEX} has no weight_map", fix="the model's index is damaged")
        weight_map = wm
        names = sorted(set(wm.values()))
    elif (base_dir / "model.safetensors").exists():
        names = ["model.safetensors"]
    else:
        other = sorted(p.name for p in base_dir.iterdir() if p.name.endswith((".bin", ".pt", ".pth", ".gguf")))
        raise MergeError(f"{base_dir} has no safetensors weights" + (f" (found {other[:3]})" if other else ""),
                         fix="ktdeploy merges safetensors checkpoints; save the base with safe_serialization=True")
    shards: dict[str, tuple[Path, dict[str, st.TensorInfo], int, int]] = {}
    seen: dict[str, str] = {}
    for name in names:
        if os.path.basename(name) != name or not name.endswith(".safetensors"):
            raise MergeError(f"{INDEX} names {name!r}, not a shard file in the folder", fix="the model's index is damaged")
        real = _inside_volume(base_dir / name, root, "weight shard")
        tensors, _ = st.read_header(real)
        stat = real.stat()
        for t in tensors:
            if t in seen:
                raise MergeError(f"tensor {t} is in both {seen[t]} and {name}", fix="the checkpoint is damaged")
            seen[t] = name
        shards[name] = (real, tensors, stat.st_size, stat.st_mtime_ns)
    if weight_map is not None:
        for t, f in weight_map.items():
            if seen.get(t) != f:
                raise MergeError(f"{INDEX} puts {t} in {f}, which does not hold it",
                                 fix="the model's index does not match its shards; download it again")
    aux = []
    for p in sorted(base_dir.iterdir(), key=lambda x: x.name):
        if p.name.startswith(".") or p.name.endswith(WEIGHT_SUFFIXES) or p.name == "config.json":
            continue
        if p.is_dir() and not p.is_symlink():
            continue
        aux.append((p.name, _inside_volume(p, root, "model file")))
        if len(aux) > MAX_AUX_FILES:
            raise MergeError(f"{base_dir} holds more than {MAX_AUX_FILES} files besides the weights",
                             fix="give the model's own folder")
    return _Base(base_dir, config, config_path, shards, aux)


# ---------------------------------------------------------------- planning

def _plans(adapter: _Adapter, base: _Base) -> tuple[list[ShardPlan], layout.Mapping, dict, list[int] | None]:
    all_tensors: dict[str, st.TensorInfo] = {}
    where: dict[str, Path] = {}
    for _name, (real, tensors, _size, _mt) in base.shards.items():
        all_tensors.update(tensors)
        where.update(dict.fromkeys(tensors, real))
    notes: list[str] = []
    fp8 = layout.refuse_base_format(all_tensors, base.config, str(base.dir))
    block = None
    fp8_targets: dict[str, layout.Target] = {}
    dropped: set[str] = set()
    if fp8 is not None:
        block, note = fp8
        notes.append(note)
        fp8_targets, dropped = layout.fp8_targets(all_tensors, block)
    tc = base.config.get("text_config")
    text: dict = tc if isinstance(tc, dict) else base.config
    n_layers = text.get("num_hidden_layers")
    experts, layers, n_experts, lay = layout.expert_targets(
        str(adapter.src / FUSED), adapter.fused, all_tensors, adapter.rank,
        n_layers if isinstance(n_layers, int) and not isinstance(n_layers, bool) else None,
        str(text.get("model_type") or base.config.get("model_type") or ""))
    nonexpert = layout.peft_targets(str(adapter.src / ADAPTER), adapter.peft, all_tensors, adapter.rank) \
        if adapter.peft else {}
    targets = layout.combine(all_tensors, [experts, nonexpert], fp8_targets)
    mapping = layout.Mapping(targets, dropped, layers, n_experts, len(experts), len(nonexpert), lay, notes)
    scales = {s: (where[s], all_tensors[s]) for s in dropped}
    plans = []
    for name, (real, tensors, size, _mt) in base.shards.items():
        ordered, header_len = check_contiguous(real, tensors, size)
        _, meta = st.read_header(real)
        plans.append(ShardPlan(name, real, ordered, header_len, meta,
                               {t: targets[t] for t in tensors if t in targets}, dropped & set(tensors), size))
    return plans, mapping, scales, block


def _plan_id(adapter: _Adapter, base: _Base, fp8: bool) -> str:
    ident = {"format": FORMAT, "version": VERSION, "adapter": {k: v["sha256"] for k, v in adapter.files.items()},
             "scale": adapter.scale, "fp8": fp8,
             "base": [[n, s[2], s[3]] for n, s in sorted(base.shards.items())]}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()


# ---------------------------------------------------------------- the staging folder

class _Staging:
    """``.<name>.ktdeploy-merge`` beside the destination: made by this user alone (mode 0700 until published),
    locked while a merge writes it, with a journal of the finished shards (size + SHA-256).

    The folder's name is predictable and its parent may be shared (/tmp, a team's disk): another user could make
    it first and plant a journal with a forged shard, which a resume would publish as "kept", or simply own the
    folder that becomes the model. So it is created exclusively; one that exists is adopted only when it is this
    user's, not a link, and nobody else may write in it; a journal only when this user wrote it (a regular file,
    one link, not writable by others); a kept shard likewise, and only when its bytes still hash to the journal's
    SHA-256."""

    def __init__(self, dst: Path, plan_id: str, say: Callable[[str], None]) -> None:
        self.dst, self.plan_id, self.say = dst, plan_id, say
        self.path = dst.parent / f".{dst.name}{STAGING_SUFFIX}"
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(self.path, 0o700)
        except FileExistsError:
            pass
        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:   # a link (ELOOP), or a file, where the folder should be
            raise MergeError(f"{self.path} is a link or a file, not a staging folder ktdeploy made",
                             fix="remove it; ktdeploy never writes through a link") from None
        try:
            self._adopt()
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            raise MergeError(f"another ktdeploy merge is writing {self.path}",
                             fix="wait for it to finish (or stop it); a second merge into the same folder is refused") from None
        except BaseException:
            os.close(self.fd)
            raise
        self.done: dict[str, dict] = {}
        journal = self._journal()
        if isinstance(journal, dict) and journal.get("plan") == plan_id and isinstance(journal.get("shards"), dict):
            self.done = journal["shards"]
        elif any(self.path.iterdir()):
            say(f"discarding an unfinished merge of other inputs in {self.path}")
            for p in self.path.iterdir():
                if p.is_dir() and not p.is_symlink():
                    os.close(self.fd)
                    raise MergeError(f"{self.path} holds a folder {p.name}", fix="remove it and merge again")
                p.unlink()
        self.save()

    def _adopt(self) -> None:
        """This user's folder, private: refused when another user owns it or could write in it."""
        st = os.fstat(self.fd)
        if st.st_uid != os.geteuid():
            raise MergeError(f"{self.path} belongs to {_owner(st.st_uid)}, not to you: a staging folder another user "
                             "made (its name is predictable) is never adopted; nothing was written",
                             fix="ask its owner (or root) to remove it, or merge to a folder of your own (-o)")
        if st.st_mode & 0o022:
            raise MergeError(f"{self.path} may be written by others (mode {stat.S_IMODE(st.st_mode):04o}): a merge "
                             "kept there could hold anyone's files; nothing was written",
                             fix="remove it and merge again (the merge makes it anew, mode 0700)")
        os.fchmod(self.fd, 0o700)

    def _journal(self) -> object:
        """The journal, when this user wrote it (else None: every shard is merged again)."""
        try:
            fd = os.open(JOURNAL, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=self.fd)
        except FileNotFoundError:
            return None
        except OSError:
            self.say(f"{self.path / JOURNAL} is not a file ktdeploy wrote; merging every shard again")
            return None
        try:
            if not _mine(os.fstat(fd)):
                self.say(f"{self.path / JOURNAL} was not written by you; merging every shard again")
                return None
        finally:
            os.close(fd)
        return load_json(self.path / JOURNAL, MAX_JSON, "merge journal")

    def save(self) -> None:
        write_file(self.path, JOURNAL, json.dumps({"plan": self.plan_id, "shards": self.done}, indent=1),
                   overwrite=True, mode=0o600)
        os.fsync(self.fd)

    def finished(self, name: str, out_size: int) -> bool:
        """A shard journaled by an earlier run, still this user's file, with its size and SHA-256: kept."""
        rec = self.done.get(name)
        p = self.path / name
        try:
            st = os.lstat(p)
        except OSError:
            st = None
        if rec is None or st is None or not _mine(st) or st.st_size != out_size:
            self.done.pop(name, None)
            return False
        if sha256_file(p) != rec.get("sha256"):
            self.say(f"{name}: the kept shard's SHA-256 changed; merging it again")
            self.done.pop(name, None)
            p.unlink()
            return False
        return True

    def publish_mode(self) -> None:
        """The folder becomes the model: readable as any folder this user makes (umask), no longer private."""
        mask = os.umask(0)
        os.umask(mask)
        os.fchmod(self.fd, 0o777 & ~mask)

    def close(self) -> None:
        os.close(self.fd)


def _mine(st: os.stat_result) -> bool:
    """A regular file of this user, with one name, nobody else may write."""
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_nlink == 1 and not st.st_mode & 0o022


def _owner(uid: int) -> str:
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _remove(p: Path) -> None:
    if p.is_symlink() or p.exists():
        p.unlink()


def _copy(src: Path, folder: Path, name: str) -> dict:
    """Copy ``src`` to ``folder/name`` through the safe writer (temp file, rename), hashing what is written."""
    h = hashlib.sha256()
    size = 0
    with writing(folder, name, overwrite=True) as out, open(src, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            out.write(chunk)
            h.update(chunk)
            size += len(chunk)
        out.flush()
        os.fsync(out.fileno())
    return {"size": size, "sha256": h.hexdigest()}


def _merged_config(config: dict, fp8: bool) -> bytes | None:
    """config.json of the merged model: the base's, except an FP8 base's quantization is gone (it is BF16 now)."""
    if not fp8:
        return None
    out = json.loads(json.dumps(config))
    for c in (out, out.get("text_config")):
        if isinstance(c, dict):
            c.pop("quantization_config", None)
            for key in ("torch_dtype", "dtype"):
                if key in c:
                    c[key] = "bfloat16"
    if "torch_dtype" not in out and "dtype" not in out:
        out["torch_dtype"] = "bfloat16"
    return (json.dumps(out, indent=2) + "\n").encode()


# ---------------------------------------------------------------- the merge

def _merge(output_dir: Path, base_dir: Path, merged: str | os.PathLike, base_root: str | os.PathLike | None, verify_manifest: bool, workers: int | None,
           say: Callable[[str], None]) -> MergeSummary:
    t0 = time.monotonic()
    dst = _destination(merged)
    base_real = Path(os.path.realpath(base_dir))     # a linked folder is followed, but never out of the volume
    root = Path(os.path.realpath(base_root)) if base_root else base_real
    if not inside(str(base_real), str(root)):
        raise MergeError(f"--base {base_real} lies outside --base-root {root}", fix="give the volume holding the model")
    top = Path(os.path.realpath(output_dir))
    if top.is_dir() and not (top / FUSED).exists() and not (top / MANIFEST).exists() and find_full_dir(top):
        raise MergeError(f"{top} is a full fine-tune: its output already is the whole model, there is no LoRA to merge",
                         fix="serve it as weights (`ktdeploy convert OUTPUT_DIR -o DIR`, then `ktdeploy serve --weights`)")
    src = find_adapter_dir(top)
    for other, what in ((base_real, "the base model"), (src, "the training output"), (top, "the training output")):
        if overlaps(str(dst), str(other)):
            raise MergeError(f"the merged model {dst} must lie outside {what} {other}; ktdeploy never writes into "
                             "a model folder or a training output", fix="choose a sibling, e.g. <output_dir>-merged")
    adapter = _adapter(src, verify_manifest)
    base = _base(base_real, root)
    plans, mapping, scales, block = _plans(adapter, base)
    fp8 = bool(mapping.dropped)
    say(f"merging {src} into {base_real}: rank {adapter.rank}, alpha {adapter.alpha:g} (scale {adapter.scale:g}), "
        f"{mapping.expert_tensors} expert + {mapping.nonexpert_tensors} other tensors, {len(plans)} shard(s)")
    stage = _Staging(dst, _plan_id(adapter, base, fp8), say)
    try:
        return _run(adapter, base, plans, mapping, _Fp8Scales(scales, block), stage, dst, workers, say, t0)
    finally:
        stage.close()


class _Fp8Scales(NamedTuple):
    """An FP8 base's dequantization: each weight's scale tensor, and the block it scales."""

    scales: dict[str, tuple[Path, st.TensorInfo]]
    block: list[int] | None


class _Counts(NamedTuple):
    kept: int          # shards kept from an interrupted merge
    bytes_in: int
    bytes_out: int


def _run(adapter: _Adapter, base: _Base, plans: list[ShardPlan], mapping: layout.Mapping, fp8_scales: _Fp8Scales,
         stage: _Staging, dst: Path, workers: int | None, say: Callable[[str], None], t0: float) -> MergeSummary:
    scales, block = fp8_scales
    fp8 = bool(mapping.dropped)
    kept = 0
    todo = []
    for p in plans:
        _remove(stage.path / (p.name + ".partial"))
        if stage.finished(p.name, p.out_size()):
            kept += 1
            say(f"{p.name}: kept from the interrupted merge (SHA-256 verified)")
        else:
            _remove(stage.path / p.name)
            todo.append(p)
    keep = {p.name for p in plans if p.name in stage.done} | {JOURNAL}
    for leftover in stage.path.iterdir():          # partial shards, files of the last attempt's publish step
        if leftover.name not in keep:
            if leftover.is_dir() and not leftover.is_symlink():
                raise MergeError(f"{stage.path} holds a folder {leftover.name}", fix="remove it and merge again")
            leftover.unlink()
    stage.save()
    need = sum(p.out_size() for p in todo) + sum(src.stat().st_size for _n, src in base.aux)
    vfs = os.statvfs(stage.path)
    free = vfs.f_bavail * vfs.f_frsize
    if need > free:
        raise MergeError(f"the merge needs {need / 2**30:.1f} GiB more on {stage.path.parent}, {free / 2**30:.1f} GiB "
                         "are free", fix="free space there or merge to another disk (-o)")
    n_workers = workers or min(4, len(os.sched_getaffinity(0)))
    cache = LoraCache()
    bytes_in = bytes_out = 0
    try:
        tick(say, 0, len(todo), "the first shard")
        for i, p in enumerate(todo, 1):
            t = time.monotonic()
            part = stage.path / (p.name + ".partial")
            hin, hout, written = write_shard(p, part, scale=adapter.scale, workers=n_workers, scales=scales,
                                             block=block, cache=cache)
            if written != p.out_size():
                raise MergeError(f"{p.name}: wrote {written} bytes, planned {p.out_size()}", fix="report it")
            os.replace(part, stage.path / p.name)
            stage.done[p.name] = {"size": written, "sha256": hout, "input_sha256": hin}
            stage.save()
            bytes_in += p.file_size
            bytes_out += written
            dt = time.monotonic() - t
            say(f"{p.name}: merged ({i}/{len(todo)}), {p.file_size / 1e9:.2f} GB in {dt:.1f} s "
                f"({p.file_size / 1e9 / max(dt, 1e-9):.2f} GB/s)")
            tick(say, i, len(todo), p.name)
    finally:
        cache.close()
    return _publish(adapter, base, plans, mapping, stage, dst, fp8, _Counts(kept, bytes_in, bytes_out), t0, say)


def _publish(adapter: _Adapter, base: _Base, plans: list[ShardPlan], mapping: layout.Mapping, stage: _Staging, dst: Path,
             fp8: bool, counts: _Counts, t0: float, say: Callable[[str], None]) -> MergeSummary:
    kept, bytes_in, bytes_out = counts
    out_files: dict[str, dict] = {p.name: {"size": stage.done[p.name]["size"], "sha256": stage.done[p.name]["sha256"]}
                                  for p in plans}
    base_files: dict[str, dict] = {p.name: {"size": p.file_size, "sha256": stage.done[p.name]["input_sha256"]}
                                   for p in plans}
    for name, src in base.aux:
        out_files[name] = _copy(src, stage.path, name)
        base_files[name] = dict(out_files[name])
    base_files["config.json"] = {"size": base.config_path.stat().st_size, "sha256": sha256_file(base.config_path)}
    base_index = Path(os.path.realpath(base.dir / INDEX))
    if base_index.is_file():
        base_files[INDEX] = {"size": base_index.stat().st_size, "sha256": sha256_file(base_index)}
    new_config = _merged_config(base.config, fp8)
    if new_config is None:
        out_files["config.json"] = _copy(base.config_path, stage.path, "config.json")
    else:
        write_file(stage.path, "config.json", new_config, overwrite=True)
        out_files["config.json"] = {"size": len(new_config), "sha256": hashlib.sha256(new_config).hexdigest()}
    weight_map = {name: p.name for p in plans for name, *_ in p.out_tensors()}
    index = {"metadata": {"total_size": sum(p.data_bytes() for p in plans), "merged_by": f"ktdeploy {__version__}"},
             "weight_map": dict(sorted(weight_map.items()))}
    blob = (json.dumps(index, indent=2) + "\n").encode()
    write_file(stage.path, INDEX, blob, overwrite=True)
    out_files[INDEX] = {"size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
    summary = MergeSummary(
        output_dir=str(dst), base_dir=str(base.dir), adapter_dir=str(adapter.src), rank=adapter.rank,
        lora_alpha=adapter.alpha, scale=adapter.scale, layout=mapping.layout, expert_layers=len(mapping.expert_layers),
        num_experts=mapping.num_experts, expert_tensors=mapping.expert_tensors,
        nonexpert_tensors=mapping.nonexpert_tensors, shards=len(plans), kept_shards=kept, bytes_in=bytes_in,
        bytes_out=bytes_out, seconds=0.0, fp8_dequantized=len(mapping.dropped), notes=list(mapping.notes))
    manifest = {
        "format": FORMAT, "version": VERSION, "merged_by": f"ktdeploy {__version__}", "arithmetic": ARITHMETIC,
        "scale": adapter.scale, "rank": adapter.rank, "lora_alpha": adapter.alpha,
        "adapter": {"dir": str(adapter.src), "files": adapter.files,
                    "base_model_name_or_path": redact(adapter.config.get("base_model_name_or_path")),
                    "kt_manifest": {k: adapter.manifest.get(k) for k in ("version", "status", "lora",
                                                                         "expert_weight_format")
                                    if k in adapter.manifest}},
        "base": {"dir": str(base.dir), "files": dict(sorted(base_files.items()))},
        "output": {"files": dict(sorted(out_files.items()))},
        "tensors": {"expert": mapping.expert_tensors, "nonexpert": mapping.nonexpert_tensors,
                    "fp8_dequantized": len(mapping.dropped), "layout": mapping.layout,
                    "expert_layers": len(mapping.expert_layers), "num_experts": mapping.num_experts},
        "notes": mapping.notes,
    }
    write_file(stage.path, MERGE_MANIFEST, json.dumps(manifest, indent=2) + "\n", overwrite=True)
    _remove(stage.path / JOURNAL)
    for p in stage.path.iterdir():
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    stage.publish_mode()
    os.fsync(stage.fd)
    try:
        os.rename(stage.path, dst)   # replaces an empty destination folder; refuses a non-empty one
    except OSError as err:
        raise MergeError(f"{dst} could not be published ({err.strerror}); the merged files stay in {stage.path}",
                         fix="remove what appeared at the destination and merge again (it resumes)") from None
    pfd = os.open(dst.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(pfd)
    finally:
        os.close(pfd)
    summary.seconds = round(time.monotonic() - t0, 3)
    say(f"published {dst}")
    return summary

