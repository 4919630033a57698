"""The time model: its terms respond to the knobs the way kt-kernel's pipeline does, steps and wall time follow
the Trainer's arithmetic, and the committed calibration table is what the constants give."""

from __future__ import annotations

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
    REFERENCE_HOST,
    TIME_CONSTANTS,
    HostCPU,
    Workload,
    build_speed,
    host_from_facts,
    throughput,
    tuned_rate,
)

ROOT = Path(__file__).resolve().parents[4]
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


def test_int8_gemm_is_faster_and_its_band_wider():
    bf16 = _tp(_train(kt_num_threads=12))
    int8 = _tp(_train(kt_num_threads=12, kt_expert_weight_format="int8"))
    assert int8.tokens_per_s > bf16.tokens_per_s
    assert (bf16.band, int8.band) == (BAND_CALIBRATED, BAND_FORMAT)
    assert any("not measured" in n for n in int8.notes)


def test_another_host_widens_the_band_and_more_cores_help():
    big = HostCPU(64, 2, "amx", "test")
    t = _train(kt_num_threads=60)
    assert _tp(t, big).band == BAND_OTHER_HOST
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
