"""The time model (pure): seconds per optimizer step, tokens/s and the wall time of a run, from the recipe's setup,
the model's dimensions and the host's CPU — terms in the shape of the memory model (core/sizing/terms.Term).

Per micro-batch, kt-kernel's SFT MoE runs each layer's routed experts on the CPU between the GPU's attention of
that layer and the next (rank 0's CPU serves the tokens of every rank), so the step is a sum:

- routed experts on the CPU: padded tokens x top-k x 6·H·I FLOPs per pass (gate, up, down), passes = forward +
  backward (dX; full fine-tuning also dW) + the recomputed forward that gradient checkpointing with
  ``kt_cpu_activation: recompute`` implies; against a per-core GEMM rate of the build and format, on the
  threads kt-kernel really gets;
- a fixed cost per expert a batch touches, per layer pass (kt-kernel's per-expert task setup), and a LoRA cost
  per touched expert and layer pass that grows with rank x (H + I) (the expert's LoRA weights, grads and buffers:
  on the weight-dominated runs it, not LoRA's FLOPs, explains the time that grows with the rank and the experts),
  per layer pass (the GPU->CPU->GPU hand-off of every MoE layer) and per micro-step (Python, FSDP, logging);
  kt threads beyond the cores the trainer's own threads need slow all of these (they spin against them);
- the GPU's attention, dense and LM-head FLOPs; the shared expert runs on the GPU while the CPU runs the routed
  ones (kt-kernel submits the CPU task first), so it counts only where it is longer;
- the optimizer over the trainable parameters, and checkpoint saves at save_steps;
- once per run, not per step: the first batch of each padded length (variable-length samples, unpacked: a batch is
  padded to its longest sample, rounded up to 8) costs extra, until every length up to cutoff_len has been seen.

Every constant is a ``Measured`` naming its source: the fitted ones come from the reference host's runs
(``bench/throughput_calibration.py --fit``, table ``bench/results/throughput-calibration.md``); the expert formats'
GEMM rates (``FORMAT_SPEED``) from runs side by side on a second host (the H100 VM); the others say they are
derived from a datasheet or a kernel's code, and their band is wider.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ktdeploy.core import variants as V
from ktdeploy.core.recipe.train_keys import TrainKeys, as_int
from ktdeploy.core.sizing.model_config import MoEArchitecture
from ktdeploy.core.sizing.setup import Setup
from ktdeploy.core.sizing.terms import Measured, Term

CALIBRATION = "bench/results/throughput-calibration.md"
_FIT = f"fitted on the GPU machine's committed runs ({CALIBRATION}; bench/throughput_calibration.py --fit)"

TIME_CONSTANTS: dict[str, Measured] = {
    # ---- fitted jointly on two 16-vCPU AMX Xeon VMs (the reference host with an H200, the designed campaign's with
    # an H100; kt-kernel 0.7.2; steady rates), on the reference host's scale; see the calibration table ----
    "cpu_flop_s_per_core": Measured(6.06e+11, "bf16 AMX expert GEMM rate per kt-kernel thread, " + _FIT),
    "expert_dispatch_s": Measured(1.71e-05, "seconds per touched expert per MoE layer pass, " + _FIT),
    "expert_lora_s": Measured(2.86e-09, "seconds per touched expert per MoE layer pass per unit of LoRA rank x "
                                       "(H + I) (the expert's LoRA A/B weights, their grads and buffers), " + _FIT),
    "expert_token_s": Measured(1.26e-08, "seconds per routed token per MoE layer pass per unit of (H + I), over "
                                        "kt-kernel's threads (the token's gather, scatter and activation traffic "
                                        "around the GEMM, which do not scale with its FLOPs), " + _FIT),
    "padded_shape_s": Measured(0.246, "seconds the first batch of each new padded length costs over the steady step "
                                    "(LlamaFactory pads a batch to its longest sample, a multiple of 8): the form "
                                    "that fits the variable-length runs, whose repeated lengths ran fastest in two of "
                                    "five (docs/throughput.md), " + _FIT),
    "layer_pass_s": Measured(0.00487, "fixed seconds per MoE layer pass (GPU->CPU->GPU hand-off), " + _FIT),
    "step_fixed_s": Measured(0.181, "fixed seconds per micro-step (Python, FSDP, logging), " + _FIT),
    "threads_reserved": Measured(2.0, "cores kt-kernel's threads should leave to the trainer's own threads, fitted "
                                      "on the medium tiny model's thread sweep (4-16 threads; " + CALIBRATION + ")"),
    "oversubscription": Measured(0.15, "growth of the CPU-side time per kt thread beyond (cores - threads_reserved),"
                                      " fitted on the medium tiny model's thread sweep (" + CALIBRATION + ")"),
    "first_step_extra_s": Measured(2.11, "warm-up of the first steps over the steady rate, median of "
                                        "train_runtime - steps/steady over the runs with both (" + CALIBRATION + ")"),
    # ---- derived, not measured here ----
    "gpu_flop_s": Measured(3.5e14, "H100/H200 dense bf16 989 TFLOP/s datasheet x 0.35 assumed utilisation; "
                                   "not fitted (under 5 % of any calibration step)"),
    "optimizer_bytes_per_param": Measured(28.0, "AdamW fp32: read param, grad, m, v; write param, m, v (7 x 4 B); "
                                                "derived from torch's AdamW, not measured"),
    "full_cpu_bytes_per_param": Measured(56.0, "full fine-tuning, per routed expert param per optimizer step, all "
                                               "bf16 on the CPU (kt-kernel 0.7.2 base.py init_full_weight_grad_buffers:"
                                               " bf16 params + bf16 grad buffers): torch's foreach AdamW (decay 4, lerp"
                                               " m 6, v 4+6, sqrt/div/add eps 12, addcdiv 8 B) 40 B + grad-norm clip 6 B"
                                               " + update_base_weights re-packing the forward and backward kernel"
                                               " layouts (amx.py: load_weights_task every step) 8 B + grad-buffer clear"
                                               " 2 B; derived from the code, not measured"),
    "cpu_bytes_s": Measured(5.0e10, "host memory rate for the optimizer's streaming update: 8-channel DDR5 "
                                    "~300 GB/s datasheet, one socket's share at 1/6 assumed; not measured"),
    "gpu_bytes_s": Measured(2.0e12, "H100 3.35 TB/s HBM datasheet x 0.6 assumed; not measured"),
    "save_bytes_s": Measured(1.0e9, "1 GB/s sequential write assumed for the output volume; not measured"),
}

# GEMM rate of each weight format relative to bf16 AMX, fitted on the format-scale shape fA (bench/gpu/format_scale.py:
# the four formats side by side on one machine, the H100 VM) so the model's format/bf16 ratio of steady tokens/s is
# the measured one; fB and the tiny formats runs are held out (CALIBRATION, "Expert formats"). kt-kernel 0.7.2's
# native FP8 SFT kernel is "avx512-fp8-decode-bf16" (kt_kernel/sft/backend.py FP8_KERNEL): it decodes each FP8 block
# to bf16 and multiplies with AVX512, not AMX tiles, and builds its backward weights from the forward buffers
# ("FP8 SFT backward weights are built only from the shared forward BufferB pool", its extension's message) -- a
# slower GEMM, which is what the runs show: the FP8 step grows with the GEMM FLOPs (fB/fA 0.63x) not the weight
# bytes (1.25x). AVX512 builds run AVX512-BF16/VNNI at 1/16 of the AMX tile rate per cycle (derived).
_FMT = ("measured side by side on the H100 VM (fit on shape fA, bench/results/format-scale/call2.json; "
        f"{CALIBRATION}, \"Expert formats\")")
FORMAT_SPEED: dict[str, Measured] = {
    "bf16": Measured(1.0, "the reference (bf16 AMX tiles)"),
    "fp8": Measured(0.0369, "native FP8: AVX512 FP8->bf16 decode GEMM, " + _FMT),
    "int8": Measured(0.86, "INT8 (AMX int8 tiles, bf16 activations), " + _FMT),
    "int4": Measured(0.539, "AMXINT4 (kt-kernel converted tree), " + _FMT),
}
AVX512_SPEED, AVX2_SPEED = 1.0 / 16, 1.0 / 32


def format_speed(expert_format: str) -> Measured:
    """GEMM rate of an expert format relative to bf16 (an unknown name counts as bf16's)."""
    return FORMAT_SPEED.get(expert_format, FORMAT_SPEED["bf16"])


def build_speed(build: str) -> float:
    """GEMM rate of a kt-kernel build relative to the AMX build (an unknown name counts as AMX's)."""
    if not V.known(build):
        return 1.0
    name = V.canonical(build)
    return 1.0 if name == V.AMX else AVX2_SPEED if name == V.AVX2 else AVX512_SPEED

# Error bands (fraction of tokens/s): the held-out error of the calibration, widened where the model extrapolates.
BAND_CALIBRATED = 0.20      # bf16, samples that fill cutoff_len, the GPU machine: held out up to 17.7 % (CALIBRATION)
BAND_FORMAT = 0.35          # fp8/int8/int4: their rate ratio to bf16 measured on one shape of one VM, held out to 12.8 %
BAND_VARIABLE = 0.30        # samples shorter than cutoff_len, unpacked: held out up to 23.7 % (CALIBRATION)
BAND_OTHER_HOST = 0.40      # any host but the GPU machine: two VMs of that one kind ran one shape 1.48x apart
BAND_TINY = 0.60            # variable-length samples on a model under TINY_EXPERT_PARAMS routed expert params: +51 %
TINY_EXPERT_PARAMS = 1e9    # (2 GB of bf16 experts)
BAND_TUNED = 0.10           # after `ktdeploy tune` measured this host (tune's own repeat spread)


@dataclass(frozen=True)
class HostCPU:
    """What the time model needs of the CPU: the cores kt-kernel may use, NUMA nodes and the kt-kernel build."""

    cores: int
    numa_nodes: int = 1
    build: str = V.AMX
    source: str = "reference host"


REFERENCE_HOST = HostCPU(16, 1, V.AMX, "reference host: the GPU machine, 16-vCPU AMX Xeon VM (1 NUMA node), "
                                       "one H200")


@dataclass(frozen=True)
class Workload:
    """The data side of a step. ``sample_tokens`` None: samples fill cutoff_len (packing, or long samples);
    ``padded_ratio``: padded over real tokens of a batch (the longest sample sets the batch's length), None:
    estimated from the batch size (``estimated_padded_ratio``)."""

    sample_tokens: float | None = None
    padded_ratio: float | None = None
    samples: int | None = None


PAD_MULTIPLE = 8   # LlamaFactory's SFT collator: pad_to_multiple_of=8 when training (train/sft/workflow.py)
# Sample lengths spread uniformly this far around their mean: the spread whose expected longest-of-a-batch gives the
# padded/real that LlamaFactory's own batches of the tiny variable-length dataset measured (1.337 at batch 4, 1.466
# at batch 8: bench/padding_probe.py, bench/results/time-scale/padding.json; this formula gives 1.35 and 1.45).
PAD_SPREAD = 0.56


def estimated_padded_ratio(batch: int, mean_tokens: float, cutoff: int) -> float:
    """Padded over real tokens of a batch whose samples average ``mean_tokens``: the expected longest of ``batch``
    lengths spread uniformly ±PAD_SPREAD around the mean, capped at cutoff_len, rounded up to PAD_MULTIPLE."""
    if mean_tokens >= cutoff:
        return 1.0          # truncated to cutoff_len: every sample, and so every batch, is that long
    m = float(mean_tokens)
    lo, hi, n = (1 - PAD_SPREAD) * m, (1 + PAD_SPREAD) * m, max(1, batch)
    if cutoff >= hi:
        longest = lo + (hi - lo) * n / (n + 1)
    else:    # E[min(max, cutoff)] = cutoff - integral of the max's CDF from lo to cutoff
        longest = cutoff - (hi - lo) / (n + 1) * ((cutoff - lo) / (hi - lo)) ** (n + 1)
    return min(float(cutoff), longest + (PAD_MULTIPLE - 1) / 2) / m


@dataclass
class ThroughputPlan:
    tokens_per_s: float
    step_s: float
    steps: int | None
    wall_time_s: float | None
    band: float
    terms: list[Term]
    tokens_per_step: float
    notes: list[str] = field(default_factory=list)
    measured_tokens_per_s: float | None = None   # measured on this host (or scaled by a measurement), when given
    predicted_tokens_per_s: float | None = None  # the model's figure when a measurement replaced it
    measured_by: str | None = None               # what measured it: `ktdeploy tune`, or a run of `up`

    def to_json(self) -> dict[str, Any]:
        def banded(v: float | None, digits: int) -> dict[str, Any] | None:
            if v is None:
                return None
            return {"value": round(v, digits), "low": round(v * (1 - self.band), digits),
                    "high": round(v * (1 + self.band), digits)}
        # step_s and wall time scale inversely with tokens/s: their band is 1/(1 -+ band)
        def inv_banded(v: float | None, digits: int) -> dict[str, Any] | None:
            if v is None:
                return None
            return {"value": round(v, digits), "low": round(v / (1 + self.band), digits),
                    "high": round(v / (1 - self.band), digits)}
        return {"tokens_per_s": banded(self.tokens_per_s, 1), "step_s": inv_banded(self.step_s, 3),
                "wall_time_s": inv_banded(self.wall_time_s, 0), "steps": self.steps, "band": round(self.band, 3),
                "tokens_per_step": round(self.tokens_per_step, 1),
                "measured_tokens_per_s": self.measured_tokens_per_s, "measured_by": self.measured_by,
                "predicted_tokens_per_s": None if self.predicted_tokens_per_s is None
                else round(self.predicted_tokens_per_s, 1),
                "breakdown": [t.to_json() for t in self.terms], "notes": self.notes}


@dataclass(frozen=True)
class StepShape:
    """The counts one step is made of (also the calibration's regressors)."""

    micro_steps: int               # gradient accumulation
    real_tokens: float             # per micro-step, all ranks
    padded_tokens: float
    expert_flops: float            # CPU, per micro-step, all passes
    expert_dispatches: float       # touched experts x MoE layer passes, per micro-step
    expert_lora_units: float       # expert_dispatches x LoRA rank x (H + I): per-expert LoRA weight work
    routed_token_units: float      # padded tokens x top-k x MoE layer passes x (H + I): per routed token, not FLOPs
    layer_passes: int              # MoE layer passes per micro-step
    gpu_flops: float               # per micro-step per GPU
    shared_flops: float            # the shared experts' part of gpu_flops
    trainable_cpu_params: float
    trainable_gpu_params: float
    threads: int
    eff_threads: float             # the GEMM's threads' worth
    slowdown: float                # CPU-side time factor of oversubscribed threads


def expert_passes(s: Setup) -> tuple[int, int]:
    """(GEMM passes over the frozen or trained expert weights, layer passes) per micro-step."""
    backward = 2 if s.finetuning == "full" else 1
    recompute = 1 if s.gradient_checkpointing and s.cpu_activation == "recompute" else 0
    return 1 + backward + recompute, 2 + recompute


def effective_threads(threads: int, host: HostCPU, c: Mapping[str, Measured]) -> tuple[float, float]:
    """(the threads' worth of GEMM kt-kernel gets, the slowdown of all CPU-side work): capped at the cores the
    trainer leaves free; each thread beyond them slows the CPU side (its spinning workers fight the trainer's
    Python and CUDA threads)."""
    free = max(1.0, host.cores - c["threads_reserved"].value)
    over = max(0.0, threads - free)
    return min(float(threads), free), 1.0 + c["oversubscription"].value * over


def default_threads(host: HostCPU) -> int:
    """ktdeploy's derived kt_num_threads when the recipe sets none: physical cores minus two (controller/derive)."""
    return max(1, host.cores - 2)


def step_shape(s: Setup, arch: MoEArchitecture, host: HostCPU, work: Workload, train: Mapping[str, Any],
               c: Mapping[str, Measured]) -> StepShape:
    h, i, k = arch.hidden_size, arch.moe_intermediate_size, arch.experts_per_tok
    fill = float(s.cutoff_len) if s.packing or work.sample_tokens is None else min(work.sample_tokens, s.cutoff_len)
    ratio = work.padded_ratio if work.padded_ratio is not None else estimated_padded_ratio(s.batch, fill, s.cutoff_len)
    padded = min(float(s.cutoff_len), fill * (ratio if variable_lengths(s, work) else 1.0))
    ranks = s.num_processes
    real_t, pad_t = fill * s.batch * ranks, padded * s.batch * ranks
    gemm_passes, layer_passes = expert_passes(s)
    per_tok = 6.0 * h * i * k
    rank = s.lora_rank if s.finetuning == "lora" else 0
    flops = arch.moe_layers * pad_t * per_tok * gemm_passes
    touched = arch.num_experts * (1.0 - (1.0 - k / arch.num_experts) ** pad_t) if arch.num_experts else 0.0
    dispatches = arch.moe_layers * touched * layer_passes
    routed_units = pad_t * k * arch.moe_layers * layer_passes * (h + i)
    # GPU: 2 FLOPs per weight per token forward, 2x that backward, + recompute; causal attention scores ~ 2·T·H per
    # token per layer (QK and PV, half masked)
    gpu_passes = 3 + (1 if s.gradient_checkpointing else 0)
    per_gpu_tokens = pad_t / ranks
    shared = 3.0 * h * arch.shared_expert_intermediate_size * arch.moe_layers
    dense_w = arch.non_expert_params - arch.embedding_params - shared + arch.vocab_size * h   # + the LM head's GEMM
    attn = 2.0 * padded * h * arch.num_layers
    gpu_flops = 2.0 * per_gpu_tokens * (dense_w + attn) * gpu_passes
    shared_flops = 2.0 * per_gpu_tokens * shared * gpu_passes
    lora_gpu = rank * arch.attention_linear_io * arch.num_layers if rank else 0.0
    threads = as_int(TrainKeys(train).kt_config.get("kt_num_threads"), 0) or default_threads(host)
    trainable_cpu = (arch.routed_expert_params if s.finetuning == "full"
                     else arch.moe_layers * arch.num_experts * rank * 3 * (h + i))
    trainable_gpu = (arch.non_expert_params if s.finetuning == "full" else lora_gpu)
    micro = max(1, as_int(train.get("gradient_accumulation_steps"), 1) or 1)
    eff, slow = effective_threads(threads, host, c)
    return StepShape(micro, real_t, pad_t, flops, dispatches, dispatches * rank * (h + i), routed_units,
                     arch.moe_layers * layer_passes, gpu_flops, shared_flops, trainable_cpu, trainable_gpu, threads,
                     eff, slow)


def _secs(name: str, value: float, why: str) -> Term:
    return Term("time", name, value, why)


def step_terms(sh: StepShape, s: Setup, host: HostCPU, c: Mapping[str, Measured]) -> list[Term]:
    """Seconds of one optimizer step, by term."""
    fmt = format_speed(s.expert_format)
    fmt_speed = fmt.value * build_speed(host.build)
    rate = c["cpu_flop_s_per_core"].value * fmt_speed * sh.eff_threads
    m, slow = sh.micro_steps, sh.slowdown
    cpu = sh.expert_flops / rate * slow
    gpu_rate = c["gpu_flop_s"].value
    attn_gpu = (sh.gpu_flops - sh.shared_flops) / gpu_rate
    shared_gpu = sh.shared_flops / gpu_rate
    hidden = max(0.0, shared_gpu - cpu)
    opt_bytes = c["optimizer_bytes_per_param"].value
    full = s.finetuning == "full"
    cpu_bytes = c["full_cpu_bytes_per_param"].value if full else opt_bytes
    opt = sh.trainable_cpu_params * cpu_bytes / c["cpu_bytes_s"].value
    opt += sh.trainable_gpu_params * opt_bytes / c["gpu_bytes_s"].value
    over = f" x {slow:.2f} oversubscribed" if slow > 1 else ""
    return [
        _secs("routed experts (CPU GEMM)", m * cpu,
              f"{m} x {sh.expert_flops:.3g} FLOPs ({sh.padded_tokens:.0f} padded tokens) / "
              f"({c['cpu_flop_s_per_core'].value:.3g} FLOP/s per thread [{c['cpu_flop_s_per_core'].source}] x "
              f"format/build {fmt_speed:.3g} [{fmt.source}] x {sh.eff_threads:.0f} of {sh.threads} threads on "
              f"{host.cores} cores){over}"),
        _secs("per routed token (CPU)", m * sh.routed_token_units / sh.eff_threads * c["expert_token_s"].value * slow,
              f"{m} x {sh.routed_token_units:.3g} (padded tokens x top-k x MoE layer passes x (H + I)) x "
              f"{c['expert_token_s'].value:.3g} s [{c['expert_token_s'].source}] / {sh.eff_threads:.0f} threads{over}"),
        _secs("per-expert dispatch (CPU)", m * sh.expert_dispatches * c["expert_dispatch_s"].value * slow,
              f"{m} x {sh.expert_dispatches:.0f} touched experts x layer passes x "
              f"{c['expert_dispatch_s'].value:.3g} s [{c['expert_dispatch_s'].source}]{over}"),
        _secs("per-expert LoRA work (CPU)", m * sh.expert_lora_units * c["expert_lora_s"].value * slow,
              f"{m} x {sh.expert_lora_units:.3g} (touched experts x layer passes x LoRA rank x (H + I)) x "
              f"{c['expert_lora_s'].value:.3g} s [{c['expert_lora_s'].source}]{over}"),
        _secs("MoE layer hand-offs", m * sh.layer_passes * c["layer_pass_s"].value * slow,
              f"{m} x {sh.layer_passes} layer passes x {c['layer_pass_s'].value:.3g} s "
              f"[{c['layer_pass_s'].source}]{over}"),
        _secs("attention, dense and LM head (GPU)", m * attn_gpu,
              f"{m} x {sh.gpu_flops - sh.shared_flops:.3g} FLOPs per GPU / {gpu_rate:.3g} FLOP/s "
              f"[{c['gpu_flop_s'].source}]"),
        _secs("shared experts (GPU, beside the CPU's experts)", m * hidden,
              f"{shared_gpu:.3g} s on the GPU overlaps the CPU's {cpu:.3g} s: only the excess counts"),
        _secs("fixed per micro-step", m * c["step_fixed_s"].value * slow,
              f"{m} x {c['step_fixed_s'].value:.3g} s [{c['step_fixed_s'].source}]{over}"),
        _secs("optimizer", opt,
              f"{sh.trainable_cpu_params:.3g} CPU params x {cpu_bytes:g} B"
              f"{' (bf16 AdamW, clip, kernel re-pack)' if full else ' (AdamW)'} + "
              f"{sh.trainable_gpu_params:.3g} GPU params x {opt_bytes:g} B (AdamW) at {c['cpu_bytes_s'].value / 1e9:g} / {c['gpu_bytes_s'].value / 1e9:g} GB/s "
              "(derived, not measured: TIME_CONSTANTS says from what)"),
    ]


def run_steps(s: Setup, train: Mapping[str, Any], work: Workload, micro_samples: int) -> int | None:
    """Optimizer steps of the run: max_steps, else epochs over the dataset's samples (None: unknown size)."""
    if s.max_steps and s.max_steps > 0:
        return s.max_steps
    samples = work.samples or as_int(train.get("max_samples"), 0) or None
    if not samples:
        return None
    per_epoch = math.ceil(samples / max(1, micro_samples))
    return max(1, math.ceil(per_epoch * s.num_train_epochs))


def variable_lengths(s: Setup, work: Workload) -> bool:
    """Samples shorter than cutoff_len, unpacked: each batch is padded to its longest sample."""
    return not s.packing and work.sample_tokens is not None and work.sample_tokens < s.cutoff_len


def padded_lengths(s: Setup, work: Workload, micro_batches: int) -> int:
    """Distinct padded batch lengths a run meets: none beyond the first unless variable_lengths (every batch is
    cutoff_len long); else at most one new length per micro-batch, and at most every multiple of 8 up to
    cutoff_len."""
    if not variable_lengths(s, work):
        return 0
    return min(micro_batches, math.ceil(s.cutoff_len / PAD_MULTIPLE))


def save_seconds(s: Setup, sh: StepShape, arch: MoEArchitecture, c: Mapping[str, Measured]) -> float:
    """One checkpoint: the trainable weights (bf16) plus, unless save_only_model, their optimizer state (fp32 x3)."""
    params = sh.trainable_cpu_params + sh.trainable_gpu_params
    per_param = 2.0 + (0.0 if s.save_only_model else 12.0)
    return params * per_param / c["save_bytes_s"].value


def band_and_why(s: Setup, arch: MoEArchitecture, host: HostCPU, tuned: bool, variable: bool = False,
                 measured_by: str = "`ktdeploy tune`") -> tuple[float, str]:
    """The widest band whose condition holds, and that condition; ``variable``: samples shorter than cutoff_len,
    unpacked; ``tuned``: ``measured_by`` measured this host."""
    if tuned:
        return BAND_TUNED, (f"band ±{BAND_TUNED * 100:.0f} %: {measured_by} measured this host "
                            "(what repeated measurements on one host spread: tune's repeats)")
    cands = [(BAND_CALIBRATED, "bf16 on the GPU machine, samples that fill cutoff_len: held out up to 17.7 %")
             if s.expert_format == "bf16" else
             (BAND_FORMAT, f"the {s.expert_format} experts' rate ratio to bf16 is measured on one shape (held out "
                           "up to 12.8 %), on top of bf16's")]
    if variable and arch.routed_expert_params < TINY_EXPERT_PARAMS:
        cands.append((BAND_TINY, "samples shorter than cutoff_len on a model under 1 G routed expert params (held "
                                 "out up to 51 %)"))
    elif variable:
        cands.append((BAND_VARIABLE, "samples shorter than cutoff_len, unpacked: the padding decides (held out up "
                                     "to 23.7 %)"))
    if V.canonical(host.build) != V.AMX or host != REFERENCE_HOST:
        cands.append((BAND_OTHER_HOST, "a host other than the GPU machine the constants were fitted on (two VMs of "
                                       "one kind ran one shape 1.48x apart); `ktdeploy tune` there narrows it"))
    band, why = max(cands, key=lambda c: c[0])
    return band, f"band ±{band * 100:.0f} %: {why} ({CALIBRATION})"


def throughput(s: Setup, arch: MoEArchitecture, train: Mapping[str, Any], host: HostCPU = REFERENCE_HOST,
               work: Workload | None = None, constants: Mapping[str, Measured] | None = None,
               measured_tokens_per_s: float | None = None, measured_by: str = "`ktdeploy tune`") -> ThroughputPlan:
    """The time plan; ``measured_tokens_per_s``: this host's measured rate for this recipe (by ``measured_by``),
    which replaces the model's."""
    c = {**TIME_CONSTANTS, **(constants or {})}
    work = work or Workload()
    sh = step_shape(s, arch, host, work, train, c)
    terms = step_terms(sh, s, host, c)
    step = sum(t.value for t in terms)
    tokens = sh.real_tokens * sh.micro_steps
    tps = tokens / step
    predicted = None
    notes: list[str] = []
    if measured_tokens_per_s:
        predicted, tps = tps, measured_tokens_per_s
        step = tokens / tps
        notes.append(f"tokens/s measured on this host by {measured_by} ({measured_tokens_per_s:.1f}); the model "
                     f"predicted {predicted:.1f} ({(predicted / measured_tokens_per_s - 1) * 100:+.0f} %)")
    steps = run_steps(s, train, work, s.batch * s.num_processes * sh.micro_steps)
    wall = None
    if steps is not None:
        saves = steps // s.save_steps if s.save_steps and s.save_strategy == "steps" else 0
        save_s = save_seconds(s, sh, arch, c)
        terms.append(Term("wall", "checkpoint saves", saves * save_s,
                          f"{saves} saves (every {s.save_steps} steps) x {save_s:.3g} s "
                          f"[{c['save_bytes_s'].source}]"))
        terms.append(Term("wall", "first steps' warm-up", c["first_step_extra_s"].value,
                          c["first_step_extra_s"].source))
        shapes = padded_lengths(s, work, steps * sh.micro_steps)
        terms.append(Term("wall", "first batch of each padded length", shapes * c["padded_shape_s"].value,
                          f"{shapes} lengths x {c['padded_shape_s'].value:.3g} s [{c['padded_shape_s'].source}]"))
        wall = steps * step + saves * save_s + c["first_step_extra_s"].value + shapes * c["padded_shape_s"].value
    else:
        notes.append("wall time: the dataset's size is unknown; set train.max_steps or train.max_samples, or pass "
                     "--samples N")
    if work.sample_tokens is None and not s.packing:
        notes.append(f"tokens/s assumes samples that fill cutoff_len ({s.cutoff_len}); shorter samples lower it "
                     "(pass --sample-tokens N)")
    if s.expert_format != "bf16":
        fmt = format_speed(s.expert_format)
        notes.append(f"the {s.expert_format} expert GEMM runs at {fmt.value:.3g} x bf16's rate, {fmt.source}")
    variable = variable_lengths(s, work)
    if variable:
        ratio = sh.padded_tokens / sh.real_tokens
        how = ("as given (--padded-ratio)" if work.padded_ratio is not None else
               f"estimated: lengths spread ±{PAD_SPREAD * 100:.0f} % around the mean, which gives LlamaFactory's "
               "measured batches of the tiny dataset; pass --padded-ratio R if you know yours")
        notes.append(f"padding: each batch of {s.batch} is padded to its longest sample (a multiple of "
                     f"{PAD_MULTIPLE}): {ratio:.2f}x the real tokens, {how}")
    band, why = band_and_why(s, arch, host, measured_tokens_per_s is not None, variable, measured_by)
    notes.append(why)
    return ThroughputPlan(tps, step, steps, wall, band, terms, tokens, notes, measured_tokens_per_s, predicted,
                          measured_by if measured_tokens_per_s else None)


# ---- the host, from doctor's facts and tune's record (pure: parsed dicts in) ------------------------------

MAX_CORES = 1 << 16
MAX_NUMA_NODES = 1 << 10      # Linux's MAX_NUMNODES at its largest (NODES_SHIFT 10)


def _count_of(v: Any) -> int:
    """A count as the facts give it: a whole number (never a bool), else 0."""
    return 0 if isinstance(v, bool) else as_int(v, 0) if isinstance(v, int | str) else 0


def host_from_facts(facts: Mapping[str, Any]) -> HostCPU:
    """doctor's facts (`ktdeploy doctor --json`'s facts, or a run record's doctor.json): physical cores, NUMA nodes,
    and the kt-kernel build the CPU flags allow (AMX, else AVX512, else AVX2)."""
    if isinstance(facts.get("facts"), Mapping):
        facts = facts["facts"]
    cpu = facts.get("cpu") if isinstance(facts.get("cpu"), Mapping) else {}
    assert isinstance(cpu, Mapping)
    cores = _count_of(cpu.get("physical_cores")) or _count_of(cpu.get("logical_cpus")) or 0
    if cores <= 0:
        raise ValueError("the facts name no physical_cores or logical_cpus")
    if cores > MAX_CORES:
        raise ValueError(f"the facts name {cores} cores, more than any host has ({MAX_CORES})")
    nodes = cpu.get("numa_nodes")
    # not "at most one node per core": a cpuset of 2 CPUs on a host of 8 nodes (SNC, memory-only nodes) is real
    if isinstance(nodes, list) and len(nodes) > MAX_NUMA_NODES:
        raise ValueError(f"the facts name {len(nodes)} NUMA nodes, more than Linux has ({MAX_NUMA_NODES})")
    raw_flags = cpu.get("flags") or []
    if not isinstance(raw_flags, list) or not all(isinstance(f, str) for f in raw_flags):
        raise ValueError("the facts' cpu.flags is not a list of flag names")
    flags = set(raw_flags)
    build = V.detect(flags).name
    return HostCPU(cores, len(nodes) if isinstance(nodes, list) and nodes else 1, build,
                   f"doctor's facts: {cores} physical cores, {build} build")


def tuned_rate(tune: Mapping[str, Any]) -> tuple[float, dict[str, Any]] | None:
    """(measured tokens/s of the chosen setting, that setting) from a tune record (tune.json), if it has one."""
    tps = tune.get("chosen_tokens_per_s")
    chosen = tune.get("chosen")
    if not isinstance(tps, int | float) or tps <= 0 or not isinstance(chosen, Mapping):
        return None
    return float(tps), dict(chosen)


def time_model_id() -> str:
    """This time model's identity: a digest of its constants. A run's plan-vs-measured ratio (eta.json) holds only
    against the model that planned it."""
    import hashlib

    text = ";".join(f"{k}={v.value!r}" for k, v in sorted({**TIME_CONSTANTS, **FORMAT_SPEED}.items()))
    return "tm-" + hashlib.sha256(text.encode()).hexdigest()[:12]


RUN_RATIO_MAX = 100.0     # measured/plan of a run beyond this, either way, is refused (run_step_times)


def run_step_times(eta: Mapping[str, Any]) -> tuple[float, float]:
    """(planned, measured) seconds per step of a run (its record's eta.json), or ValueError saying why they cannot
    scale a plan: planned by another time model, no plan, or no measured step."""
    model = eta.get("time_model")
    if model != time_model_id():
        other = f"another time model ({str(model)[:40]})" if model else "a ktdeploy that did not name its time model"
        raise ValueError(f"its plan came from {other}, not this one ({time_model_id()}): its measured/plan ratio "
                         "does not apply")
    planned, measured = eta.get("planned_step_s"), eta.get("measured_step_s")
    if not isinstance(planned, int | float) or isinstance(planned, bool) or not 0 < planned < 1e9:
        raise ValueError("it has no planned step time (the planner had no config.json for its model)")
    if not isinstance(measured, int | float) or isinstance(measured, bool) or not 0 < measured < 1e9:
        raise ValueError("it measured no step time (training ended before its second step was seen)")
    # a step is a millisecond at the least; a host a hundred times off its plan is not this model's host but a
    # broken run or a record written by hand
    if planned < 1e-3 or measured < 1e-3 or not 1 / RUN_RATIO_MAX <= measured / planned <= RUN_RATIO_MAX:
        raise ValueError(f"its measured/plan step time {measured:.3g} / {planned:.3g} s is outside what a run can "
                         f"mean ({1 / RUN_RATIO_MAX:g} to {RUN_RATIO_MAX:g} x)")
    return float(planned), float(measured)
