"""The independent recipe generator (tests/oracle/independent_gen.py) and the harness's pure parts.

The generator feeds a standing oracle, so what it promises is tested here: deterministic for a seed, n distinct
cases, each a readable YAML recipe with 1-4 changes to one shipped recipe, covering every kind of change, and
written without ktdeploy's rules (it imports nothing from ktdeploy)."""

from __future__ import annotations

import ast
import collections
import math
import time
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from tests.oracle import harness
from tests.oracle import independent_gen as gen

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
SEED = 20261204
N = 2500


@pytest.fixture(scope="module")
def corpus():
    t0 = time.monotonic()
    out = gen.cases(SEED, N)
    return out, time.monotonic() - t0


def test_n_distinct_cases_fast(corpus):
    cases, seconds = corpus
    assert len(cases) == N
    assert len({c[0] for c in cases}) == N
    assert len({gen.dump_recipe(c[1]) for c in cases}) == N
    shipped = {gen.dump_recipe(b) for b in gen.base_recipes().values()}
    assert not shipped & {gen.dump_recipe(c[1]) for c in cases}, "an unchanged shipped recipe is not a case"
    assert seconds < 20, f"{N} cases took {seconds:.1f} s"


def test_deterministic_and_prefix_stable(corpus):
    cases, _ = corpus
    again = gen.cases(SEED, 300)
    assert [(i, gen.dump_recipe(r), d) for i, r, d in again] == \
        [(i, gen.dump_recipe(r), d) for i, r, d in cases[:300]]
    other = gen.cases(SEED + 1, 300)
    assert [gen.dump_recipe(r) for _, r, _ in other] != [gen.dump_recipe(r) for _, r, _ in cases[:300]]


def test_every_case_is_a_yaml_recipe_with_one_to_four_changes(corpus):
    cases, _ = corpus
    bases = gen.base_recipes()
    for case_id, recipe, desc in cases:
        base, changes = desc.split(": ", 1)
        assert base in bases, case_id
        assert 1 <= len(changes.split(" | ")) <= 4, desc
        text = gen.dump_recipe(recipe)
        doc = yaml.load(text, Loader=LOADER)  # YAML 1.1, as accelerate reads it
        assert set(doc) == {"train", "accelerate", "deploy"}, case_id
        assert isinstance(doc["train"], dict) and isinstance(doc["accelerate"], dict)
        assert harness.leaf_diffs(bases[base], recipe), f"{case_id} changes nothing"


def test_leaf_diffs_rebuild_each_case(corpus):
    cases, _ = corpus
    bases = gen.base_recipes()
    for case_id, recipe, desc in cases[:800]:
        base = bases[desc.split(":", 1)[0]]
        rebuilt = harness.apply_diffs(base, harness.leaf_diffs(base, recipe))
        assert yaml.load(gen.dump_recipe(rebuilt), Loader=LOADER) == yaml.load(gen.dump_recipe(recipe), Loader=LOADER), \
            case_id


def test_covers_every_mutation_kind_section_and_base(corpus):
    cases, _ = corpus
    text = "\n".join(d for _, _, d in cases)
    for marker in ("(YAML 1.1 spelling)", "(spelling variant)", "(boundary)", "(list for a scalar)",
                   "(scalar for a list)", "drop ", "rename ", "eval: ", "best model: ", "streaming: ", "optimizer: ",
                   "quantization: ", "fsdp: ", "fsdp options: ", "distributed: ", "processes: ", "precision: ",
                   "kt: ", "activation: ", "feature: ", "package: ", "steps: ", "sizes: ", "kt numbers: ", "lora: ", "stage: ",
                   "accelerate: ", "(a str for", "(a bool for", "(a list for"):
        assert marker in text, marker
    for section in ("train.", "train.kt_config.", "accelerate.", "accelerate.fsdp_config."):
        assert sum(section in d for _, _, d in cases) > 100, section
    assert {d.split(":", 1)[0] for _, _, d in cases} == set(gen.base_recipes())
    counts = collections.Counter(len(d.split(": ", 1)[1].split(" | ")) for _, _, d in cases)
    assert set(counts) == {1, 2, 3, 4}


def test_issue_classes_are_generated(corpus):
    """The classes named in issue 36 are among the cases (so a looser rule for them can be found)."""
    cases, _ = corpus
    text = "\n".join(d for _, _, d in cases)
    for needle in ('kt_backend=" auto"', 'kt_weight_lifecycle="Ephemeral"', "train.kt_use_lora_experts=true",
                   "train.kt_expert_checkpoint_path=", "train.do_eval=true", "train.do_predict=true",
                   "train.load_best_model_at_end=true", "train.streaming=", "train.use_galore=true",
                   "train.use_apollo=true", "train.use_badam=true", "train.quantization_bit=",
                   "drop accelerate.fsdp_config.fsdp_version", 'accelerate.distributed_type="MULTI_GPU"',
                   'accelerate.distributed_type="fsdp"', "train.warmup_ratio=-0.1", "train.seed=4294967296",
                   "train.enable_liger_kernel=true", "train.use_adam_mini=true", "train.use_swanlab=true",
                   "kt_share_cache_pool", "kt_checkpoint_files", "kt_wrap_kwargs"):
        assert needle in text, needle


def test_keys_come_from_the_stack_catalogue_not_from_ktdeploy():
    source = Path(gen.__file__).read_text()
    imported = {n.module or "" for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Import) for a in n.names}
    assert not any(m.startswith("ktdeploy") for m in imported), imported
    cat = gen.catalog()
    assert cat["versions"]["llamafactory-kt"] == "0.9.6.dev0" and cat["versions"]["kt-kernel"] == "0.7.2"
    fields = gen._fields()
    assert {"lr_scheduler_type", "use_kt", "kt_cpu_activation", "lora_target", "streaming"} <= set(fields["train"])
    assert "kt_share_cache_pool" in fields["kt_config"] and "kt_wrap_kwargs" in fields["kt_config"]
    assert "fsdp_version" in fields["fsdp_config"] and "distributed_type" in fields["accelerate"]
    assert "cosine" in fields["train"]["lr_scheduler_type"]["choices"]


@pytest.mark.parametrize(("value", "loaded"), [
    (1.0e-5, 1.0e-5), (1.0e30, 1.0e30), (0.5, 0.5), (-0.1, -0.1), ("yes", "yes"), ("off", "off"), ("08", "08"),
    ("1e3", "1e3"), ("", ""), (" auto", " auto"), ("a: b", "a: b"), (None, None), (True, True), (2**63, 2**63),
    ([1, "no"], [1, "no"]), ({"k": "on"}, {"k": "on"}), (float("inf"), float("inf")),
])
def test_dump_means_the_value_for_yaml11_and_omegaconf(value, loaded):
    text = gen.dump_recipe({"v": value})
    assert yaml.safe_load(text)["v"] == loaded
    assert OmegaConf.to_container(OmegaConf.create(text))["v"] == loaded


def test_raw_scalars_are_written_verbatim():
    text = gen.dump_recipe({"a": gen.Raw("yes"), "b": gen.Raw("0x10"), "c": gen.Raw("1e-4"), "d": gen.Raw("~")})
    assert text == "a: yes\nb: 0x10\nc: 1e-4\nd: ~\n"
    doc = yaml.safe_load(text)
    assert doc == {"a": True, "b": 16, "c": "1e-4", "d": None}  # PyYAML: YAML 1.1 bool/hex; 1e-4 stays a string
    assert OmegaConf.to_container(OmegaConf.create(text))["c"] == 1e-4  # OmegaConf's float resolver reads it
    assert math.isnan(yaml.safe_load(gen.dump_recipe({"v": float("nan")}))["v"])


def test_template_folds_values_but_keeps_the_rule():
    t = harness.template
    assert t("Cosine is not a valid SchedulerType, please select one of ['linear']") == \
        t("x is not a valid SchedulerType, please select one of ['cosine']")
    assert t("unknown kt_backend ' auto'; expected one of ['auto']") == t("unknown kt_backend 'auto '; expected one of ['x']")
    assert t("invalid truth value shard_grad_op") == t("invalid truth value []")
    assert t("unknown keys (['a', 'b'])") == t("unknown keys (['a', 'b', 'c'])")
    assert t("received distributed_type=DistributedType.MULTI_GPU.") == t("received distributed_type=DistributedType.NO.")
    assert t("Please specify `max_steps` in streaming mode.") != t("Please enable `predict_with_generate`.")


def test_classify():
    ok, bad = {"ktdeploy": {"valid": True}}, {"ktdeploy": {"valid": False}}
    assert harness.classify(ok, {"verdict": "accept"}) == "agree"
    assert harness.classify(bad, {"verdict": "refuse"}) == "agree"
    assert harness.classify(ok, {"verdict": "refuse"}) == "ktdeploy-looser"
    assert harness.classify(bad, {"verdict": "accept"}) == "ktdeploy-stricter"


# ---------------------------------------------------------------- profile "issue49"

@pytest.fixture(scope="module")
def corpus49():
    return gen.cases(20261207, 1200, "issue49")


def test_profile_v1_is_unchanged_by_issue49():
    assert gen.mutation_names("v1") == gen.mutation_names()[:len(gen.MUTATIONS)]
    assert set(gen.mutation_names("issue49")) - set(gen.mutation_names("v1")) == {m.__name__ for m, _ in gen.MUTATIONS_49}
    assert set(gen.base_recipes("v1")) == set(gen.BASES) < set(gen.base_recipes("issue49"))


def test_issue49_cases_deterministic_and_cover_each_class(corpus49):
    again = gen.cases(20261207, 200, "issue49")
    assert [(i, gen.dump_recipe(r), d) for i, r, d in again] == \
        [(i, gen.dump_recipe(r), d) for i, r, d in corpus49[:200]]
    counts = collections.Counter(c for _, _, d in corpus49 for c in harness.mutation_classes(d))
    assert set(counts) == set(harness.ISSUE49_CLASSES), counts
    assert min(counts.values()) >= 40, counts
    assert {d.split(":", 1)[0] for _, _, d in corpus49} == set(gen.base_recipes("issue49"))
    dependent = [d for _, _, d in corpus49 if gen.model_dependent(d)]
    assert 0.15 < len(dependent) / len(corpus49) < 0.6
    assert all(any(p in d for p in gen.MODEL_DEPENDENT) for d in dependent)


def test_issue49_values_come_from_the_stack_and_the_model(corpus49):
    text = "\n".join(d for _, _, d in corpus49)
    for needle in ("train.lora_target=null", 'train.infer_backend="vllm"', "train.use_dora=true",
                   "train.use_rslora=true", 'train.finetuning_type="full"', "train.dataloader_prefetch_factor=",
                   "train.dataloader_num_workers=0", "train.ddp_backend=", "train.additional_target=",
                   "train.modules_to_save=", "train.kt_config.kt_threadpool_count=", "train.model_name_or_path="):
        assert needle in text, needle
    # ddp_backend: transformers' own choices (argparse metadata) and names torch does not know
    backends = {r["train"]["ddp_backend"] for _, r, _ in corpus49 if "ddp_backend" in r["train"]}
    known = set(gen._fields()["train"]["ddp_backend"]["meta_choices"])
    assert known == {"nccl", "gloo", "mpi", "xccl", "hccl", "cncl", "mccl"}
    assert backends & known and backends - known
    # module names: the architecture's own (the catalogue, built from recipes/models) and names it lacks
    import re

    seen = collections.Counter()
    for _, recipe, desc in corpus49:
        for m in re.finditer(r"modules: train\.(\w+)=[^|]*? \((present|absent) in ([^)]+)\)", desc):
            key, what, stem = m.groups()
            value = recipe["train"][key]
            names = set(value if isinstance(value, list) else str(value).split(","))
            own = set(gen.model_modules(stem)["names"])
            assert (names <= own) if what == "present" else not (names & own), m.group(0)
            seen[what] += 1
    assert seen["present"] > 20 and seen["absent"] > 20, seen


def test_model_modules_catalogue_is_the_architectures():
    mods = gen.catalog()["model_modules"]
    assert set(mods) == set(gen.model_stems())
    assert {"q_proj", "k_proj", "v_proj", "o_proj"} <= set(mods["tiny-qwen3-moe"]["linear"])
    assert "q_a_proj" in mods["DeepSeek-V3"]["linear"] and "q_a_proj" not in mods["tiny-qwen3-moe"]["names"]
    assert "error" in mods["Kimi-K2-Instruct"]  # remote code: this transformers has no class for it


def test_model_dependent_reads_the_prefixes():
    assert gen.model_dependent("tiny-moe-lora: modules: train.lora_target=\"x\" (absent in tiny-qwen3-moe)")
    assert gen.model_dependent("tiny-moe-lora: train.seed=1 | kt dims: (tiny-qwen3-moe: ...) a=1")
    assert not gen.model_dependent("tiny-moe-lora: lora null: train.lora_target=null | train.seed=1")
    assert harness.mutation_classes("x: lora null: a | model: b | train.seed=1") == {"lora null", "model"}


def test_judge_workers_keep_a_model_config_together():
    from tests.oracle import stack_judge

    entries = [{"case_id": f"c{i}", "model_config": f"recipes/models/{m}.json"}
               for i, m in enumerate(["tiny-qwen3-moe"] * 6 + ["DeepSeek-V3"] * 3 + ["GLM-4.5-Air"] * 4 + ["x"])]
    chunks = stack_judge._chunks(entries, 2)
    assert sorted(e["case_id"] for c in chunks for e in c) == sorted(e["case_id"] for e in entries)
    owner = {e["model_config"]: {i for i, c in enumerate(chunks) if e in c} for e in entries}
    assert all(len(v) == 1 for v in owner.values()), owner
