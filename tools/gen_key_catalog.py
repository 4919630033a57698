"""Regenerate ktdeploy/core/recipe/catalog_data.py: the argument names LlamaFactory-KT and Accelerate accept, and
the values the stack's own code accepts for them.

Everything is read (with `ast`, nothing is imported) from the exact wheels the image locks, and from the image's
lock file (which distributions the image holds):

    pip download --no-deps --pre llamafactory-kt==0.9.6.dev0 transformers-kt==5.6.0.post6 \
        accelerate-kt==1.14.0.post4 kt-kernel==0.7.2 --platform manylinux_2_35_x86_64 --python-version 311 \
        --only-binary=:all: -d /tmp/kw          # or: the wheelhouse, .wheelhouse/full
    python tools/gen_key_catalog.py /tmp/kw docker/requirements/full.lock > ktdeploy/core/recipe/catalog_data.py

What is read, and from where:
- key names and annotations: the dataclass fields of LlamaFactory's hparams, transformers' TrainingArguments /
  Seq2SeqTrainingArguments, accelerate's ClusterConfig (unknown keys are errors: LlamaFactory's parser rejects them);
- ENUM_CHOICES: the TrainingArguments fields __post_init__ converts with an enum (`IntervalStrategy(self.X)`,
  `[FSDPOption(s) for s in self.fsdp]`, ...), with that enum's values (the exact spellings the conversion takes);
- LF_ENUM_FIELDS: LlamaFactory fields annotated with one of its StrEnums (`flash_attn: AttentionFunction`), with the
  enum's values;
- LIST_ARGS: LlamaFactory fields its __post_init__ passes through `split_arg` (a YAML list is taken as is);
- FEATURE_PACKAGES / QUANTIZATION_PACKAGES: the distributions LlamaFactory's `check_version(..., mandatory=True)`
  demands for a switch (hparams/parser.py _check_extra_dependencies) or a quantization method
  (model/model_utils/quantization.py), and LOCKED: the distributions the image's lock installs;
- REPORT_INTEGRATIONS: transformers' INTEGRATION_TO_CALLBACK names (each callback needs its package);
- KT_FIELDS: kt-kernel's KTConfig fields (what LlamaFactory forwards from kt_config);
- DISTRIBUTED_TYPES, PRECISION_TYPES, DYNAMO_BACKENDS and FSDP_*: accelerate's enums and lists;
- ARG_CONDITIONS: the stack's argument checks that are an `and` of field-vs-literal tests (tools/gen_arg_conditions.py:
  TrainingArguments._validate_args, LlamaFactory's FinetuningArguments/DataArguments.__post_init__, get_train_args,
  _verify_model_args), each with its message; rules_conditions.lf.conditions evaluates them;
- FIELD_CHOICES: TrainingArguments fields whose metadata lists their choices (ddp_backend);
- TORCH_REFUSED_DDP_BACKENDS: those ddp_backend names the image's torch refuses, with its message (a fact of the
  torch build, measured in the image by tools/torch_backends.py into docker/requirements/torch_backends.json).
"""

from __future__ import annotations

import ast
import json
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_arg_conditions as gac  # noqa: E402 - a sibling module of this script

TYPES: dict[str, str] = {}  # key -> annotation text as written in the wheel (first owner wins)
DEFAULTS: dict[str, object] = {}  # key -> its default when written as a literal (first owner wins)


def _default(stmt: ast.AnnAssign):
    """The literal default of ``x: T = v`` or ``x: T = field(default=v)``; raises ValueError when not a literal."""
    v = stmt.value
    if isinstance(v, ast.Call) and getattr(v.func, "id", "") == "field":
        v = next((k.value for k in v.keywords if k.arg == "default"), None)
        if v is None:
            raise ValueError("no literal default")
    if v is None:
        raise ValueError("no default")
    if isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name):   # Enum.MEMBER: resolved in main()
        return EnumDefault(v.value.id, v.attr)
    return _constant(v)


def _constant(v: ast.AST):
    """A literal, or arithmetic of number literals (``768 * 768``, LlamaFactory's pixel defaults)."""
    if isinstance(v, ast.BinOp) and isinstance(v.op, (ast.Mult, ast.Add, ast.Sub, ast.Pow)):
        left, right = _constant(v.left), _constant(v.right)
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (left, right)):
            raise ValueError("not integer arithmetic")
        return {ast.Mult: int.__mul__, ast.Add: int.__add__, ast.Sub: int.__sub__,
                ast.Pow: int.__pow__}[type(v.op)](left, right)
    return ast.literal_eval(v)


class EnumDefault(tuple):
    """A default written as ``Enum.MEMBER``, resolved to the member's value once the enums are read."""

    def __new__(cls, enum: str, member: str):
        return super().__new__(cls, (enum, member))


def _dataclass_fields(source: str, wanted: set[str] | None = None,
                      types: dict[str, str] | None = None) -> dict[str, list[str]]:
    types = TYPES if types is None else types
    out: dict[str, list[str]] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and (wanted is None or node.name in wanted):
            fields = [s for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                      and not s.target.id.startswith("_")]
            out[node.name] = [s.target.id for s in fields]
            for s in fields:
                types.setdefault(s.target.id, ast.unparse(s.annotation))
                if types is TYPES and s.target.id not in DEFAULTS:
                    try:
                        DEFAULTS[s.target.id] = _default(s)
                    except (ValueError, TypeError, SyntaxError):
                        pass
    return out


def _launch_defaults(source: str) -> dict[str, object]:
    """accelerate launch's argparse defaults: ``add_argument("--x", ..., default=v)`` -> {x: v}."""
    out: dict[str, object] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument" and node.args \
                and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).startswith("--"):
            for k in node.keywords:
                if k.arg == "default":
                    try:
                        out[str(node.args[0].value)[2:]] = ast.literal_eval(k.value)
                    except ValueError:
                        pass
    return out


def _enums(source: str) -> dict[str, list[str]]:
    """Enum classes of a module -> their string values, in order."""
    out: dict[str, list[str]] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and any("Enum" in ast.unparse(b) for b in node.bases):
            vals = [s.value.value for s in node.body if isinstance(s, ast.Assign)
                    and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str)]
            if vals:
                out[node.name] = vals
    return out


def _self_attr(node: ast.AST) -> str | None:
    """``self.X`` or ``self.X.split()`` -> X."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        node = node.func.value
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return None


def _enum_fields(source: str, enums: dict[str, list[str]]) -> dict[str, str]:
    """Fields converted with an enum in the class's code: ``E(self.X)`` or ``[E(s) for s in self.X]``."""
    out: dict[str, str] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in enums and node.args:
            field = _self_attr(node.args[0])
            if field:
                out.setdefault(field, node.func.id)
        if isinstance(node, (ast.ListComp, ast.GeneratorExp)) and isinstance(node.elt, ast.Call) \
                and isinstance(node.elt.func, ast.Name) and node.elt.func.id in enums:
            for gen in node.generators:
                field = _self_attr(gen.iter)
                if field:
                    out.setdefault(field, node.elt.func.id)
    return out


def _split_arg_fields(source: str) -> set[str]:
    return {f for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
            and getattr(node.func, "id", "") == "split_arg" and node.args and (f := _self_attr(node.args[0]))}


def _dist(requirement: str) -> str:
    import re

    return re.split(r"[<>=!~ \[]", requirement, maxsplit=1)[0].strip().lower().replace("_", "-")


def _mandatory(body: list[ast.stmt]) -> list[str]:
    return [_dist(n.args[0].value) for st in body for n in ast.walk(st) if isinstance(n, ast.Call)
            and getattr(n.func, "id", "") == "check_version" and n.args and isinstance(n.args[0], ast.Constant)
            and any(k.arg == "mandatory" and getattr(k.value, "value", False) is True for k in n.keywords)]


def _feature_packages(source: str) -> dict[str, list[str]]:
    """``if obj.X:`` / ``if obj.X is not None:`` -> the distributions its check_version(..., mandatory=True) demands."""
    out: dict[str, list[str]] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == "_check_extra_dependencies":
            for st in ast.walk(node):
                if not isinstance(st, ast.If):
                    continue
                test = st.test
                if isinstance(test, ast.Compare) and isinstance(test.ops[0], ast.IsNot):
                    test = test.left
                if isinstance(test, ast.Attribute) and (dists := _mandatory(st.body)):
                    out.setdefault(test.attr, [])
                    out[test.attr] += [d for d in dists if d not in out[test.attr]]
    return out


def _quantization_packages(source: str, methods: dict[str, str]) -> dict[str, list[str]]:
    """``if model_args.quantization_method == QuantizationMethod.M:`` -> the distributions its branch demands."""
    out: dict[str, list[str]] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare) \
                and ast.unparse(node.test.left).endswith("quantization_method"):
            right = ast.unparse(node.test.comparators[0])
            if right.startswith("QuantizationMethod.") and right.split(".")[1] in methods:
                out[methods[right.split(".")[1]]] = sorted(set(_mandatory(node.body)))
    return out


def _module_list(source: str, name: str) -> list[str]:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == name for t in node.targets):
            return [ast.literal_eval(e) for e in node.value.elts] if hasattr(node.value, "elts") else \
                [ast.literal_eval(k) for k in node.value.keys]
    raise SystemExit(f"{name} not found")


def _class_members(source: str, cls: str) -> list[str]:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return [s.value.value for s in node.body if isinstance(s, ast.Assign)
                    and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str)]
    raise SystemExit(f"class {cls} not found")


def _locked(lock: Path) -> list[str]:
    import re

    return sorted({m.group(1).lower().replace("_", "-") for m in re.finditer(r"^([A-Za-z0-9_.-]+)==", lock.read_text(), re.M)})


def _one(found: list[tuple[str, str]], suffix: str) -> str:
    for name, src in found:
        if name.endswith(suffix):
            return src
    raise SystemExit(f"{suffix} not in the wheel")


def _read(wheel_dir: Path, dist: str, member_suffix: str) -> list[tuple[str, str]]:
    found = []
    for whl in sorted(wheel_dir.glob(f"{dist}-*.whl")):
        with zipfile.ZipFile(whl) as zf:
            for name in zf.namelist():
                if name.endswith(member_suffix):
                    found.append((name, zf.read(name).decode()))
    if not found:
        raise SystemExit(f"no {member_suffix} in {dist} wheels under {wheel_dir}")
    return found


def _members(found: list[tuple[str, str]]) -> dict[str, dict[str, object]]:
    """Enum-like classes' members -> their constant values (``EngineName.HF`` -> 'huggingface')."""
    members: dict[str, dict[str, object]] = {}
    for _name, src in found:
        if _name.endswith(("extras/constants.py", "trainer_utils.py", "transformers/training_args.py")):
            for node in ast.walk(ast.parse(src)):
                if isinstance(node, ast.ClassDef):
                    members.setdefault(node.name, {}).update(
                        {t.id: s.value.value for s in node.body if isinstance(s, ast.Assign)
                         for t in s.targets if isinstance(t, ast.Name) and isinstance(s.value, ast.Constant)})
    return members


def _post_init_rewrites(found: list[tuple[str, str]], enums: set[str]) -> set[str]:
    """Fields rewritten by an argument class's __post_init__ or by the training parser before it checks them."""
    out: set[str] = set()
    for name, src in found:
        if "/hparams/" in name or name == "transformers/training_args.py":
            for node in ast.walk(ast.parse(src)):
                if isinstance(node, ast.FunctionDef) and (node.name == "__post_init__" or (
                        name.endswith("hparams/parser.py") and node.name in PARSER_FUNCTIONS)):
                    out |= gac.rewritten(ast.unparse(node), enums)
    return out


# where the training start checks its arguments: (wheel member, {function: its class, or None})
PARSER_FUNCTIONS = ("get_train_args", "_verify_model_args", "_parse_train_args")
CONDITION_SOURCES = (
    ("transformers/training_args.py", {"_validate_args": "TrainingArguments"}, "transformers"),
    ("hparams/finetuning_args.py", {"__post_init__": "FinetuningArguments"}, "LlamaFactory"),
    ("hparams/data_args.py", {"__post_init__": "DataArguments"}, "LlamaFactory"),
    ("hparams/model_args.py", {"__post_init__": ("BaseModelArguments", "ProcessorArguments", "ExportArguments",
                                                 "KTransformersArguments")}, "LlamaFactory"),
    ("hparams/parser.py", {"get_train_args": None, "_verify_model_args": None}, "LlamaFactory"),
)


def _conditions(lf: list[tuple[str, str]], tf: list[tuple[str, str]], train: dict[str, str],
                enums: dict[str, list[str]]) -> list[tuple[tuple[gac.Atom, ...], str, str]]:
    members = _members(lf + tf)
    skip = _post_init_rewrites(lf + tf, set(enums) | set(members))
    out: list[tuple[tuple[gac.Atom, ...], str, str]] = []
    for suffix, functions, owner in CONDITION_SOURCES:
        for atoms, msg, fn in gac.conditions(_one(lf + tf, suffix), functions, set(train), members):
            where = f"{owner} {suffix.split('/')[-1]} {fn}"
            if not any(a[0] in skip for a in atoms) and all((atoms, msg) != o[:2] for o in out):
                out.append((atoms, msg, where))
    return out


def main(wheel_dir: str, lock: str) -> None:
    wd = Path(wheel_dir)
    train: dict[str, str] = {}
    versions = sorted(p.name for p in wd.glob("*.whl") if p.name.split("-")[0] in
                      ("llamafactory_kt", "transformers_kt", "accelerate_kt", "kt_kernel"))
    lf = _read(wd, "llamafactory_kt", ".py")
    tf = _read(wd, "transformers_kt", ".py")
    acc = _read(wd, "accelerate_kt", ".py")
    kt = _read(wd, "kt_kernel", "sft/config.py")
    for name, src in lf:
        if "/hparams/" in name:
            for cls, fields in _dataclass_fields(src).items():
                for f in fields:
                    train.setdefault(f, cls)
    ta_src = _one(tf, "transformers/training_args.py")
    for name, src in tf:
        if name in ("transformers/training_args.py", "transformers/training_args_seq2seq.py"):
            for cls, fields in _dataclass_fields(src, {"TrainingArguments", "Seq2SeqTrainingArguments"}).items():
                for f in fields:
                    train.setdefault(f, "transformers." + cls)
    templates: set[str] = set()
    for node in ast.walk(ast.parse(_one(lf, "data/template.py"))):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "register_template":
            for kw in node.keywords:
                if kw.arg == "name" and isinstance(kw.value, ast.Constant):
                    templates.add(kw.value.value)
    accel: list[str] = []
    accel_types: dict[str, str] = {}
    for _cls, fields in _dataclass_fields(_one(acc, "commands/config/config_args.py"), {"BaseConfig", "ClusterConfig"},
                                          accel_types).items():
        accel += [f for f in fields if f not in accel]
    enums = {**_enums(_one(tf, "transformers/trainer_utils.py")), **_enums(ta_src),
             **_enums(_one(tf, "transformers/debug_utils.py"))}
    enum_fields = _enum_fields(ta_src, enums)
    list_args: set[str] = set()
    for name, src in lf:
        if "/hparams/" in name:
            list_args |= _split_arg_fields(src)
    features = _feature_packages(_one(lf, "hparams/parser.py"))
    methods = dict(zip(_class_members(_one(lf, "extras/constants.py"), "QuantizationMethod"),
                       _class_members(_one(lf, "extras/constants.py"), "QuantizationMethod"), strict=True))
    methods = {n.upper(): v for n, v in methods.items()}
    quant = _quantization_packages(_one(lf, "model/model_utils/quantization.py"), methods)
    kt_types: dict[str, str] = {}
    _dataclass_fields(kt[0][1], {"KTConfig"}, kt_types)
    acc_dc = _one(acc, "accelerate/utils/dataclasses.py")
    acc_const = _one(acc, "accelerate/utils/constants.py")
    integrations = _module_list(_one(tf, "integrations/integration_utils.py"), "INTEGRATION_TO_CALLBACK")

    def out_tuple(name: str, values, comment: str) -> None:
        print(f"# {comment}")
        print(f"{name}: tuple[str, ...] = (" + ", ".join(repr(v) for v in values) + ("," if len(values) == 1 else "")
              + ")")
        print()

    print('"""Generated by tools/gen_key_catalog.py from: ' + ", ".join(versions) + ' and docker/requirements/full.lock. '
          'Do not edit."""')
    print()
    print("# training-YAML key -> the argument class that owns it")
    print("TRAIN_KEYS: dict[str, str] = {")
    for k in sorted(train):
        print(f"    {k!r}: {train[k]!r},")
    print("}")
    print()
    print("ACCELERATE_KEYS: tuple[str, ...] = (")
    for k in accel:
        print(f"    {k!r},")
    print(")")
    print()
    print("# training-YAML key -> its annotation in the owning dataclass (types.catalog checks values against it)")
    print("KEY_TYPES: dict[str, str] = {")
    for k in sorted(train):
        if k in TYPES:
            print(f"    {k!r}: {TYPES[k]!r},")
    print("}")
    print()
    print("# Accelerate-YAML key -> its annotation in accelerate's ClusterConfig/BaseConfig")
    print("ACCELERATE_KEY_TYPES: dict[str, str] = {")
    for k in accel:
        if k in accel_types:
            print(f"    {k!r}: {accel_types[k]!r},")
    print("}")
    print()
    print("TEMPLATES: frozenset[str] = frozenset({")
    for k in sorted(templates):
        print(f"    {k!r},")
    print("})")
    print()
    print("# TrainingArguments fields its __post_init__ converts with an enum -> (enum, the values it takes, exactly)")
    print("ENUM_CHOICES: dict[str, tuple[str, tuple[str, ...]]] = {")
    for f in sorted(enum_fields):
        print(f"    {f!r}: ({enum_fields[f]!r}, {tuple(enums[enum_fields[f]])!r}),")
    print("}")
    print()
    constants = _one(lf, "extras/constants.py")
    str_enums = {node.name for node in ast.walk(ast.parse(constants)) if isinstance(node, ast.ClassDef)
                 and any(getattr(b, "id", "") == "StrEnum" for b in node.bases)}
    lf_enum_fields = {}
    for k in sorted(train):
        bare = [part.strip() for part in TYPES.get(k, "").split("|") if part.strip() != "None"]
        if "/" not in train[k] and len(bare) == 1 and bare[0] in str_enums:
            lf_enum_fields[k] = (bare[0], tuple(_class_members(constants, bare[0])))
    print("# LlamaFactory fields annotated with one of its StrEnums (extras/constants.py) -> (enum, its values); the")
    print("# argument parser keeps the text as given, and the code compares it with the members")
    print("LF_ENUM_FIELDS: dict[str, tuple[str, tuple[str, ...]]] = {")
    for f, (enum, values) in lf_enum_fields.items():
        print(f"    {f!r}: ({enum!r}, {values!r}),")
    print("}")
    print()
    print("# LlamaFactory fields its __post_init__ passes through split_arg: a comma string or a YAML list")
    print("LIST_ARGS: frozenset[str] = frozenset({" + ", ".join(repr(f) for f in sorted(list_args)) + "})")
    print()
    print("# LlamaFactory switch -> distributions check_version(..., mandatory=True) demands (hparams/parser.py)")
    print("FEATURE_PACKAGES: dict[str, tuple[str, ...]] = {")
    for f in sorted(features):
        print(f"    {f!r}: {tuple(features[f])!r},")
    print("}")
    print()
    print("# quantization_method -> distributions the on-the-fly quantization demands (model/model_utils/quantization.py)")
    print("QUANTIZATION_PACKAGES: dict[str, tuple[str, ...]] = {")
    for m in sorted(quant):
        print(f"    {m!r}: {tuple(quant[m])!r},")
    print("}")
    print()
    print("# distributions the image installs (docker/requirements/full.lock), normalised names")
    print("LOCKED: frozenset[str] = frozenset({")
    for d in _locked(Path(lock)):
        print(f"    {d!r},")
    print("})")
    print()
    out_tuple("REPORT_INTEGRATIONS", integrations, "report_to names transformers knows (integration_utils.INTEGRATION_TO_CALLBACK)")
    print("# kt-kernel KTConfig fields -> annotation (kt_kernel/sft/config.py)")
    print("KT_FIELDS: dict[str, str] = {")
    for k, v in kt_types.items():
        print(f"    {k!r}: {v!r},")
    print("}")
    print()
    members = _members(lf + tf)
    print("# training-YAML key -> its default when the owning dataclass writes it as a literal or an enum member")
    print("TRAIN_DEFAULTS: dict[str, object] = {")
    for k in sorted(train):
        d = DEFAULTS.get(k, KeyError)
        if isinstance(d, EnumDefault):
            d = members.get(d[0], {}).get(d[1], KeyError)
        if d is not KeyError:
            print(f"    {k!r}: {d!r},")
    print("}")
    print()
    print("# accelerate launch's own defaults for its options (commands/launch.py add_argument default=...)")
    print("LAUNCH_DEFAULTS: dict[str, object] = {")
    for k, v in sorted(_launch_defaults(_one(acc, "accelerate/commands/launch.py")).items()):
        print(f"    {k!r}: {v!r},")
    print("}")
    print()
    print("# The stack's argument checks decidable from the recipe's text (tools/gen_arg_conditions.py): each is")
    print("# ((field, op, literal), ...) joined by `and`, the message it raises, and where: transformers")
    print("# TrainingArguments._validate_args, LlamaFactory FinetuningArguments/DataArguments.__post_init__, hparams/parser.py")
    print("# get_train_args/_verify_model_args.")
    print("ARG_CONDITIONS: tuple[tuple[tuple[tuple[str, str, object], ...], str, str], ...] = (")
    for atoms, msg, where in _conditions(lf, tf, train, enums):
        print(f"    ({atoms!r}, {msg!r}, {where!r}),")
    print(")")
    print()
    print("# TrainingArguments fields whose metadata lists their choices (transformers/training_args.py)")
    print("FIELD_CHOICES: dict[str, tuple[str, ...]] = {")
    field_choices = gac.metadata_choices(ta_src, "TrainingArguments")
    for f, values in sorted(field_choices.items()):
        print(f"    {f!r}: {values!r},")
    print("}")
    print()
    measured = json.loads((Path(lock).parent / "torch_backends.json").read_text())
    if tuple(measured["choices"]) != field_choices["ddp_backend"]:
        raise SystemExit("docker/requirements/torch_backends.json was measured on other ddp_backend choices: rerun "
                         "tools/torch_backends.py in the image")
    print(f"# ddp_backend names the image's torch ({measured['torch']}) refuses in init_process_group, with its message")
    print("# (tools/torch_backends.py, run in the image -> docker/requirements/torch_backends.json)")
    print("TORCH_REFUSED_DDP_BACKENDS: dict[str, str] = {")
    for name, why in sorted(measured["refused"].items()):
        print(f"    {name!r}: {why!r},")
    print("}")
    print()
    out_tuple("DISTRIBUTED_TYPES", _class_members(acc_dc, "DistributedType"), "accelerate DistributedType values")
    out_tuple("PRECISION_TYPES", _class_members(acc_dc, "PrecisionType"), "accelerate PrecisionType values")
    out_tuple("DYNAMO_BACKENDS", _class_members(acc_dc, "DynamoBackend"), "accelerate DynamoBackend values")
    for name in ("FSDP_SHARDING_STRATEGY", "FSDP_AUTO_WRAP_POLICY", "FSDP_BACKWARD_PREFETCH", "FSDP_STATE_DICT_TYPE"):
        out_tuple(name, _module_list(acc_const, name), f"accelerate utils/constants.py {name}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else str(Path(__file__).resolve().parents[1] / "docker" /
                                                                  "requirements" / "full.lock"))
