"""The time model: its terms respond to the knobs the way kt-kernel's pipeline does, steps and wall time follow
the Trainer's arithmetic, and the committed calibration table is what the constants give."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from ktdeploy.core.sizing.model_config import parse_model_config
from ktdeploy.core.sizing.setup import setup_from
from ktdeploy.core.sizing.throughput import (
    BAND_CALIBRATED,
    BAND_FORMAT,
    BAND_OTHER_HOST,
    BAND_TINY,
    BAND_VARIABLE,
    FORMAT_SPEED,
    REFERENCE_HOST,
    TIME_CONSTANTS,
    HostCPU,
    Workload,
    build_speed,
    estimated_padded_ratio,
    host_from_facts,
    throughput,
    tuned_rate,
)

ROOT = Path(__file__).resolve().parents[4]


def _calibration():
    spec = importlib.util.spec_from_file_location("throughput_calibration", ROOT / "bench/throughput_calibration.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["throughput_calibration"] = mod
    spec.loader.exec_module(mod)
    return mod
MEDIUM = json.loads((ROOT / "bench/results/gpu/full_results.json").read_text())["model_configs"]["medium"]
ARCH = parse_model_config(MEDIUM, "medium")


def _train(**kt):
    return {"finetuning_type": "lora", "lora_rank": 8, "cutoff_len": 512, "per_device_train_batch_size": 4,
            "use_kt": True, "kt_config": {"kt_backend": "auto", "kt_expert_weight_format": "bf16", **kt}}


def _tp(train, host=REFERENCE_HOST, work=None, **kw):
    return throughput(setup_from(train, {}), ARCH, train, host, work, **kw)


def test_oversubscribed_threads_are_slower_than_the_cores_left_free():
    # the GPU machine measured 824 tokens/s at 12 threads and 535 at 16 on 16 cores
    assert _tp(_train(kt_num_threads=12)).tokens_per_s > _tp(_train(kt_num_threads=16)).tokens_per_s
    assert _tp(_train(kt_num_threads=8)).tokens_per_s > _tp(_train(kt_num_threads=4)).tokens_per_s


def test_recompute_costs_a_pass_that_retain_saves():
    recompute = _tp(_train(kt_num_threads=12))
    retain = {**_train(kt_num_threads=12), "kt_cpu_activation": "retain"}
    assert _tp(retain).step_s < recompute.step_s
    no_gc = {**_train(kt_num_threads=12), "disable_gradient_checkpointing": True}
    assert _tp(no_gc).step_s < recompute.step_s


def test_full_fine_tuning_adds_the_weight_gradient_and_the_optimizer():
    lora = _tp(_train(kt_num_threads=12))
    full = {**_train(kt_num_threads=12), "finetuning_type": "full"}
    assert _tp(full).step_s > lora.step_s


def test_formats_run_at_their_measured_rates_and_carry_the_wider_band():
    # side by side on the H100 VM (shape fA): int8 ~ bf16, amxint4 below it, native FP8 several times slower
    # (kt-kernel's FP8 SFT GEMM decodes to bf16 on AVX512, not AMX tiles)
    tps = {f: _tp(_train(kt_num_threads=12, kt_expert_weight_format=f)) for f in ("bf16", "int8", "fp8")}
    tps["int4"] = _tp(_train(kt_num_threads=12, kt_backend="AMXINT4"))
    assert tps["fp8"].tokens_per_s < tps["int4"].tokens_per_s < tps["int8"].tokens_per_s <= tps["bf16"].tokens_per_s
    assert tps["int8"].tokens_per_s > 0.9 * tps["bf16"].tokens_per_s
    assert tps["fp8"].step_s > tps["bf16"].step_s + 0.5 * next(
        t.value for t in tps["bf16"].terms if t.name == "routed experts (CPU GEMM)") * (1 / FORMAT_SPEED["fp8"].value - 1)
    assert (tps["bf16"].band, tps["int8"].band) == (BAND_CALIBRATED, BAND_FORMAT)
    # samples shorter than the cutoff: the padding decides, held out up to 24 % (51 % on the tiny models)
    short = Workload(sample_tokens=256, padded_ratio=1.3)
    assert _tp(_train(kt_num_threads=12), work=short).band == BAND_TINY
    wide = parse_model_config({**MEDIUM, "hidden_size": 2048, "num_hidden_layers": 16, "num_experts": 80,
                               "moe_intermediate_size": 640}, "w10")
    t = _train(kt_num_threads=12)
    assert throughput(setup_from(t, {}), wide, t, REFERENCE_HOST, short).band == BAND_VARIABLE
    packed = {**t, "packing": True}
    assert throughput(setup_from(packed, {}), wide, packed, REFERENCE_HOST, short).band == BAND_CALIBRATED
    assert BAND_CALIBRATED < BAND_VARIABLE < BAND_TINY
    assert any("measured side by side" in n for n in tps["fp8"].notes)


def test_every_format_factor_is_the_fit_on_the_side_by_side_runs():
    bench = _calibration()
    fitted = bench.format_fit(bench.all_runs(), dict(TIME_CONSTANTS))
    assert set(fitted) == set(FORMAT_SPEED) - {"bf16"}
    for fmt, v in fitted.items():
        assert FORMAT_SPEED[fmt].value == pytest.approx(v, rel=2e-3), fmt
        assert "measured side by side" in FORMAT_SPEED[fmt].source


def test_full_fine_tuning_streams_the_bf16_expert_state_every_step():
    # kt-kernel's full mode: bf16 params + grads on the CPU, foreach AdamW, clip and a kernel re-pack per step
    full = {**_train(kt_num_threads=12), "finetuning_type": "full"}
    tp = _tp(full)
    opt = next(t for t in tp.terms if t.name == "optimizer")
    c = TIME_CONSTANTS
    cpu = ARCH.routed_expert_params * c["full_cpu_bytes_per_param"].value / c["cpu_bytes_s"].value
    gpu = ARCH.non_expert_params * c["optimizer_bytes_per_param"].value / c["gpu_bytes_s"].value
    assert opt.value == pytest.approx(cpu + gpu)
    more = {**c, "full_cpu_bytes_per_param": replace(c["full_cpu_bytes_per_param"], value=112.0)}
    assert _tp(full, constants=more).step_s == pytest.approx(tp.step_s + cpu)
    lora = _tp(_train(kt_num_threads=12))
    assert _tp(_train(kt_num_threads=12), constants=more).step_s == lora.step_s   # LoRA does not stream it


def test_one_runs_host_factor_scales_the_others_of_its_machine_only():
    bench = _calibration()
    runs = bench.all_runs()
    c = dict(TIME_CONSTANTS)
    scaled = bench.host_scaled(runs, c, "fB-bf16")
    h = {r.name: r for r in runs if r.source.endswith("format-scale/call3.json")}
    assert scaled["fB-bf16"] == pytest.approx(h["fB-bf16"].measured)
    f = h["fB-bf16"].measured / bench.predict(h["fB-bf16"], c)
    assert scaled["fB-int8"] == pytest.approx(bench.predict(h["fB-int8"], c) * f)
    assert "fA-bf16" not in scaled        # another GPU call, maybe another VM: its own factor


def test_the_cpu_model_tells_the_gpu_calls_vms_apart():
    bench = _calibration()
    cpu = "Vendor ID: GenuineIntel\nModel:                                   {}\nStepping: 2"
    assert bench._host_of({"machine": "NVIDIA H100 80GB HBM3", "cpu": cpu.format(207)}) == bench.TS_EMR
    assert bench._host_of({"machine": "NVIDIA H100 80GB HBM3", "cpu": cpu.format(143)}) == bench.TS_SPR
    assert bench._host_of({"machine": "NVIDIA H100 80GB HBM3"}) == bench.H100_VM
    assert bench._host_of({"machine": "NVIDIA H200"}) == bench.REFERENCE
    runs = bench.all_runs()
    ts = {(r.host, r.name) for r in runs if r.name == "ts-base"}
    assert ts == {(bench.TS_SPR, "ts-base"), (bench.TS_EMR, "ts-base")}


def test_the_campaign_factor_is_fitted_on_its_fit_setups_only():
    bench = _calibration()
    runs = bench.all_runs()
    c = dict(TIME_CONSTANTS)
    before = bench.campaign_factor(runs, c, bench.TS_EMR)
    held = [r for r in runs if r.host == bench.TS_EMR and not r.fit]
    assert held and all(r.shape not in bench.TIME_FIT for r in held)
    moved = [replace(r, measured=r.measured * 3) if r in held else r for r in runs]
    assert bench.campaign_factor(moved, c, bench.TS_EMR) == pytest.approx(before)
    assert bench.campaign_factor(runs, c, bench.REFERENCE) == 1.0


def test_routed_tokens_cost_beyond_their_flops():
    # the designed campaign: half the routed tokens (top-4) saved more than the GEMM's share of the step
    t = _tp(_train(kt_num_threads=12))
    term = {x.name: x.value for x in t.terms}
    assert term["per routed token (CPU)"] > 0
    k4 = parse_model_config({**MEDIUM, "num_experts_per_tok": 4}, "k4")
    t4 = throughput(setup_from(_train(kt_num_threads=12), {}), k4, _train(kt_num_threads=12), REFERENCE_HOST)
    assert {x.name: x.value for x in t4.terms}["per routed token (CPU)"] == pytest.approx(
        term["per routed token (CPU)"] / 2)


def test_another_host_widens_the_band_and_more_cores_help():
    big = HostCPU(64, 2, "amx", "test")
    t = _train(kt_num_threads=60)
    assert _tp(t, big).band == BAND_OTHER_HOST
    same_cores = HostCPU(16, 1, "amx", "doctor's facts")   # two VMs of one kind ran one shape 1.48x apart
    assert _tp(_train(kt_num_threads=14), same_cores).band == BAND_OTHER_HOST
    assert _tp(_train(kt_num_threads=14), work=Workload(sample_tokens=200, padded_ratio=1.3)).band == BAND_TINY
    wide = parse_model_config({**MEDIUM, "hidden_size": 2048, "num_hidden_layers": 16, "num_experts": 80,
                               "moe_intermediate_size": 640}, "w10")
    assert throughput(setup_from(t, {}), wide, t, big).band == BAND_OTHER_HOST
    assert _tp(t, big).tokens_per_s > _tp(_train(kt_num_threads=14)).tokens_per_s
    assert _tp(_train(kt_num_threads=14), HostCPU(16, 1, "avx512", "t")).tokens_per_s < \
        _tp(_train(kt_num_threads=14)).tokens_per_s


def test_steps_and_wall_time_follow_the_trainer():
    t = {**_train(kt_num_threads=12), "num_train_epochs": 2, "gradient_accumulation_steps": 2,
         "save_strategy": "steps", "save_steps": 10}
    tp = _tp(t, work=Workload(samples=1000))
    assert tp.steps == 2 * 125                    # ceil(1000 / (4 x 1 GPU x 2)) per epoch, 2 epochs
    saves = next(x for x in tp.terms if x.name == "checkpoint saves")
    assert "25 saves" in saves.explanation
    assert tp.wall_time_s == pytest.approx(tp.steps * tp.step_s + saves.value
                                           + TIME_CONSTANTS["first_step_extra_s"].value)
    assert _tp({**t, "max_steps": 7}).steps == 7
    unknown = _tp(_train(kt_num_threads=12))
    assert unknown.wall_time_s is None and any("--samples" in n for n in unknown.notes)


def test_each_new_padded_length_costs_once_in_the_wall_time_not_in_the_steady_rate():
    t = {**_train(kt_num_threads=12), "gradient_accumulation_steps": 2}
    s = TIME_CONSTANTS["padded_shape_s"].value

    def shapes(tp):
        return next(x for x in tp.terms if x.name == "first batch of each padded length")

    filled = _tp(t, work=Workload(samples=1000))
    assert shapes(filled).value == 0                # every batch is cutoff_len long: one length
    few = _tp({**t, "max_steps": 10}, work=Workload(sample_tokens=200, samples=1000))
    assert shapes(few).value == pytest.approx(20 * s)     # at most one new length per micro-batch: 10 steps x 2
    many = _tp(t, work=Workload(sample_tokens=200, samples=4000))
    assert shapes(many).value == pytest.approx(512 / 8 * s)   # at most every multiple of 8 up to cutoff_len 512
    assert many.wall_time_s == pytest.approx(many.steps * many.step_s + sum(x.value for x in many.terms
                                                                           if x.resource == "wall"))
    packed = _tp({**t, "packing": True}, work=Workload(sample_tokens=200, samples=1000))
    assert shapes(packed).value == 0
    # the steady rate has none of it: the same step with and without a known dataset size
    assert _tp(t, work=Workload(sample_tokens=200)).step_s == pytest.approx(many.step_s)


def test_the_padding_probe_saw_the_gpu_runs_batches_and_the_calibration_counts_their_new_lengths():
    bench = _calibration()
    probe = json.loads((ROOT / "bench/results/time-scale/padding.json").read_text())["batches"]
    campaign = {r["run"]: r for r in json.loads((ROOT / "bench/results/time-scale/call5.json").read_text())["runs"]}
    for row in (r for r in probe.values() if "campaign_run" in r):
        cum = sorted({step: tokens for _, step, tokens in campaign[row["campaign_run"]]["measured"]["step_arrivals"]}
                     .items())
        per_step = [b - a for a, b in zip([0] + [t for _, t in cum], [t for _, t in cum], strict=False)]
        assert row["real"][:len(per_step)] == per_step          # the probe's batches are the GPU run's
        assert all(p >= r and p % (8 * row["batch"]) == 0 for p, r in zip(row["padded"], row["real"], strict=True))
    runs = {r.name: r for r in bench.all_runs()}
    assert bench.new_lengths(runs["ts-var"]) == 11 and bench.new_lengths(runs["ts-var-b8"]) == 7
    assert bench.new_lengths(runs["ts-base"]) == 0
    assert bench._workload(runs["ts-var"]).padded_ratio == pytest.approx(
        sum(probe["tiny_sft_long/4"]["padded"][1:14]) / sum(probe["tiny_sft_long/4"]["real"][1:14]))


def test_the_long_probe_continues_the_short_ones_batches():
    """padding-long.json (padding_probe.py --long) holds the 60-step batches the next call's `var` runs will see:
    the same sampler, so its first steps are the committed runs' own, and lengths repeat over it."""
    short = json.loads((ROOT / "bench/results/time-scale/padding.json").read_text())["batches"]["tiny_sft_long/4"]
    long = json.loads((ROOT / "bench/results/time-scale/padding-long.json").read_text())["batches"]["tiny_sft_long/4"]
    assert len(long["real"]) == 60 and long["real"][:16] == short["real"] and long["padded"][:16] == short["padded"]
    bench = _calibration()
    assert bench.fresh_lengths(long["padded"], 60) < 30      # most of a long run's steps repeat a length


def test_the_estimated_padding_is_what_llamafactorys_own_batches_measured():
    probe = json.loads((ROOT / "bench/results/time-scale/padding.json").read_text())["batches"]
    for key in ("tiny_sft_long/4", "tiny_sft_long/8"):
        row = probe[key]
        measured = sum(row["padded"]) / sum(row["real"])
        mean = sum(row["real"]) / len(row["real"]) / row["batch"]
        assert estimated_padded_ratio(row["batch"], mean, 512) == pytest.approx(measured, rel=0.03), key
    assert estimated_padded_ratio(1, 264, 512) == pytest.approx(1 + 3.5 / 264)    # one sample: only the rounding
    assert estimated_padded_ratio(8, 264, 512) > estimated_padded_ratio(4, 264, 512)
    assert 264 * estimated_padded_ratio(64, 264, 300) <= 300                        # never past cutoff_len
    assert estimated_padded_ratio(4, 1000, 512) == pytest.approx(1.0)               # truncated: every batch full


def test_gradient_accumulation_repeats_the_micro_step_not_the_optimizer():
    one = _tp(_train(kt_num_threads=12))
    four = _tp({**_train(kt_num_threads=12), "gradient_accumulation_steps": 4})
    opt = next(t.value for t in one.terms if t.name == "optimizer")
    assert opt > 0
    assert four.step_s == pytest.approx(4 * (one.step_s - opt) + opt)
    assert four.tokens_per_s > one.tokens_per_s


def test_short_samples_lower_tokens_per_step():
    full = _tp(_train(kt_num_threads=12))
    short = _tp(_train(kt_num_threads=12), work=Workload(sample_tokens=128))
    assert short.tokens_per_step == full.tokens_per_step / 4
    assert short.step_s < full.step_s


def test_json_bands_bracket_the_value():
    j = _tp(_train(kt_num_threads=12), work=Workload(samples=400)).to_json()
    for key in ("tokens_per_s", "step_s", "wall_time_s"):
        assert j[key]["low"] < j[key]["value"] < j[key]["high"]


def test_a_tune_measurement_replaces_the_prediction_and_narrows_the_band():
    tp = _tp(_train(kt_num_threads=12), measured_tokens_per_s=900.0)
    assert tp.tokens_per_s == 900.0 and tp.predicted_tokens_per_s and tp.band < BAND_CALIBRATED
    assert tp.step_s == pytest.approx(tp.tokens_per_step / 900.0)
    tune = json.loads((ROOT / "bench/results/tune/tune.json").read_text())
    assert tuned_rate(tune) == (928.0, {"kt_num_threads": 12, "kt_threadpool_count": 1})
    assert tuned_rate({"chosen_tokens_per_s": None, "chosen": {}}) is None


def test_host_from_doctor_facts_of_the_gpu_machine():
    doctor = json.loads((ROOT / "bench/results/gpu/proof/run_record/doctor.json").read_text())
    h = host_from_facts(doctor)
    assert (h.cores, h.numa_nodes, h.build) == (16, 1, "amx")
    # kt-kernel's own ladder picks the build: avx512f alone is not its avx512_base (that needs avx512bw too)
    cpu = dict(doctor["facts"]["cpu"], flags=["avx512f", "avx2"])
    assert host_from_facts({"cpu": cpu}).build == "avx2"
    cpu = dict(doctor["facts"]["cpu"], flags=["avx512f", "avx512bw"])
    assert host_from_facts({"cpu": cpu}).build == "avx512_base"
    assert build_speed("avx512_base") == build_speed("avx512") == 1 / 16 and build_speed("avx2") == 1 / 32
    with pytest.raises(ValueError):
        host_from_facts({"cpu": {}})
    assert replace(h, cores=8).cores == 8


def test_every_constant_says_where_it_comes_from():
    for name, c in TIME_CONSTANTS.items():
        assert c.source and ("fitted" in c.source or "not measured" in c.source or "median" in c.source), name


def test_committed_calibration_table_is_what_the_constants_give():
    r = subprocess.run([sys.executable, str(ROOT / "bench/throughput_calibration.py"), "--check"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_steady_rates_come_from_the_trainer_logs_per_step_clock():
    bench = _calibration()
    log = ROOT / "bench/results/gpu/weight_scale/call4/ws-w10-c2048.log"
    rows = bench.log_steps(log)
    assert [k for k, _ in rows] == [2048 * n for n in range(1, 7)]
    # from the end of step 2 to the end of step 6: the first step's warm-up left out
    assert bench.steady_from_steps(rows) == pytest.approx((12288 - 4096) / (23.59 - 9.409))
    assert bench.steady_from_steps(rows[:2]) is None
    runs = {r.name: r for r in bench.reference_runs()}
    assert runs["w10-c2048"].kind == "steady" and runs["w10-c2048"].measured > 12288 / 24.98   # above the whole-run rate
    assert runs["w39-e208"].kind == "steady"      # a run with no whole-run figure, brought in by its log


def test_lora_rank_costs_per_touched_expert():
    low, high = _tp({**_train(kt_num_threads=12), "lora_rank": 8}), _tp({**_train(kt_num_threads=12), "lora_rank": 32})
    term = {t.name: t.value for t in low.terms}, {t.name: t.value for t in high.terms}
    assert term[1]["per-expert LoRA work (CPU)"] == pytest.approx(4 * term[0]["per-expert LoRA work (CPU)"])
    assert high.step_s > low.step_s


def test_time_scale_readme_figures_are_the_committed_runs():
    base = ROOT / "bench/results/time-scale"
    rows = {(f.stem, r["run"]): r for f in sorted(base.glob("call*.json")) for r in json.loads(f.read_text())["runs"]
            if (r.get("measured") or {}).get("rc") == 0}
    table = [[c.strip() for c in line.split("|")[1:-1]] for line in (base / "README.md").read_text().splitlines()
             if line.startswith("| call") and not line.startswith("| call |")]
    assert {(c[0], c[1]) for c in table} == set(rows)
    for c in table:
        r = rows[(c[0], c[1])]
        m = r["measured"]
        assert float(c[4]) == m["steady_tokens_per_s"] and float(c[5]) == m["median_step_tokens_per_s"]
        assert float(c[6]) == r["plan"]["tokens_per_s"]["value"]
        assert int(c[3]) == m["tokens"] // m["steps"]


def test_the_plan_says_why_its_band_is_that_wide():
    def why(tp):
        return next(n for n in tp.notes if n.startswith("band ±"))
    assert "fill cutoff_len" in why(_tp(_train(kt_num_threads=12)))
    assert why(_tp(_train(kt_num_threads=12), work=Workload(sample_tokens=200, padded_ratio=1.3))).startswith(
        f"band ±{BAND_TINY * 100:.0f} %: samples shorter than cutoff_len")
    assert "host other than the GPU machine" in why(_tp(_train(kt_num_threads=12), HostCPU(16, 1, "amx", "facts")))
    assert "tune" in why(_tp(_train(kt_num_threads=12), measured_tokens_per_s=900.0))
    assert "fp8 experts" in why(_tp(_train(kt_num_threads=12, kt_expert_weight_format="fp8")))


def test_the_docs_held_out_figures_are_the_calibrations():
    bench = _calibration()
    runs = bench.all_runs()
    c = dict(TIME_CONSTANTS)
    _, ref = bench.table([r for r in runs if r.host == bench.REFERENCE], c)
    factor = bench.campaign_factor(runs, c, bench.TS_EMR)
    _, ts = bench.table([r for r in runs if r.host == bench.TS_EMR], c, factor)
    filled, var_wide = ref.held_filled + ts.held_filled, ref.held_var_wide + ts.held_var_wide
    doc = " ".join((ROOT / "docs/throughput.md").read_text().split())
    assert f"| filled samples (reference host and the designed campaign) | {len(filled)} | " \
           f"{sum(x <= 0.15 for x in filled)} | -{max(filled) * 100:.1f} %" in doc
    tiny = [x for x in ref.held_var + ts.held_var if x not in var_wide]
    for row, errs in (("variable-length samples, >= 1 G routed expert params (both hosts)", var_wide),
                      ("variable-length samples, tiny models (< 1 G, both hosts)", tiny)):
        assert f"| {row} | {len(errs)} | {sum(x <= 0.15 for x in errs)} | +{max(errs) * 100:.1f} %" in doc, row
    assert f"| of these, the designed campaign's five (one VM, beside its filled base run) | {len(ts.held_var)} | " \
           f"{sum(x <= 0.15 for x in ts.held_var)} | -{max(ts.held_var) * 100:.1f} %" in doc
    assert f"held out to {max(filled) * 100:.1f} %" in doc and f"held out to {max(var_wide) * 100:.1f} %" in doc
    assert f"(fitted {factor:.3f})" in doc
    assert max(filled) <= BAND_CALIBRATED and max(var_wide) <= BAND_VARIABLE
    assert max(ref.held_tiny + ts.held_tiny) <= BAND_TINY
    _, sessions = bench.session_section(runs, c)
    early = sessions["2026-12-02"] + sessions["2026-12-03"]
    assert f"ran {min(early):.2f}-{max(early):.2f} s per step slower than the model" in doc
    assert f"within {max(abs(x) for x in sessions['2026-12-04']):.2f} s of it" in doc


def test_a_runs_session_is_the_date_its_own_log_prints():
    bench = _calibration()
    day = {r.name: bench.session_of(r) for r in bench.reference_runs()}
    assert day["w5-e64"] == "2026-12-03" and day["w20-l32"] == "2026-12-04" and day["w10-e80f"] == "2026-12-04"
    assert day["peaks-large"] == day["ab-kt-1@ab"] == "2026-12-02"     # ab: the repeat call's warm machine
    (r,) = [r for r in bench.reference_runs() if r.name == "w10-k4"]
    c = dict(TIME_CONSTANTS)
    per_step = r.window_tokens
    assert bench.excess_s(r, c) == pytest.approx(per_step / r.measured - per_step / bench.predict(r, c))
    assert bench.excess_s(replace(r, measured=bench.predict(r, c)), c) == pytest.approx(0.0, abs=1e-12)
