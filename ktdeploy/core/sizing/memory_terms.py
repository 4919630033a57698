"""The resource model's memory terms (pure): each a small function of ``Model`` that returns its Term — or None where
the recipe does not have it — with the formula's figures and its source in the explanation and, in the docstring,
where its shape comes from. core/sizing/estimate.estimate composes them in this order: HOST_TERMS, the tokenization
phase, GPU_TERMS, the allocator's slack, the CUDA context, DISK_TERMS.

Buffer shapes follow kt-kernel's SFT MoE operator (kt-kernel/operators/amx/sft_moe.hpp, ``init_all_buffers`` /
``alloc_forward_buffers`` / ``alloc_backward_buffers``; kt-kernel/python/sft/wrapper.py and config.py for
defaults): rank 0 owns every KT layer; its token capacity ``max_len`` is ``kt_model_max_length x num_processes``
rounded up to the AMX M step; pools are per NUMA part (``kt_threadpool_count`` when ``kt_tp_enabled``), not per
thread. Constants that are not a byte width are core/sizing/estimate.MEASURED's (each says its measurement).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ktdeploy.core.sizing.model_config import MoEArchitecture
from ktdeploy.core.sizing.setup import AMX_M_STEP, Setup, expert_bytes_per_param
from ktdeploy.core.sizing.terms import GIB, Measured, Term, memory_term

RESERVE = "caching-allocator reserve"


@dataclass(frozen=True)
class Model:
    """What every term reads: the recipe's setup, the model's dimensions, the measured constants, whether the recipe
    merges (deploy.serve.merge), and the quantities several terms share (in the model's notation)."""

    s: Setup
    arch: MoEArchitecture
    c: Mapping[str, Measured]
    merges: bool = False

    # -- the model's notation
    @property
    def H(self) -> int:   # noqa: N802
        return self.arch.hidden_size

    @property
    def I(self) -> int:   # noqa: E743, N802
        return self.arch.moe_intermediate_size

    @property
    def E(self) -> int:   # noqa: N802
        return self.arch.num_experts

    @property
    def k(self) -> int:
        return self.arch.experts_per_tok

    @property
    def L(self) -> int:   # noqa: N802
        return self.arch.moe_layers

    @property
    def P(self) -> int:   # noqa: N802
        return self.s.tp_parts

    @property
    def Ip(self) -> float:   # noqa: N802
        """The intermediate slice of one NUMA part."""
        return self.I / self.P

    @property
    def safe(self) -> int:
        """kt-kernel's safe_alloc_tokens: routed rows + per-expert padding."""
        return self.s.kt_max_len * self.k + self.E * AMX_M_STEP

    @property
    def lora(self) -> bool:
        return self.s.finetuning == "lora" and self.s.lora_rank > 0

    @property
    def bpp(self) -> float:
        return expert_bytes_per_param(self.s.expert_format, self.arch)

    @property
    def layer_expert_bytes(self) -> float:
        return self.E * 3 * self.H * self.I * self.bpp

    @property
    def expert_bytes(self) -> float:
        """The routed experts of every MoE layer, all on the CPU (rank 0)."""
        return self.L * self.layer_expert_bytes

    @property
    def multi(self) -> bool:
        return self.s.num_processes > 1

    @property
    def gpu_lora(self) -> float:
        """LoRA params on the GPU: attention and shared/dense MLP linears."""
        a, H = self.arch, self.H   # noqa: N806
        shared_io = 3 * (H + a.shared_expert_intermediate_size) if a.shared_expert_intermediate_size else 0
        dense_io = 3 * (H + a.dense_intermediate_size) if a.dense_intermediate_size else 0
        mlp_io = shared_io * a.moe_layers + dense_io * (a.num_layers - a.moe_layers)
        return self.s.lora_rank * (a.attention_linear_io * a.num_layers + mlp_io)

    @property
    def expert_lora(self) -> int:
        """Expert LoRA params: rank r A/B on gate/up/down of every expert."""
        return self.L * self.E * self.s.lora_rank * 3 * (self.H + self.I)

    @property
    def per_tok_layer(self) -> float:
        """One layer's attention/MLP intermediates per token on the GPU, in bf16. Routed experts run on the CPU: their
        top-k activations live in host memory (measured: top-k 4 and 8 of the same 10 GB model peak at the same
        2.15 GiB nvidia-smi / 0.74 GiB torch)."""
        return 2 * (6 * self.H + self.arch.attention_linear_io + 3 * self.arch.widest_gpu_mlp)

    @property
    def logits(self) -> int:
        return self.s.tokens_per_gpu * self.arch.vocab_size

    @property
    def loss_bytes(self) -> int:
        """The loss is not chunked: LlamaFactory's SFT trainer leaves it to the HF Trainer's compute_loss, i.e. the
        model's ForCausalLMLoss (transformers/loss/loss_utils.py), which upcasts the whole [tokens, vocab] logits to
        fp32 before cross_entropy (LlamaFactory's chunk_loss_size exists only in its v1 trainers). Forward holds bf16
        logits (2 B) + the fp32 copy (4) + log_softmax's fp32 output (4, saved for backward) = 10 B per element;
        backward holds that output + nll_loss's dense fp32 gradient (4) + log_softmax's fp32 input gradient (4) =
        12 B, the peak. Measured: 12.0 B per token x vocab element between the three vocabularies at 2048 tokens
        (bench/results/gpu/vocab_scale)."""
        return self.logits * 12

    @property
    def recompute(self) -> float:
        return self.s.tokens_per_gpu * self.per_tok_layer * 2


TermFn = Callable[[Model], Term | None]


def _host(name: str, nbytes: float, why: str) -> Term:
    return memory_term("host", name, nbytes, why)


def _gpu(name: str, nbytes: float, why: str) -> Term:
    return memory_term("gpu", name, nbytes, why)


def _disk(name: str, nbytes: float, why: str) -> Term:
    return memory_term("disk", name, nbytes, why)


# ---------------------------------------------------------------- host (rank 0 owns every KT layer)
def routed_experts(m: Model) -> Term:
    """The routed experts' weights in their format (sft_moe.hpp's BufferB per expert), with their scales."""
    s = m.s
    return _host(f"routed experts ({s.expert_format})", m.expert_bytes,
                 f"{m.L} MoE layers x {m.E} experts x 3 x {m.H}x{m.I} weights at {m.bpp:.4g} B each "
                 f"(format {s.expert_format})")


def backward_copies(m: Model) -> Term:
    """The transposed weights of the backward GEMM (kt_share_backward_bb: one layer's worth shared by all)."""
    return _host("backward weight copies", (1 if m.s.share_backward_bb else m.L) * m.layer_expert_bytes,
                 "transposed expert weights for the backward GEMM: one layer's worth shared by all layers"
                 if m.s.share_backward_bb else
                 f"kt_share_backward_bb: false keeps a transposed copy per layer (x{m.L}): doubles expert memory")


def ephemeral_staging(m: Model) -> Term | None:
    """kt_weight_lifecycle: ephemeral stages the INT8 experts in /dev/shm."""
    if m.s.weight_lifecycle != "ephemeral":
        return None
    return _host("ephemeral INT8 staging (/dev/shm)", m.expert_bytes,
                 "kt_weight_lifecycle: ephemeral stages the INT8 experts in /dev/shm (tmpfs: counts against RAM)")


def expert_lora_state(m: Model) -> Term | None:
    """The experts' LoRA params, grads and AdamW states (kt-kernel's lora.py creates them bf16)."""
    if not m.lora:
        return None
    r, lora_params = m.s.lora_rank, m.expert_lora
    return _host("expert LoRA params, grads, AdamW", lora_params * 8,
                 f"rank {r} A/B on gate/up/down of every expert ({lora_params/1e9:.3f} B params): bf16 param + bf16 "
                 "grad + bf16 exp_avg/exp_avg_sq (lora.py creates them bf16; AdamW states follow the param dtype)")


def expert_lora_amx_copies(m: Model) -> Term | None:
    """The AMX BufferB copies of the expert LoRA. MEASURED, NOT YET EXPLAINED: counting them at the real rank r fits
    every measured run; the padded rank (kt-kernel's padded_lora_rank_, r rounded up to K_STEP=32) over-predicts
    (large run: +0.48 GiB; most of the +11.4 % host error of issue 19's ~9.7 B rank-8 run). The kt-kernel
    sft_moe.hpp versions readable through the search tools aligned_alloc + memset the padded pool per layer, which
    would make the padded bytes resident, so the mechanism (a pool shared across layers in 0.7.2? fewer copies?) is
    open. At rank >= 32 both counts agree; bench/gpu/weight_scale.py's w10-e80 / w10-r32 / w10-r64 shapes separate
    them."""
    if not m.lora:
        return None
    r = m.s.lora_rank
    return _host("expert LoRA AMX copies", m.L * m.E * r * 6 * (m.H * m.P + m.I) * 2,
                 f"12 BufferB copies per expert (A, B and their transposes) in bf16, per NUMA part, counted at the "
                 f"real rank {r} (kt-kernel sizes them for rank {m.s.padded_rank}; the measured runs fit the real "
                 "rank: see estimate.py)")


# Host bytes per routed-expert parameter that a full fine-tune holds beyond the experts' own weights (kt-kernel's
# BufferB, `routed_experts`): kt-kernel's full mode keeps the experts as bf16 nn.Parameters with bf16 gradient
# buffers (sft/base.py init_full_weight_grad_buffers), and AdamW's moments come on top. Measured, not derived: the
# residual of three full fine-tunes on the H100 GPU machine (bench/results/format-scale: full-v32 12.38, full-h1536
# 12.37, full-l12 12.22 B/param); fitted on full-v32 alone, the other two and the H200's vs-v152-full-es held out
# (bench/results/planner-calibration.md, "Full fine-tuning"). The old 16 B/param (fp32 master + grads + moments)
# over-predicted every full run by 7-22 %.
FULL_FT_EXPERT_STATE_BYTES = 12.38


def expert_full_state(m: Model) -> Term | None:
    """Full fine-tuning: the experts' trainable copies, gradients and AdamW states (FULL_FT_EXPERT_STATE_BYTES)."""
    if m.s.finetuning != "full":
        return None
    return _host("expert trainable copies, grads, AdamW (full FT)",
                 m.arch.routed_expert_params * FULL_FT_EXPERT_STATE_BYTES,
                 f"full fine-tuning: kt-kernel's bf16 expert parameters and gradient buffers plus AdamW's moments, "
                 f"{FULL_FT_EXPERT_STATE_BYTES} B per expert parameter (measured on three full fine-tunes, "
                 "bench/results/format-scale)")


def fp8_dequantized_host(m: Model) -> Term | None:
    """A block-FP8 checkpoint's non-expert linear weights are dequantized as they load: transformers' Fp8Dequantize
    multiplies the FP8 values by their float32 scales, so the weights come out float32 (4 B/param), and that copy is
    still held on the host through training (measured: the FP8 runs' peak falls in the training phase)."""
    if m.arch.native_format != "fp8":
        return None
    n = m.arch.linear_non_expert_params
    loaders = 1 if (m.s.cpu_ram_efficient_loading or m.s.num_processes == 1) else m.s.num_processes
    return _host("FP8 non-expert weights dequantized (float32)", n * 4 * loaders,
                 f"{n/1e9:.3f} B FP8 attention/shared/dense params dequantized to float32 by transformers' "
                 f"Fp8Dequantize (x {loaders} loading process{'es' if loaders > 1 else ''}; derived from its float32 "
                 "scales, checked on fA and fB of bench/results/format-scale)")


def kt_forward_cache(m: Model) -> Term:
    """kt_max_cache_depth slots of each layer's forward activations (sft_moe.hpp's cache pool)."""
    s, ml, k = m.s, m.s.kt_max_len, m.k
    cache_slot = (ml * m.H * 2 * m.P + 3 * ml * k * m.I * 2 + ml * k * s.lora_rank * 4 * m.P + ml * k * m.H * 2 * m.P)
    retain = s.cpu_activation == "retain"
    return _host("KT forward cache", cache_slot * s.cache_depth * (m.L if retain else 1),
                 f"kt_max_cache_depth {s.cache_depth} slots x {ml} rows (kt_model_max_length {s.model_max_length} x "
                 f"{s.num_processes} ranks) of input, gate/up/act outputs (x top-{k}) and down output"
                 + (f"; kt_cpu_activation: retain keeps one pool per layer (x{m.L})" if retain else
                    "; one pool shared by all layers (recompute)"))


def kt_work_pools(m: Model) -> Term:
    """The forward/backward scratch every layer shares, per NUMA part (alloc_forward/backward_buffers)."""
    s, P, safe, Ip, H, r, rp = m.s, m.P, m.safe, m.Ip, m.H, m.s.lora_rank, m.s.padded_rank   # noqa: N806
    fwd_work = P * (2 * safe * rp * 2 + 2 * safe * rp * 4 + safe * (2 * Ip + H) * 4 + 2 * safe * rp * 2) if m.lora \
        else 0
    if s.finetuning == "full":
        fwd_work = max(fwd_work, P * 3 * Ip * H * 4)
    bwd_work = P * (3 * s.kt_max_len * m.k * Ip * 2 + safe * H * 2 + safe * (Ip + H) * 4 + 2 * safe * H * 2
                    + safe * H * 4 + 2 * safe * r * 4 + m.E * (H + Ip) * r * 4)
    return _host("KT work pools", fwd_work + bwd_work,
                 f"forward/backward scratch shared by all layers, per NUMA part ({P}): {safe} routed rows "
                 "(max_len x top-k + per-expert padding) of fp32 GEMM outputs and bf16 gradients")


def rank_loaded_weights(m: Model) -> Term | None:
    """The non-expert weights LlamaFactory loads on the CPU are moved into the FSDP-sharded GPU parameters and freed
    before the peak: measured, a 151,936-token vocabulary (0.71 B non-expert params) and a 32,000-token one (0.22 B)
    peak at the same host RSS, 6.46-6.51 GiB (bench/results/gpu/vocab_scale). Ranks other than 0 hold a copy of
    their own only when fsdp_cpu_ram_efficient_loading is off (not measured; counted while they load)."""
    s, ne = m.s, m.arch.non_expert_params
    if not (s.fsdp and s.num_processes > 1 and not s.cpu_ram_efficient_loading):
        return None
    return _host("non-expert weights loaded by every rank", ne * 2 * (s.num_processes - 1),
                 f"{ne/1e9:.2f} B non-expert params in bf16 loaded on the CPU by each of the "
                 f"{s.num_processes - 1} other ranks (fsdp_cpu_ram_efficient_loading: false; not measured)")


def full_state_dict(m: Model) -> Term | None:
    """The final save of a full fine-tune gathers the trainable non-expert params on the CPU (measured)."""
    if m.s.finetuning != "full":
        return None
    ne = m.arch.non_expert_params
    return _host("full state dict at save (full FT)", ne * 4,
                 f"the final save gathers the {ne/1e9:.2f} B trainable non-expert params on the CPU in "
                 "their fp32 training dtype (4 B/param), on top of the training phase (measured: +2.25 GiB at the end "
                 "of the one full fine-tune of bench/results/gpu/vocab_scale, 0.71 B params)")


def process_runtime(m: Model) -> Term:
    """Each process's Python, torch/CUDA host side and imports (MEASURED process_host_gib)."""
    pg, n = m.c["process_host_gib"], m.s.num_processes
    return _host("per-process runtime", pg.value * GIB * n,
                 f"{pg.value:g} GiB x {n} processes: Python, torch/CUDA host side, imports ({pg.source})")


def dataloader_workers(m: Model) -> Term | None:
    """The dataloader workers' prefetched batches (their other pages are shared with the parent)."""
    s = m.s
    if not s.dataloader_workers:
        return None
    return _host("dataloader workers", s.dataloader_workers * s.num_processes * 2 * s.tokens_per_gpu * 8 * 3,
                 f"{s.dataloader_workers} workers x {s.num_processes} ranks, 2 prefetched batches of int64 "
                 "ids/labels/mask (their other pages are shared copy-on-write with the parent)")


def host_slack(m: Model) -> Term | None:
    """Host RSS not explained by the terms above, in multi-GPU runs (FITTED host_slack_per_expert_gib)."""
    slack = m.c["host_slack_per_expert_gib"]
    if not (slack.value and m.multi):
        return None
    expert_gib = m.expert_bytes / GIB
    return _host("unattributed runtime slack", slack.value * expert_gib * GIB,
                 f"{slack.value:.4f} x routed-expert GiB, multi-GPU runs only (rank 0 receives every rank's tokens "
                 f"and stages shards for the others; no single-GPU run shows it): FITTED ({slack.source})")


HOST_TERMS: tuple[TermFn, ...] = (routed_experts, backward_copies, ephemeral_staging, expert_lora_state,
                                  expert_lora_amx_copies, expert_full_state, kt_forward_cache, kt_work_pools,
                                  rank_loaded_weights, fp8_dequantized_host, full_state_dict, process_runtime,
                                  dataloader_workers, host_slack)


def tokenization_workers(m: Model, host: Sequence[Term]) -> Term | None:
    """The peak is the larger of two phases: tokenization (preprocessing workers alive, no weights loaded yet) and
    training (``host``: the terms above). Only the excess of the first over the second adds to the peak
    (MEASURED preprocessing_worker_gib)."""
    s, pw, pg = m.s, m.c["preprocessing_worker_gib"], m.c["process_host_gib"]
    if not (s.preprocessing_workers and pw.value):
        return None
    training_phase = sum(t.gib for t in host if t.resource == "host") * GIB - pg.value * GIB * s.num_processes
    excess = s.preprocessing_workers * pw.value * GIB - training_phase
    if excess <= 0:
        return None
    return _host("tokenization workers (before training)", excess,
                 f"{s.preprocessing_workers} preprocessing workers x {pw.value:g} GiB each while the dataset is "
                 f"tokenized, above the training phase's model memory ({pw.source})")


# ---------------------------------------------------------------- GPU (per process)
def _fsdp_upcast(s: Setup) -> bool:
    """Whether the non-expert weights sit on the GPU in fp32: accelerate's FSDP upcast with mixed precision, in a
    full fine-tune or across GPUs (one-GPU LoRA keeps them bf16: see non_expert_weights)."""
    return s.fsdp and s.mixed_precision != "no" and (s.finetuning == "full" or s.num_processes > 1)


def non_expert_weights(m: Model) -> Term:
    """The non-expert weights on every GPU. One-GPU LoRA runs keep the frozen base weights in bf16 (GPU machine,
    bench/results/gpu/weight_scale: torch's peak 0.74 GiB at 0.187 B non-expert params is below their fp32 size plus
    activations, 0.70 + 0.38 GiB). Multi-GPU FSDP keeps the fp32 upcast: the cookbook 2-GPU row is only explained
    with it (no multi-GPU measurement of ours separates the two yet)."""
    s, n, ne = m.s, m.s.num_processes, m.arch.non_expert_params
    upcast = _fsdp_upcast(s)
    ne_bytes = ne * (4 if upcast else 2)
    return _gpu(f"non-expert weights ({'fp32' if upcast else 'bf16'})", ne_bytes / n if s.fsdp else ne_bytes,
                f"{ne/1e9:.2f} B params: attention, embeddings, routers, shared/dense MLPs"
                + (" (accelerate's FSDP upcasts them to fp32 when mixed_precision is set)" if upcast else "")
                + (f", FSDP-sharded over {n} GPUs" if s.fsdp and n > 1 else ", replicated on every GPU" if n > 1
                   else ""))


def fp8_dequantized_gpu(m: Model) -> Term | None:
    """Where the planner keeps the non-expert weights in bf16 (one-GPU LoRA), an FP8 checkpoint's dequantized linear
    weights are float32 instead (transformers' Fp8Dequantize: FP8 x float32 scales): 2 B more per param. Where FSDP
    upcasts to fp32 anyway, nothing is added."""
    s = m.s
    if m.arch.native_format != "fp8" or _fsdp_upcast(s):
        return None
    n = m.arch.linear_non_expert_params
    return _gpu("FP8 non-expert weights dequantized (float32)", n * 2 / (s.num_processes if s.fsdp else 1),
                f"{n/1e9:.3f} B FP8 attention/shared/dense params held in float32, not bf16 (+2 B/param; transformers' "
                "Fp8Dequantize, checked on fA and fB of bench/results/format-scale)")


def fsdp_unsharded_copies(m: Model) -> Term | None:
    """FSDP2 unshards a group into a separate bf16 buffer at every world size, also 1 (torch _fsdp_param_group.py
    wait_for_unshard copies the shard into all_gather_outputs); the root group (embeddings, lm_head, final norm)
    stays unsharded from forward to the end of backward, decoder layers one at a time plus the prefetched next.
    Measured on one GPU: torch's peak grows by 2 x the bf16 embeddings + lm_head between the 32,000- and
    151,936-token vocabularies, beyond the logits (bench/results/gpu/vocab_scale)."""
    if not m.s.fsdp:
        return None
    a = m.arch
    gathered = (a.embedding_params + 2 * a.largest_layer_params) * 2
    return _gpu("FSDP unsharded compute copies", gathered,
                f"bf16 copies of the root group ({a.embedding_params/1e9:.2f} B embedding/lm_head params) held from "
                "forward to the end of backward, plus the current and prefetched decoder layer")


def trainable_state(m: Model) -> Term:
    """The trainable non-expert params' fp32 state: full fine-tuning's grads + AdamW, or LoRA's params, grads and
    AdamW states (16 B/param)."""
    s, n = m.s, m.s.num_processes
    if s.finetuning == "full":
        return _gpu("non-expert grads + AdamW (full FT)", m.arch.non_expert_params * 12 / (n if s.fsdp else 1),
                    "fp32 gradients + fp32 exp_avg/exp_avg_sq for the non-expert params (12 B/param), sharded by FSDP")
    gpu_lora = m.gpu_lora
    return _gpu("non-expert LoRA + AdamW", gpu_lora * 16 / (n if s.fsdp else 1),
                f"rank {s.lora_rank} on attention and shared/dense MLP linears ({gpu_lora/1e6:.1f} M params): fp32 "
                "param, grad, exp_avg, exp_avg_sq (16 B/param)")


def activations(m: Model) -> Term:
    """What backward needs of the forward: one bf16 hidden state per layer with gradient checkpointing, else every
    layer's intermediates."""
    s, tok, layers = m.s, m.s.tokens_per_gpu, m.arch.num_layers
    if s.gradient_checkpointing:
        return _gpu("activations (gradient checkpointing)", tok * m.H * 2 * layers,
                    f"{tok} tokens ({s.cutoff_len} x batch {s.batch}): one bf16 hidden state saved per layer "
                    f"({layers})")
    return _gpu("activations (no checkpointing)", tok * m.per_tok_layer * layers,
                f"{tok} tokens x {layers} layers of attention/MLP intermediates kept for backward "
                "(disable_gradient_checkpointing: true)")


def loss_or_recompute(m: Model) -> Term:
    """The loss (Model.loss_bytes). With gradient checkpointing the loss's backward runs before any layer is
    recomputed, and its blocks are freed by then: the peak holds one or the other (measured: 2048 more tokens at
    vocab 151,936 add the logits and the saved hidden states, not a layer's working set: 3.56 GiB for 3.48 + 0.06
    modelled). A recomputed layer holds its bf16 intermediates and, as its backward runs, their gradients (x2;
    measured at vocab 4,096, where this phase sets the peak: torch's peak 0.79 GiB at 2048 tokens and 1.08 at 4096
    on the same 10 GB model)."""
    tok, vocab, loss_bytes = m.s.tokens_per_gpu, m.arch.vocab_size, m.loss_bytes
    if not m.s.gradient_checkpointing:
        return _gpu("logits and loss", loss_bytes,
                    f"{tok} tokens x vocab {vocab}: fp32 log-softmax output + its incoming and outgoing fp32 "
                    "gradients in backward (12 B each)")
    recompute = m.recompute
    if recompute > loss_bytes:
        return _gpu("one layer's recompute working set", recompute,
                    f"{tok} tokens x one layer's attention/MLP intermediates and their gradients while it is "
                    f"recomputed in backward (larger than the loss's {loss_bytes / GIB:.2f} GiB, freed by then)")
    return _gpu("logits and loss", loss_bytes,
                f"{tok} tokens x vocab {vocab}: fp32 log-softmax output + its incoming and outgoing fp32 "
                "gradients in backward (12 B each; forward's bf16 logits + fp32 upcast + output is 10 B); a "
                f"layer's recompute working set ({recompute / GIB:.2f} GiB) comes later, once these are freed")


def _reduce_stream(m: Model) -> float:
    """FSDP2 reduces gradients on its own CUDA stream (torch _fsdp_collectives.py foreach_reduce: the bf16
    reduce-scatter output, then its fp32 cast, 2 + 4 B per trainable param of a group, divided over the ranks), and
    the allocator never lends one stream's free blocks to another: the largest trainable group adds its own
    reserve. Full fine-tuning: the root group (embeddings + lm_head); LoRA: one layer's adapters."""
    a = m.arch
    group = max(a.embedding_params, a.largest_layer_params) if m.s.finetuning == "full" else \
        m.gpu_lora / max(1, a.num_layers)
    return group * 6 / m.s.num_processes if m.s.fsdp else 0.0


def _reserve_bytes(m: Model) -> float:
    return m.logits * 2 + _reduce_stream(m) + m.c["gpu_allocator_reserve_gib"].value * GIB


def allocator_reserve(m: Model) -> Term:
    """What the caching allocator reserves above torch's allocated peak (nvidia-smi sees the reserve): the bf16
    logits block (2 B/element) is freed when the loss returns, before backward, and the backward's 4-byte blocks do
    not fit in it, so it stays reserved beside them (the same with and without expandable segments for batches of
    one shape; measured: reserved 6.996 vs 6.984 GiB, 11.041 vs 11.041); the gradient-reduction stream
    (_reduce_stream); block rounding and the small-block pool (FITTED gpu_allocator_reserve_gib)."""
    gr, rs_stream = m.c["gpu_allocator_reserve_gib"], _reduce_stream(m)
    return _gpu(RESERVE, _reserve_bytes(m),
                f"freed bf16 logits block {m.logits * 2 / GIB:.2f} GiB + gradient-reduction stream "
                f"{rs_stream / GIB:.2f} GiB + rounding and small-block pool {gr.value:g} GiB ({gr.source})")


GPU_TERMS: tuple[TermFn, ...] = (non_expert_weights, fp8_dequantized_gpu, fsdp_unsharded_copies, trainable_state,
                                 activations, loss_or_recompute, allocator_reserve)


def allocator_slack(m: Model, gpu: Sequence[Term]) -> Term | None:
    """GPU memory not explained by ``gpu`` (the terms above), in multi-GPU runs (FITTED gpu_slack_fraction)."""
    gs = m.c["gpu_slack_fraction"]
    if not (gs.value and m.multi):
        return None
    modelled = sum(t.gib for t in gpu if t.resource == "gpu" and t.name != RESERVE) * GIB + _reserve_bytes(m)
    return _gpu("allocator slack", gs.value * modelled,
                f"{gs.value:.3f} x the modelled GPU total, multi-GPU runs only (FSDP all-gather/reduce-scatter "
                f"buffers, NCCL); FITTED ({gs.source})")


def cuda_context(m: Model) -> Term:
    """GPU memory outside torch's allocator: the CUDA context, cuBLAS/NCCL workspaces (MEASURED process_gpu_gib)."""
    pgg = m.c["process_gpu_gib"]
    return _gpu("CUDA context and workspaces", pgg.value * GIB,
                f"{pgg.value:g} GiB: CUDA context, cuBLAS/NCCL workspaces ({pgg.source})")


# ---------------------------------------------------------------- disk (output_dir)
def _checkpoint(m: Model) -> tuple[float, str]:
    """One checkpoint-* folder's bytes and what it holds."""
    s, a = m.s, m.arch
    if s.finetuning == "full":
        ckpt = a.total_params * 2 + (0 if s.save_only_model else a.total_params * 12)
        return ckpt, ("full bf16 weights" + ("" if s.save_only_model else
                                             " + fp32 AdamW states and master copy (12 B/param)"))
    expert_lora, gpu_lora = m.expert_lora, m.gpu_lora
    adapter = expert_lora * 2 + gpu_lora * 4
    ckpt = adapter + (0 if s.save_only_model else expert_lora * 4 + gpu_lora * 8)
    return ckpt, "adapter (fused_expert_lora bf16 + PEFT fp32)" + ("" if s.save_only_model else " + AdamW states")


def kept_checkpoints(s: Setup) -> tuple[int, str]:
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


def checkpoints(m: Model) -> Term:
    """The checkpoint-* folders kept at the end (kept_checkpoints) x one checkpoint."""
    ckpt, what = _checkpoint(m)
    kept, _note = kept_checkpoints(m.s)
    return _disk("checkpoints", ckpt * kept, f"{kept} kept x {ckpt/GIB:.2f} GiB per checkpoint-*: {what}")


def final_output(m: Model) -> Term:
    """The final adapter and its sglang-converted copy, or a full fine-tune's model."""
    if m.s.finetuning == "full":
        return _disk("final output", m.arch.total_params * 2, "final full model in output_dir")
    adapter = m.expert_lora * 2 + m.gpu_lora * 4
    return _disk("final output", adapter * 2, "final adapter in output_dir + its sglang-converted copy")


def merged_model(m: Model) -> Term | None:
    """deploy.serve.merge: `ktdeploy merge` writes the base with the LoRA merged in, in BF16."""
    if not (m.s.finetuning == "lora" and m.merges):
        return None
    total = m.arch.total_params
    return _disk("merged model", total * 2,
                 "deploy.serve.merge: the base with the LoRA merged in (<output_dir>-merged), BF16 whatever the base's "
                 f"format ({total:,.0f} parameters x 2 bytes; an FP8 base is dequantized)")


DISK_TERMS: tuple[TermFn, ...] = (checkpoints, final_output, merged_model)


def notes(m: Model) -> list[str]:
    """What the plan says besides its figures."""
    out = ["kt_num_gpu_experts > 0: the SFT path still routes every expert through KT (wrapper.py)"] \
        if m.s.num_gpu_experts else []
    _kept, note = kept_checkpoints(m.s)
    return out + ([note] if note else [])
