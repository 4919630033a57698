"""The resource model: peak host RSS, peak GPU memory per GPU and disk, from a recipe and a config.json.

Pure: ``estimate(recipe_or_dicts, arch, gpus=None) -> ResourcePlan``. The model is a list of terms
(core/sizing/terms.Term: a name, a value, the formula with its figures and sources), each a small function of the
recipe's setup (core/sizing/setup.py) and the model's dimensions in core/sizing/memory_terms.py; ``estimate``
composes them. Buffer shapes follow kt-kernel's SFT MoE operator (memory_terms.py says which).

Constants that are not a byte width come from measurements and say which (MEASURED below); the comparison
with every measured peak is ``bench/results/planner-calibration.md`` (``bench/planner_calibration.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ktdeploy.core.recipe.document import RecipeSections
from ktdeploy.core.sizing import memory_terms as mt
from ktdeploy.core.sizing.model_config import MoEArchitecture
from ktdeploy.core.sizing.setup import expert_format as expert_format
from ktdeploy.core.sizing.setup import setup_from as setup_from
from ktdeploy.core.sizing.terms import GIB as GIB
from ktdeploy.core.sizing.terms import Measured as Measured
from ktdeploy.core.sizing.terms import Term as Term

# ---- constants from measurements ---------------------------------------------------------------------
MEASURED = {
    # Host RSS of one training process whose weights are negligible: Python, torch + CUDA host side, LlamaFactory,
    # kt_kernel and their imports. Median residual per process of the KT runs measured on the GPU machine
    # (bench/results/gpu_peaks.json; `bench/planner_calibration.py --fit`). bench/gpu/process_floor.py's bare
    # torch+transformers floor was 1.21 GiB: LlamaFactory and kt_kernel add the rest.
    "process_host_gib": Measured(2.6405, "median residual of the KT runs whose training phase dominates "
                                        "(bench/results/gpu_peaks.json, GPU machine, process-tree RSS: tiny medium, "
                                        "large, the 5-39 GB weight_scale and the vocab_scale runs)"),
    # RSS of one datasets.map worker process while the dataset is tokenized (preprocessing_num_workers), before any
    # weight is loaded: (peak before the weights load - floor) / workers, median over the runs whose RSS timeline
    # and log place that phase (pre_weights_peak_gib: 3.33-3.49 GiB on most runs); it sets the smallest run's peak.
    "preprocessing_worker_gib": Measured(0.376, "median over the runs of bench/results/gpu_peaks.json with "
                                                "pre_weights_peak_gib: (that peak - floor) / 2 workers"),
    # GPU memory a training process holds outside PyTorch's caching allocator: CUDA context, cuBLAS/cuDNN handles,
    # NCCL. Measured directly: nvidia-smi's memory.used above idle minus torch.cuda.max_memory_reserved, the same
    # 1.294-1.298 GiB on all ten runs of bench/gpu/vocab_scale.py (0.9 to 19.5 GiB reserved).
    "process_gpu_gib": Measured(1.294, "nvidia-smi used minus torch's reserved peak, every run of "
                                       "bench/results/gpu/vocab_scale (H200, torch 2.11)"),
    # Reserved above the allocated peak beyond the modelled holes (the freed logits block, the gradient-reduction
    # stream): allocator block rounding and the small-block pool, 0.02-0.3 GiB with no trend in the measurements.
    # The constant that bounds the worst relative GPU error of the one-GPU runs (`bench/planner_calibration.py --fit`).
    "gpu_allocator_reserve_gib": Measured(0.0448, "minimax fit: the constant that bounds the largest relative GPU "
                                                  "error of the one-GPU runs of bench/results/gpu_peaks.json"),
    # Host RSS not explained by the terms above, per GiB of routed-expert weights, in multi-GPU runs: loader
    # staging for the other ranks, glibc arena fragmentation. Single-GPU runs (small..large and the ~9.7 B
    # weight-dominated run of issue 19) show none, so it is not applied to them. One-point fit: the cookbook's Qwen3-235B-A22B-2507 BF16 LoRA row
    # (2 GPUs, cutoff 2048: 545.36 GiB host RSS) minus the modelled terms, over its routed-expert GiB.
    "host_slack_per_expert_gib": Measured(0.1944, "one-point fit to the cookbook §4 Qwen3-235B-A22B-2507 row "
                                                  "(545.36 GiB host RSS, 2 GPUs); applied to multi-GPU runs only"),
    # GPU memory not explained by the terms above, as a fraction of the modelled per-GPU allocations: caching-
    # allocator fragmentation, reserved-but-free blocks, loss temporaries. One-point fit: the same row's
    # 27.14 GiB per GPU against the modelled allocations (context excluded).
    "gpu_slack_fraction": Measured(0.1121, "one-point fit to the cookbook §4 Qwen3-235B-A22B-2507 row "
                                           "(27.14 GiB per GPU, 2 GPUs); applied to multi-GPU runs only"),
}


@dataclass
class ResourcePlan:
    host_memory_gib: float
    gpu_memory_gib_per_gpu: float
    disk_gib: float
    breakdown: list[Term]
    setup: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def terms(self, resource: str) -> list[Term]:
        return [t for t in self.breakdown if t.resource == resource]

    def to_json(self) -> dict[str, Any]:
        return {"host_memory_gib": round(self.host_memory_gib, 2),
                "gpu_memory_gib_per_gpu": round(self.gpu_memory_gib_per_gpu, 2),
                "disk_gib": round(self.disk_gib, 2),
                "breakdown": [t.to_json() for t in self.breakdown],
                "setup": self.setup, "notes": self.notes}


# What the planner sizes: a Recipe (or a stand-in with its sections), a recipe document, or (train, accelerate).
PlanInput = RecipeSections | dict[str, Any] | tuple[Mapping[str, Any], Mapping[str, Any]]


def merges(recipe_or_dicts: PlanInput) -> bool:
    """deploy.serve.merge is on (a Recipe or a document dict); the merged model then needs the base's size again."""
    deploy = getattr(recipe_or_dicts, "deploy", None)
    if deploy is not None:
        return bool(getattr(getattr(deploy, "serve", None), "merge", False))
    if isinstance(recipe_or_dicts, dict):
        serve = (recipe_or_dicts.get("deploy") or {}).get("serve") if isinstance(recipe_or_dicts.get("deploy"), dict) else None
        return isinstance(serve, dict) and serve.get("merge") is True
    return False


def _inputs(recipe_or_dicts: PlanInput) -> tuple[dict[str, Any], dict[str, Any]]:
    if isinstance(recipe_or_dicts, tuple | list):
        train, accelerate = recipe_or_dicts
        return dict(train or {}), dict(accelerate or {})
    if isinstance(recipe_or_dicts, dict):
        return dict(recipe_or_dicts.get("train") or {}), dict(recipe_or_dicts.get("accelerate") or {})
    return dict(recipe_or_dicts.train or {}), dict(recipe_or_dicts.accelerate or {})


# ---- the model: its terms, composed --------------------------------------------------------------------

def _terms(fns: Sequence[mt.TermFn], m: mt.Model) -> list[Term]:
    return [t for t in (fn(m) for fn in fns) if t is not None]


def _one(term: Term | None) -> list[Term]:
    return [term] if term is not None else []


def estimate(recipe_or_dicts: PlanInput, arch: MoEArchitecture, gpus: int | None = None,
             constants: dict[str, Measured] | None = None) -> ResourcePlan:
    """Peak host RSS, peak GPU memory per GPU and disk for one training run (GiB, 2^30 bytes): the host terms and
    the tokenization phase's excess over them, the GPU terms, the allocator's slack over them and the CUDA context,
    the disk terms (core/sizing/memory_terms.py)."""
    train, accelerate = _inputs(recipe_or_dicts)
    s = setup_from(train, accelerate, gpus)
    m = mt.Model(s, arch, {**MEASURED, **(constants or {})}, merges=merges(recipe_or_dicts))
    host = _terms(mt.HOST_TERMS, m)
    host += _one(mt.tokenization_workers(m, host))
    gpu = _terms(mt.GPU_TERMS, m)
    gpu += [*_one(mt.allocator_slack(m, gpu)), mt.cuda_context(m)]
    terms = host + gpu + _terms(mt.DISK_TERMS, m)
    setup = {k2: getattr(s, k2) for k2 in s.__dataclass_fields__}
    setup.update(kt_max_len=s.kt_max_len, tokens_per_gpu=s.tokens_per_gpu)
    return ResourcePlan(_total(terms, "host"), _total(terms, "gpu"), _total(terms, "disk"), terms, setup=setup,
                        notes=mt.notes(m))


def _total(terms: Sequence[Term], resource: str) -> float:
    return sum(t.gib for t in terms if t.resource == resource)
