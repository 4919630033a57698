"""The image entrypoint's ISA gate, run against this machine's real CPU facts."""

from __future__ import annotations

from pathlib import Path

import pytest

from ktdeploy.cli import image_entry as entry
from ktdeploy.core import variants as V
from ktdeploy.core.checks.isa import best_variant
from ktdeploy.core.facts.cpu import build_cpu

ORDER = {v.name: v.level for v in V.LADDER}


def host_best() -> str:
    return best_variant(build_cpu(Path("/proc/cpuinfo").read_text()))


@pytest.mark.parametrize("argv", [["check", "r.yaml"], ["render", "r.yaml", "-o", "x"], ["--help"],
                                  ["tiny-model", "/tmp/m", "--format", "fp8"]])
def test_pure_commands_skip_the_gate(argv):
    assert entry.isa_gate("amx", argv) is None


def test_no_variant_no_gate():
    assert entry.isa_gate(None, ["doctor"]) is None


def test_gate_admits_the_matching_variant_and_refuses_the_one_above():
    best = host_best()
    assert entry.isa_gate(best, ["doctor"]).status == "pass"
    above = [v for v in ORDER if ORDER[v] > ORDER[best]]
    for v in above:
        res = entry.isa_gate(v, ["train", "r.yaml"])
        assert res.status == "fail" and f"ktsft:{best}" in res.fix


def test_refusal_exits_1_with_one_screen_naming_the_variant(monkeypatch, capsys):
    best = host_best()
    above = [v for v in ORDER if ORDER[v] > ORDER[best]]
    if not above:
        pytest.skip("this CPU runs every variant")
    monkeypatch.setenv("KTSFT_VARIANT", above[-1])
    with pytest.raises(SystemExit) as ex:
        entry.main(["doctor"])
    assert ex.value.code == 1
    err = " ".join(capsys.readouterr().err.split())
    assert f"cannot run the ktsft:{above[-1]} image" in err and f"ktsft:{best}" in err
