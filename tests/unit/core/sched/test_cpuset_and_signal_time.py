"""A job's CPUs and its thread plan (core/sched/cpuset.py, agent/job_cpus.py), and how early it is warned before its
time limit (core/sched/signal_time.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ktdeploy.core.checks.threads import derive_threads
from ktdeploy.core.errors import RecipeError
from ktdeploy.core.facts.host import HostFacts
from ktdeploy.core.recipe import load_recipe
from ktdeploy.core.sched.cpuset import allotted, cpu_list_text, job_threads, parse_cpu_bind, threads_for
from ktdeploy.core.sched.signal_time import require_room, signal_plan, slurm_time_seconds, warn_seconds

REPO = Path(__file__).resolve().parents[4]


def test_cpu_bind_masks_and_maps():
    assert parse_cpu_bind("quiet,mask_cpu:0x0000000F") == [0, 1, 2, 3]
    assert parse_cpu_bind("verbose,mask_cpu:0x30,0xC0") == [4, 5]        # the first task's
    assert parse_cpu_bind("map_cpu:7,9") == [7]
    for none in ("", None, "cores", "quiet,none", "mask_cpu:zz", "mask_cpu:0x0"):
        assert parse_cpu_bind(none) is None


def test_the_cgroup_is_the_strongest_word_within_the_mask():
    mask = range(16)
    assert allotted("4-7", "mask_cpu:0x3", mask).cpus == (4, 5, 6, 7) and allotted("4-7", None, mask).source == "job_cgroup"
    assert allotted(None, "mask_cpu:0x3", mask).cpus == (0, 1) and allotted("", "mask_cpu:0x3", mask).source == "slurm_cpu_bind"
    assert allotted("garbage", None, [2, 3]).cpus == (2, 3) and allotted(None, None, [2, 3]).source == "affinity"
    assert allotted("20-23", None, [0, 1]).cpus == (0, 1)      # a set outside the mask cannot be used
    assert cpu_list_text([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8" and allotted("0-2,5", None, mask).text == "0-2,5"


def test_threads_are_physical_cores_and_pools_the_numa_nodes_they_span():
    # 2 sockets x 4 cores x 2 threads: CPU c is core c % 8 of socket c // 8 % 2 (siblings 16 apart), node = socket
    core_of = {c: ((c % 16) // 8, c % 8) for c in range(32)}
    node_of = {c: (c % 16) // 8 for c in range(32)}
    assert job_threads([0, 1, 2, 3, 16, 17, 18, 19], core_of, node_of, 0) == (4, 1)   # SMT siblings count once
    assert job_threads([6, 7, 8, 9], core_of, node_of, 2) == (2, 2)                    # spans both nodes
    assert threads_for(3, 2, 4) == (1, 1) and threads_for(64, 2, 2) == (62, 2)


@pytest.mark.parametrize("name", ["gpu-h200-vm", "haswell-avx2-qemu"])
def test_doctor_and_a_jobs_cores_follow_one_rule(name):
    p = REPO / "tests" / "golden" / name
    data = json.loads(((p / "facts.json") if (p / "facts.json").exists() else p / "doctor.json").read_text())
    facts = HostFacts.model_validate(data.get("facts", data))
    cpu = facts.cpu
    nodes = [n for n in cpu.numa_nodes if set(n.cpus) & set(cpu.allowed_cpus)]
    assert derive_threads(facts, 2) == threads_for(cpu.physical_cores or cpu.logical_cpus or 1, len(nodes), 2)


def test_the_agent_narrows_its_mask_to_the_jobs_cpus():
    mine = sorted(os.sched_getaffinity(0))
    code = ("import os, json; from ktdeploy.agent.job_cpus import pin_to_job, threads_here; a = pin_to_job(); "
            "print(json.dumps([a and a.source, sorted(os.sched_getaffinity(0)), threads_here(0)]))")
    one = str(mine[-1])
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO), "SLURM_JOB_ID": "5", "KTDEPLOY_CPUSET": one})
    source, cpus, threads = json.loads(run.stdout)
    assert (source, cpus, threads) == ("job_cgroup", [int(one)], [1, 1]), run.stderr
    outside = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                             env={k: v for k, v in {**os.environ, "PYTHONPATH": str(REPO)}.items()
                                  if k not in ("SLURM_JOB_ID", "KTDEPLOY_CPUSET")})
    assert json.loads(outside.stdout)[:2] == [None, mine]      # no job: the mask stays as it was


def tiny(*sets):
    return load_recipe(REPO / "recipes" / "tiny-moe-lora.yaml", ["deploy.scheduler.cpus=4", *sets])


def test_warning_time_comes_from_the_step_time():
    assert warn_seconds(900, 90) == 2 * 900 + 2 * 90 + 60 and warn_seconds(0.3, 0.1) == 120
    measured = signal_plan(tiny("deploy.scheduler.step_seconds=300"))
    assert "measured step time 300 s" in measured.basis and measured.seconds == warn_seconds(300, measured.save_s or 0)
    planned = signal_plan(load_recipe(REPO / "recipes" / "qwen3-235b-int8-lora.yaml", ["deploy.scheduler.cpus=60"]))
    assert "planner's step time" in planned.basis and planned.seconds > 600 and planned.step_s and planned.save_s
    assert signal_plan(tiny("deploy.scheduler.signal_seconds=900")).seconds == 900


def test_a_time_limit_shorter_than_the_warning_is_refused_naming_the_key():
    assert slurm_time_seconds("30") == 1800 and slurm_time_seconds("1-02:03:04") == 93784
    assert slurm_time_seconds("02:00:00") == 7200 and slurm_time_seconds("5:30") == 330 and slurm_time_seconds("2-3") == 183600
    r = tiny("deploy.scheduler.time=00:01:30")
    with pytest.raises(RecipeError) as e:
        require_room(r, signal_plan(r))
    assert e.value.key == "deploy.scheduler.time" and "120 s" in e.value.message and e.value.fix
    require_room(tiny("deploy.scheduler.time=00:05:00"), signal_plan(tiny()))
