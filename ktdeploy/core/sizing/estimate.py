"""The resource model: peak host RSS, peak GPU memory per GPU and disk, from a recipe and a config.json.

Pure: ``estimate(recipe_or_dicts, arch, gpus=None) -> ResourcePlan``. Every term is one line below with its
explanation. Buffer shapes follow kt-kernel's SFT MoE operator (kt-kernel/operators/amx/sft_moe.hpp,
``init_all_buffers`` / ``alloc_forward_buffers`` / ``alloc_backward_buffers``; kt-kernel/python/sft/wrapper.py and
config.py for defaults): rank 0 owns every KT layer; its token capacity ``max_len`` is
``kt_model_max_length x num_processes`` rounded up to the AMX M step; pools are per NUMA part
(``kt_threadpool_count`` when ``kt_tp_enabled``), not per thread.

Constants that are not a byte width come from measurements and say which (MEASURED below); the comparison
with every measured peak is ``bench/results/planner-calibration.md`` (``bench/planner_calibration.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ktdeploy.core.errors import RecipeError
from ktdeploy.core.recipe.document import RecipeSections
from ktdeploy.core.recipe.expert_format import expert_setup
from ktdeploy.core.recipe.train_keys import TrainKeys, as_bool, as_int
from ktdeploy.core.sizing.model_config import MoEArchitecture

GIB = 2**30
AMX_M_STEP = 32      # kt-kernel _AMX_M_STEP: max_len is rounded up to it
AMX_K_STEP = 32      # LoRA rank is padded to it in the AMX BufferB copies (padded_lora_rank_)


@dataclass(frozen=True)
class Measured:
    value: float
    source: str


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


@dataclass(frozen=True)
class Term:
    resource: str          # host | gpu | disk
    name: str
    gib: float
    explanation: str

    def to_json(self) -> dict[str, Any]:
        return {"resource": self.resource, "name": self.name, "gib": round(self.gib, 3),
                "explanation": self.explanation}


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


# ---- the recipe's knobs, with LlamaFactory / HF Trainer / kt-kernel defaults -----------------------------

@dataclass(frozen=True)
class Setup:
    finetuning: str            # lora | full
    lora_rank: int
    expert_format: str         # bf16 | fp8 | int8 | int4
    cutoff_len: int
    batch: int
    packing: bool
    gradient_checkpointing: bool
    cpu_activation: str        # retain | recompute
    cache_depth: int
    share_backward_bb: bool
    tp_parts: int
    num_threads: int
    model_max_length: int
    num_processes: int
    fsdp: bool
    mixed_precision: str
    cpu_ram_efficient_loading: bool
    dataloader_workers: int
    preprocessing_workers: int
    save_total_limit: int | None
    save_steps: int | None
    max_steps: int | None
    save_only_model: bool
    save_strategy: str
    num_train_epochs: float
    num_gpu_experts: int
    weight_lifecycle: str

    @property
    def tokens_per_gpu(self) -> int:
        return self.cutoff_len * self.batch

    @property
    def kt_max_len(self) -> int:
        """Rows of every KT buffer: rank 0 receives all ranks' tokens (wrapper.py: x world size)."""
        return _ceil_to(self.model_max_length * self.num_processes, AMX_M_STEP)

    @property
    def padded_rank(self) -> int:
        return _ceil_to(self.lora_rank, AMX_K_STEP) if self.lora_rank else 0


def _ceil_to(x: float, m: int) -> int:
    return int(math.ceil(x / m) * m)


def _epochs(v: Any) -> float:
    """num_train_epochs (HF default 3). A value the Trainer cannot count steps from (not a number, nan, inf) is
    no plan, said with the key (doctor's plan.* checks are skipped naming it; `check` reports the value)."""
    try:
        epochs = float(v or 3.0)
    except (TypeError, ValueError, OverflowError):
        epochs = math.nan
    if not math.isfinite(epochs) or epochs < 0:
        raise RecipeError(f"num_train_epochs {str(v)[:40]!r} is not a number of epochs", key="train.num_train_epochs",
                          fix="e.g. num_train_epochs: 3")
    return epochs


def expert_format(train: Mapping[str, Any], arch: MoEArchitecture | None = None) -> str:
    """Routed-expert format in CPU memory, decided once for the whole package by
    recipe/expert_format.py expert_setup (kt-kernel's own rule: the format, else the one kt_backend implies)."""
    fmt = expert_setup(TrainKeys(train).kt_config)
    return fmt if fmt in ("bf16", "fp8", "int8", "int4") else "bf16"


def setup_from(train: Mapping[str, Any], accelerate: dict[str, Any], gpus: int | None = None) -> Setup:
    t = TrainKeys(train)
    kt = t.kt_config
    cutoff, batch, packing = t.cutoff_len, t.per_device_train_batch_size, t.packing
    derived = _ceil_to(cutoff + (1 if packing else 0), 8) * batch      # LlamaFactory raises kt_model_max_length to this
    mml = max(as_int(kt.get("kt_model_max_length"), 0) or 0, derived)
    nproc = gpus or as_int(accelerate.get("num_processes"), 1) or 1
    fsdp = str(accelerate.get("distributed_type", "")).upper() == "FSDP" or bool(accelerate.get("fsdp_config"))
    fcfg_raw = accelerate.get("fsdp_config")
    fcfg: dict[str, Any] = fcfg_raw if isinstance(fcfg_raw, dict) else {}
    full = t.is_full
    tp_enabled = as_bool(kt.get("kt_tp_enabled"), False)
    return Setup(
        finetuning="full" if full else "lora",
        lora_rank=0 if full else t.lora_rank,
        expert_format=expert_format(train),
        cutoff_len=cutoff, batch=batch, packing=packing,
        gradient_checkpointing=t.gradient_checkpointing,
        cpu_activation=t.cpu_activation,
        cache_depth=as_int(kt.get("kt_max_cache_depth"), 2) or 2,
        share_backward_bb=as_bool(kt.get("kt_share_backward_bb"), True),
        tp_parts=(as_int(kt.get("kt_threadpool_count"), 1) or 1) if tp_enabled else 1,
        num_threads=as_int(kt.get("kt_num_threads"), 1) or 1,
        model_max_length=mml, num_processes=nproc, fsdp=fsdp,
        mixed_precision=str(accelerate.get("mixed_precision") or "no").lower(),
        cpu_ram_efficient_loading=as_bool(fcfg.get("fsdp_cpu_ram_efficient_loading"), True),
        dataloader_workers=t.dataloader_workers,
        preprocessing_workers=t.preprocessing_workers,
        save_total_limit=t.save_total_limit,
        save_steps=t.save_steps,
        max_steps=t.max_steps,
        save_only_model=t.save_only_model,
        save_strategy=t.save_strategy,
        num_train_epochs=_epochs(t.num_train_epochs),
        num_gpu_experts=as_int(kt.get("kt_num_gpu_experts"), 0) or 0,
        weight_lifecycle=str(kt.get("kt_weight_lifecycle") or "persistent").lower(),
    )


def expert_bytes_per_param(fmt: str, arch: MoEArchitecture) -> float:
    """Bytes per routed-expert weight including its scales (averaged over gate/up [I x H] and down [H x I])."""
    h, i = arch.hidden_size, arch.moe_intermediate_size
    if fmt == "fp8":     # E4M3 + one fp32 scale per 128x128 block (the FP8 SFT backend requires 128x128)
        return 1.0 + 4.0 / (128 * 128)
    if fmt == "int8":    # int8 + one fp32 scale per output channel: gate/up rows have H inputs, down rows I
        return 1.0 + 4.0 * (2.0 / h + 1.0 / i) / 3.0
    if fmt == "int4":    # two weights per byte + one fp32 scale per output channel (kt-kernel BufferBInt4)
        return 0.5 + 4.0 * (2.0 / h + 1.0 / i) / 3.0
    return 2.0           # bf16


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


# ---- the model -----------------------------------------------------------------------------------------

def estimate(recipe_or_dicts: PlanInput, arch: MoEArchitecture, gpus: int | None = None,
             constants: dict[str, Measured] | None = None) -> ResourcePlan:
    """Peak host RSS, peak GPU memory per GPU and disk for one training run (GiB, 2^30 bytes)."""
    train, accelerate = _inputs(recipe_or_dicts)
    s = setup_from(train, accelerate, gpus)
    c = {**MEASURED, **(constants or {})}
    terms: list[Term] = []
    notes: list[str] = []

    def add(resource: str, name: str, nbytes: float, why: str) -> None:
        terms.append(Term(resource, name, nbytes / GIB, why))

    H, I, E, k = arch.hidden_size, arch.moe_intermediate_size, arch.num_experts, arch.experts_per_tok  # noqa: E741 (model notation)
    L = arch.moe_layers
    P = s.tp_parts
    Ip = I / P                                 # intermediate slice of one NUMA part
    r, rp = s.lora_rank, s.padded_rank
    ml = s.kt_max_len
    safe = ml * k + E * AMX_M_STEP             # kt-kernel safe_alloc_tokens: routed rows + per-expert padding
    lora = s.finetuning == "lora" and r > 0
    bpp = expert_bytes_per_param(s.expert_format, arch)
    layer_expert_bytes = E * 3 * H * I * bpp
    cpu_layers = L

    # ---------------------------------------------------------------- host (rank 0 owns every KT layer)
    add("host", f"routed experts ({s.expert_format})", cpu_layers * layer_expert_bytes,
        f"{L} MoE layers x {E} experts x 3 x {H}x{I} weights at {bpp:.4g} B each (format {s.expert_format})")
    if s.num_gpu_experts:
        notes.append("kt_num_gpu_experts > 0: the SFT path still routes every expert through KT (wrapper.py)")
    add("host", "backward weight copies",
        (1 if s.share_backward_bb else L) * layer_expert_bytes,
        "transposed expert weights for the backward GEMM: one layer's worth shared by all layers"
        if s.share_backward_bb else
        f"kt_share_backward_bb: false keeps a transposed copy per layer (x{L}): doubles expert memory")
    if s.weight_lifecycle == "ephemeral":
        add("host", "ephemeral INT8 staging (/dev/shm)", cpu_layers * layer_expert_bytes,
            "kt_weight_lifecycle: ephemeral stages the INT8 experts in /dev/shm (tmpfs: counts against RAM)")
    if lora:
        lora_params = L * E * r * 3 * (H + I)
        add("host", "expert LoRA params, grads, AdamW", lora_params * 8,
            f"rank {r} A/B on gate/up/down of every expert ({lora_params/1e9:.3f} B params): bf16 param + bf16 grad "
            "+ bf16 exp_avg/exp_avg_sq (lora.py creates them bf16; AdamW states follow the param dtype)")
        # MEASURED, NOT YET EXPLAINED: counting these at the real rank r fits every measured run; the padded rank
        # (kt-kernel's padded_lora_rank_, r rounded up to K_STEP=32) over-predicts (large run: +0.48 GiB; most of
        # the +11.4 % host error of issue 19's ~9.7 B rank-8 run). The kt-kernel sft_moe.hpp versions readable
        # through the search tools aligned_alloc + memset the padded pool per layer, which would make the padded
        # bytes resident, so the mechanism (a pool shared across layers in 0.7.2? fewer copies?) is open. At rank
        # >= 32 both counts agree; bench/gpu/weight_scale.py's w10-e80 / w10-r32 / w10-r64 shapes separate them.
        add("host", "expert LoRA AMX copies",
            L * E * r * 6 * (H * P + I) * 2,
            f"12 BufferB copies per expert (A, B and their transposes) in bf16, per NUMA part, counted at the real "
            f"rank {r} (kt-kernel sizes them for rank {rp}; the measured runs fit the real rank: see estimate.py)")
    if s.finetuning == "full":
        add("host", "expert master weights, grads, AdamW (full FT)", arch.routed_expert_params * 16,
            "full fine-tuning: fp32 master weights + fp32 gradients + fp32 exp_avg/exp_avg_sq for every expert "
            "(16 B/param; not calibrated: no measured full-FT run)")
    cache_slot = (ml * H * 2 * P + 3 * ml * k * I * 2 + ml * k * r * 4 * P + ml * k * H * 2 * P)
    retain = s.cpu_activation == "retain"
    add("host", "KT forward cache",
        cache_slot * s.cache_depth * (L if retain else 1),
        f"kt_max_cache_depth {s.cache_depth} slots x {ml} rows (kt_model_max_length {s.model_max_length} x "
        f"{s.num_processes} ranks) of input, gate/up/act outputs (x top-{k}) and down output"
        + (f"; kt_cpu_activation: retain keeps one pool per layer (x{L})" if retain else
           "; one pool shared by all layers (recompute)"))
    fwd_work = P * (2 * safe * rp * 2 + 2 * safe * rp * 4 + safe * (2 * Ip + H) * 4 + 2 * safe * rp * 2) if lora else 0
    if s.finetuning == "full":
        fwd_work = max(fwd_work, P * 3 * Ip * H * 4)
    bwd_work = P * (3 * ml * k * Ip * 2 + safe * H * 2 + safe * (Ip + H) * 4 + 2 * safe * H * 2
                    + safe * H * 4 + 2 * safe * r * 4 + E * (H + Ip) * r * 4)
    add("host", "KT work pools", fwd_work + bwd_work,
        f"forward/backward scratch shared by all layers, per NUMA part ({P}): {safe} routed rows "
        "(max_len x top-k + per-expert padding) of fp32 GEMM outputs and bf16 gradients")
    # The non-expert weights LlamaFactory loads on the CPU are moved into the FSDP-sharded GPU parameters and freed
    # before the peak: measured, a 151,936-token vocabulary (0.71 B non-expert params) and a 32,000-token one
    # (0.22 B) peak at the same host RSS, 6.46-6.51 GiB (bench/results/gpu/vocab_scale). Ranks other than 0 hold a
    # copy of their own only when fsdp_cpu_ram_efficient_loading is off (not measured; counted while they load).
    if s.fsdp and s.num_processes > 1 and not s.cpu_ram_efficient_loading:
        add("host", "non-expert weights loaded by every rank", arch.non_expert_params * 2 * (s.num_processes - 1),
            f"{arch.non_expert_params/1e9:.2f} B non-expert params in bf16 loaded on the CPU by each of the "
            f"{s.num_processes - 1} other ranks (fsdp_cpu_ram_efficient_loading: false; not measured)")
    if s.finetuning == "full":
        add("host", "full state dict at save (full FT)", arch.non_expert_params * 4,
            f"the final save gathers the {arch.non_expert_params/1e9:.2f} B trainable non-expert params on the CPU in "
            "their fp32 training dtype (4 B/param), on top of the training phase (measured: +2.25 GiB at the end of "
            "the one full fine-tune of bench/results/gpu/vocab_scale, 0.71 B params)")
    pg = c["process_host_gib"]
    add("host", "per-process runtime", pg.value * GIB * s.num_processes,
        f"{pg.value:g} GiB x {s.num_processes} processes: Python, torch/CUDA host side, imports ({pg.source})")
    if s.dataloader_workers:
        add("host", "dataloader workers", s.dataloader_workers * s.num_processes * 2 * s.tokens_per_gpu * 8 * 3,
            f"{s.dataloader_workers} workers x {s.num_processes} ranks, 2 prefetched batches of int64 ids/labels/mask "
            "(their other pages are shared copy-on-write with the parent)")
    slack = c["host_slack_per_expert_gib"]
    expert_gib = cpu_layers * layer_expert_bytes / GIB
    multi = s.num_processes > 1
    if slack.value and multi:
        add("host", "unattributed runtime slack", slack.value * expert_gib * GIB,
            f"{slack.value:.4f} x routed-expert GiB, multi-GPU runs only (rank 0 receives every rank's tokens and "
            f"stages shards for the others; no single-GPU run shows it): FITTED ({slack.source})")
    # The peak is the larger of two phases: tokenization (preprocessing workers alive, no weights loaded yet) and
    # training (everything above). Only the excess of the first over the second adds to the peak.
    pw = c["preprocessing_worker_gib"]
    if s.preprocessing_workers and pw.value:
        training_phase = sum(t.gib for t in terms if t.resource == "host") * GIB - pg.value * GIB * s.num_processes
        excess = s.preprocessing_workers * pw.value * GIB - training_phase
        if excess > 0:
            add("host", "tokenization workers (before training)", excess,
                f"{s.preprocessing_workers} preprocessing workers x {pw.value:g} GiB each while the dataset is "
                f"tokenized, above the training phase's model memory ({pw.source})")

    # ---------------------------------------------------------------- GPU (per process)
    n = s.num_processes
    # One-GPU LoRA runs keep the frozen base weights in bf16 (GPU machine, bench/results/gpu/weight_scale: torch's
    # peak 0.74 GiB at 0.187 B non-expert params is below their fp32 size plus activations, 0.70 + 0.38 GiB).
    # Multi-GPU FSDP keeps the fp32 upcast: the cookbook 2-GPU row is only explained with it (no multi-GPU
    # measurement of ours separates the two yet).
    upcast = s.fsdp and s.mixed_precision != "no" and (s.finetuning == "full" or s.num_processes > 1)
    ne_bytes = arch.non_expert_params * (4 if upcast else 2)
    add("gpu", f"non-expert weights ({'fp32' if upcast else 'bf16'})", ne_bytes / n if s.fsdp else ne_bytes,
        f"{arch.non_expert_params/1e9:.2f} B params: attention, embeddings, routers, shared/dense MLPs"
        + (" (accelerate's FSDP upcasts them to fp32 when mixed_precision is set)" if upcast else "")
        + (f", FSDP-sharded over {n} GPUs" if s.fsdp and n > 1 else ", replicated on every GPU" if n > 1 else ""))
    if s.fsdp:
        # FSDP2 unshards a group into a separate bf16 buffer at every world size, also 1 (torch _fsdp_param_group.py
        # wait_for_unshard copies the shard into all_gather_outputs); the root group (embeddings, lm_head, final
        # norm) stays unsharded from forward to the end of backward, decoder layers one at a time plus the
        # prefetched next. Measured on one GPU: torch's peak grows by 2 x the bf16 embeddings + lm_head between
        # the 32,000- and 151,936-token vocabularies, beyond the logits (bench/results/gpu/vocab_scale).
        gathered = (arch.embedding_params + 2 * arch.largest_layer_params) * 2
        add("gpu", "FSDP unsharded compute copies", gathered,
            f"bf16 copies of the root group ({arch.embedding_params/1e9:.2f} B embedding/lm_head params) held from "
            "forward to the end of backward, plus the current and prefetched decoder layer")
    if s.finetuning == "full":
        add("gpu", "non-expert grads + AdamW (full FT)", arch.non_expert_params * 12 / (n if s.fsdp else 1),
            "fp32 gradients + fp32 exp_avg/exp_avg_sq for the non-expert params (12 B/param), sharded by FSDP")
    else:
        shared_io = 3 * (H + arch.shared_expert_intermediate_size) if arch.shared_expert_intermediate_size else 0
        dense_io = 3 * (H + arch.dense_intermediate_size) if arch.dense_intermediate_size else 0
        mlp_io = shared_io * arch.moe_layers + dense_io * (arch.num_layers - arch.moe_layers)
        gpu_lora = r * (arch.attention_linear_io * arch.num_layers + mlp_io)
        add("gpu", "non-expert LoRA + AdamW", gpu_lora * 16 / (n if s.fsdp else 1),
            f"rank {r} on attention and shared/dense MLP linears ({gpu_lora/1e6:.1f} M params): fp32 param, grad, "
            "exp_avg, exp_avg_sq (16 B/param)")
    tok = s.tokens_per_gpu
    # routed experts run on the CPU (kt-kernel): their top-k activations live in host memory, not here (measured:
    # top-k 4 and 8 of the same 10 GB model peak at the same 2.15 GiB nvidia-smi / 0.74 GiB torch)
    per_tok_layer = 2 * (6 * H + arch.attention_linear_io + 3 * arch.widest_gpu_mlp)
    # The loss is not chunked: LlamaFactory's SFT trainer (llamafactory.train.sft, run by run_exp) leaves it to the
    # HF Trainer's compute_loss, i.e. the model's ForCausalLMLoss (transformers/loss/loss_utils.py), which upcasts
    # the whole [tokens, vocab] logits to fp32 before cross_entropy (LlamaFactory's chunk_loss_size exists only in
    # its v1 trainers). Forward holds bf16 logits (2 B) + the fp32 copy (4) + log_softmax's fp32 output (4, saved
    # for backward) = 10 B per element; backward holds that output + nll_loss's dense fp32 gradient (4) +
    # log_softmax's fp32 input gradient (4) = 12 B, the peak. Measured: 12.0 B per token x vocab element between
    # the three vocabularies at 2048 tokens (bench/results/gpu/vocab_scale).
    logits = tok * arch.vocab_size
    loss_bytes = logits * 12
    if s.gradient_checkpointing:
        add("gpu", "activations (gradient checkpointing)", tok * H * 2 * arch.num_layers,
            f"{tok} tokens ({s.cutoff_len} x batch {s.batch}): one bf16 hidden state saved per layer "
            f"({arch.num_layers})")
        # The loss's backward runs before any layer is recomputed, and its blocks are freed by then: the peak
        # holds one or the other (measured: 2048 more tokens at vocab 151,936 add the logits and the saved hidden
        # states, not a layer's working set: 3.56 GiB for 3.48 + 0.06 modelled). A recomputed layer holds its
        # bf16 intermediates and, as its backward runs, their gradients (x2; measured at vocab 4,096, where this
        # phase sets the peak: torch's peak 0.79 GiB at 2048 tokens and 1.08 at 4096 on the same 10 GB model).
        recompute = tok * per_tok_layer * 2
        if recompute > loss_bytes:
            add("gpu", "one layer's recompute working set", recompute,
                f"{tok} tokens x one layer's attention/MLP intermediates and their gradients while it is "
                f"recomputed in backward (larger than the loss's {loss_bytes / GIB:.2f} GiB, freed by then)")
        else:
            add("gpu", "logits and loss", loss_bytes,
                f"{tok} tokens x vocab {arch.vocab_size}: fp32 log-softmax output + its incoming and outgoing fp32 "
                "gradients in backward (12 B each; forward's bf16 logits + fp32 upcast + output is 10 B); a "
                f"layer's recompute working set ({recompute / GIB:.2f} GiB) comes later, once these are freed")
    else:
        add("gpu", "activations (no checkpointing)", tok * per_tok_layer * arch.num_layers,
            f"{tok} tokens x {arch.num_layers} layers of attention/MLP intermediates kept for backward "
            "(disable_gradient_checkpointing: true)")
        add("gpu", "logits and loss", loss_bytes,
            f"{tok} tokens x vocab {arch.vocab_size}: fp32 log-softmax output + its incoming and outgoing fp32 "
            "gradients in backward (12 B each)")
    gpu_model = sum(t.gib for t in terms if t.resource == "gpu") * GIB
    # What the caching allocator reserves above torch's allocated peak (nvidia-smi sees the reserve):
    # 1. the bf16 logits block (2 B/element) is freed when the loss returns, before backward; the backward's
    #    4-byte blocks do not fit in it, so it stays reserved beside them. The same with and without expandable
    #    segments for batches of one shape (measured: reserved 6.996 vs 6.984 GiB, 11.041 vs 11.041).
    # 2. FSDP2 reduces gradients on its own CUDA stream (torch _fsdp_collectives.py foreach_reduce: the bf16
    #    reduce-scatter output, then its fp32 cast, 2 + 4 B per trainable param of a group, divided over the
    #    ranks), and the allocator never lends one stream's free blocks to another: the largest trainable group
    #    adds its own reserve. Full fine-tuning: the root group (embeddings + lm_head); LoRA: one layer's adapters.
    # 3. block rounding and the small-block pool: a constant (fitted, see its source).
    if s.finetuning == "full":
        group = max(arch.embedding_params, arch.largest_layer_params)
    else:
        group = gpu_lora / max(1, arch.num_layers)
    rs_stream = group * 6 / n if s.fsdp else 0.0
    gr = c["gpu_allocator_reserve_gib"]
    reserve = logits * 2 + rs_stream + gr.value * GIB
    add("gpu", "caching-allocator reserve", reserve,
        f"freed bf16 logits block {logits * 2 / GIB:.2f} GiB + gradient-reduction stream {rs_stream / GIB:.2f} GiB "
        f"+ rounding and small-block pool {gr.value:g} GiB ({gr.source})")
    gpu_model += reserve
    gs = c["gpu_slack_fraction"]
    if gs.value and multi:
        add("gpu", "allocator slack", gs.value * gpu_model,
            f"{gs.value:.3f} x the modelled GPU total, multi-GPU runs only (FSDP all-gather/reduce-scatter "
            f"buffers, NCCL); FITTED ({gs.source})")
    pgg = c["process_gpu_gib"]
    add("gpu", "CUDA context and workspaces", pgg.value * GIB,
        f"{pgg.value:g} GiB: CUDA context, cuBLAS/NCCL workspaces ({pgg.source})")

    # ---------------------------------------------------------------- disk (output_dir)
    if s.finetuning == "full":
        ckpt = arch.total_params * 2 + (0 if s.save_only_model else arch.total_params * 12)
        what = ("full bf16 weights" + ("" if s.save_only_model else " + fp32 AdamW states and master copy (12 B/param)"))
        final = arch.total_params * 2
    else:
        expert_lora = L * E * r * 3 * (H + I)
        adapter = expert_lora * 2 + gpu_lora * 4
        ckpt = adapter + (0 if s.save_only_model else expert_lora * 4 + gpu_lora * 8)
        what = "adapter (fused_expert_lora bf16 + PEFT fp32)" + ("" if s.save_only_model else " + AdamW states")
        final = adapter * 2     # the final adapter in output_dir and its sglang-converted copy
    kept, kept_note = _kept_checkpoints(s)
    if kept_note:
        notes.append(kept_note)
    add("disk", "checkpoints", ckpt * kept, f"{kept} kept x {ckpt/GIB:.2f} GiB per checkpoint-*: {what}")
    add("disk", "final output", final,
        "final adapter in output_dir + its sglang-converted copy" if s.finetuning == "lora"
        else "final full model in output_dir")
    if s.finetuning == "lora" and merges(recipe_or_dicts):
        add("disk", "merged model", arch.total_params * 2,
            "deploy.serve.merge: the base with the LoRA merged in (<output_dir>-merged), BF16 whatever the base's "
            f"format ({arch.total_params:,.0f} parameters x 2 bytes; an FP8 base is dequantized)")

    host = sum(t.gib for t in terms if t.resource == "host")
    gpu = sum(t.gib for t in terms if t.resource == "gpu")
    disk = sum(t.gib for t in terms if t.resource == "disk")
    setup = {k2: getattr(s, k2) for k2 in s.__dataclass_fields__}
    setup.update(kt_max_len=ml, tokens_per_gpu=tok)
    return ResourcePlan(host, gpu, disk, terms, setup=setup, notes=notes)


def _kept_checkpoints(s: Setup) -> tuple[int, str]:
    """checkpoint-* dirs on disk at the end: save_total_limit, else the count save_steps implies."""
    if s.save_strategy == "no":
        return 0, ""
    if s.save_strategy == "epoch":
        n = max(1, math.ceil(s.num_train_epochs))
        return (min(n, s.save_total_limit) if s.save_total_limit else n), ""
    if s.save_total_limit:
        return s.save_total_limit, ""
    if s.save_steps and s.max_steps:
        return max(1, s.max_steps // s.save_steps), ""
    return 3, ("save_total_limit is unset and the step count is unknown: disk assumes 3 checkpoints; "
               "set save_total_limit to bound it")
