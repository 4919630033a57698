"""Ansible filters over ktdeploy.core.sched.slurm: a host's slurm.conf node line from its doctor report (features
from the proven CPU checks, RealMemory, CPUs, GPUs as gres, AMX nodes weighing more) and the cluster's slurm.conf
from every node's line. Imported when first called (see ktdeploy_settings.py for why)."""

from __future__ import annotations

import functools
import json

from ansible.errors import AnsibleFilterError


@functools.cache
def _slurm():
    try:
        from ktdeploy.core.facts.host import HostFacts
        from ktdeploy.core.sched import slurm
    except ImportError as e:  # pragma: no cover - controller without ktdeploy
        raise AnsibleFilterError(f"ktdeploy is not importable on the controller ({e})") from None
    return slurm, HostFacts


def ktdeploy_slurm_node(report, name, gpus=None) -> dict:
    """doctor's JSON report (preflight_report) -> {line, gres, features, weight} of the node ``name``."""
    slurm, HostFacts = _slurm()
    try:
        data = json.loads(json.dumps(report, default=str))
        facts = HostFacts.model_validate(data.get("facts", data))
        node = slurm.node_from_facts(str(name), facts, gpus=None if gpus is None else int(gpus))
    except Exception as e:
        raise AnsibleFilterError(f"ktdeploy slurm node {name}: {e}") from None
    return {"line": node.conf_line(), "gres": node.gres_line() or "", "features": list(node.features),
            "weight": node.weight}


def ktdeploy_slurm_conf(lines, cluster, controller, partition="main") -> str:
    """slurm.conf (ktdeploy's settings + the given NodeName lines + one partition)."""
    slurm, _ = _slurm()
    text = slurm.slurm_conf(str(cluster), str(controller), [], partition=str(partition))
    head, _, tail = text.rpartition("PartitionName=")
    return head + "".join(f"{line}\n" for line in lines) + "PartitionName=" + tail


def ktdeploy_cgroup_conf(_=None) -> str:
    """cgroup.conf: every job fenced to its cores, memory and GPUs (what slurm.cgroup checks)."""
    slurm, _ = _slurm()
    return slurm.cgroup_conf()


class FilterModule:
    def filters(self):
        return {"ktdeploy_slurm_node": ktdeploy_slurm_node, "ktdeploy_slurm_conf": ktdeploy_slurm_conf,
                "ktdeploy_cgroup_conf": ktdeploy_cgroup_conf}
