"""The login node's probe (core/sched/cluster.py): the real probe script run under sh with stand-ins for srun and
the runtimes, `scontrol show config` recorded from the integration tier's cluster; which runtime `auto` takes, and
what slurm.runtime / slurm.cgroup say (the fix named)."""

from __future__ import annotations

import pytest

from ktdeploy.core.sched.cluster import cgroup_check, choose_runtime, parse_probe, runtime_check
from ktdeploy.core.sched.slurm import cgroup_conf
from tests.fakes.slurm_probe import probe_answer, recorded_config


@pytest.mark.parametrize("have,requested,chosen,status", [
    (("podman",), "auto", "podman", "pass"),
    (("pyxis", "apptainer", "podman"), "auto", "pyxis", "pass"),
    (("apptainer", "podman"), "auto", "apptainer", "pass"),
    (("docker",), "auto", None, "fail"),             # docker is never auto's choice
    (("docker",), "docker", "docker", "warn"),
    (("podman",), "pyxis", "pyxis", "fail"),
    ((), "podman", "podman", "fail"),
])
def test_runtime_choice_and_check(tmp_path, have, requested, chosen, status):
    facts = parse_probe(probe_answer(tmp_path, have))
    assert facts.complete and set(facts.runtimes) == set(have)
    assert choose_runtime(requested, facts) == chosen
    check = runtime_check(requested, facts)
    assert check.status == status, check
    if status == "fail":
        assert check.fix and ("install" in check.fix.lower() or "Install" in check.fix)
    if requested == "pyxis" and "podman" in have:
        assert "deploy.scheduler.runtime: podman" in check.fix
    if chosen == "docker":
        assert "docker group" in check.detail and "podman" in check.fix


def test_cgroup_check_reads_the_recorded_config(tmp_path):
    facts = parse_probe(probe_answer(tmp_path))
    assert facts.config["ProctrackType"] == "proctrack/cgroup" and facts.config["ConstrainCores"] == "yes"
    for line in cgroup_conf().split():     # the cluster ran with ktdeploy's cgroup.conf (ansible writes the same)
        key, value = line.split("=")
        assert facts.config[key] == value, key
    ok = cgroup_check(facts, "podman", gpus=1)
    assert ok.status == "pass" and "ConstrainDevices" in ok.detail
    # the same cluster without cgroup.conf's section and with the old plugins: every gap named
    text = recorded_config()
    text = text[:text.index("Cgroup Support Configuration:")]
    text = text.replace("proctrack/cgroup", "proctrack/linuxproc").replace("task/cgroup,task/affinity", "task/none")
    bare = parse_probe(probe_answer(tmp_path, config=text))
    warn = cgroup_check(bare, "podman", gpus=1)
    assert warn.status == "warn"
    for gap in ("ProctrackType=proctrack/cgroup", "TaskPlugin=task/cgroup", "ConstrainCores=yes", "ConstrainRAMSpace=yes",
                "ConstrainDevices=yes"):
        assert gap in warn.detail and gap.split("=")[0] in warn.fix, gap
    assert "other jobs' cores" in warn.detail
    assert cgroup_check(facts, "docker", gpus=1).status == "warn"
    assert cgroup_check(parse_probe(""), "podman", gpus=0).status == "skip"
