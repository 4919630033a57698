"""Issue 35, class 4: every parser of host text is total.

What a host prints back (`lscpu -J`, `docker info`, the probes' JSON line, the image's stack report) in shapes the
parsers did not expect crashed doctor with exit 70 (or 8, with a fix about file permissions, for JSON nested
3,000 deep). Now a section of an unexpected shape is reported unreadable in facts.errors (and the `facts.readable`
check), its facts stay unknown, and every check still runs. The pure parsers are fed the issue's inputs, inputs of
our own and hypothesis-generated JSON shapes; three inputs also go end to end through `ktdeploy doctor` with the
real gather script, the commands shimmed on PATH and the probes served from KTDEPLOY_PROBE_DIR."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ktdeploy.controller.doctor import DoctorReport, run_checks
from ktdeploy.controller.facts_gather import build_facts, load_raw
from ktdeploy.core.facts.sources import PROBE_SOURCES
from ktdeploy.core.facts.stack_probe import MARKER, parse_stack_output
from ktdeploy.core.markers import Section
from ktdeploy.core.recipe import load_recipe
from tests.unit.adversarial.harness import invoke, problems

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = ROOT / "tests" / "golden" / "avx512-kvm-container"
BIG = "9" * 5000            # past Python's 4,300-digit int limit: int() raises a plain ValueError
DEEP = "[" * 3000 + "]" * 3000

LSCPU = [
    '{"lscpu": [{"field": "CPU(s):", "data": "4", "children": 5}]}',          # the issue's
    '{"lscpu": [{"field": "CPU(s):", "data": ["4"]}]}',                       # the issue's: data as a list
    '{"lscpu": [{"field": "Flags:", "data": {"a": 1}}, {"field": 7, "data": null}]}',
    '{"lscpu": 5}', '[1, 2]', '"text"', 'null', DEEP, '{"lscpu": ' + DEEP + '}',
    '{"lscpu": [{"field": "CPU(s):", "data": ' + BIG + '}]}',
    '{"lscpu": [{"field": "CPU(s):", "data": "' + BIG + '"}]}',
    '{"lscpu": [{"field": "NUMA node0 CPU(s):", "data": "0-99999999999"}]}',   # a CPU list of 10^11 numbers
    '{"lscpu": [{"field": "NUMA node' + BIG + ' CPU(s):", "data": "0-3"}]}',
    '{"lscpu": [{"field": "NUMA node0 CPU(s):", "data": "3-1,x,-"}]}',
    '{"lscpu": [' + '{"field": "x", "children": [' * 400 + ']}' * 400 + ']}',
]
DOCKER = [
    '{"ServerVersion": "24.0", "Runtimes": ["runc", "nvidia"]}',              # the issue's: Runtimes as a list
    '{"ServerVersion": "24.0", "Runtimes": "nvidia"}', '{"ServerVersion": 24, "Runtimes": {"runc": 1}}',
    '{"ServerVersion": "24.0", "ServerErrors": {"x": 1}}', '{"ServerVersion": "24.0", "CgroupVersion": {"v": 2}}',
    '{"ServerVersion": "24.0", "SecurityOptions": "seccomp"}', '{"ServerVersion": ["x"]}',
    '{"ServerVersion": "24.0", "DefaultRuntime": ' + BIG + '}', '[1]', "{" + DEEP, '{"a": ' + DEEP + '}',
]
PROBE = [
    '{"ran": true, "tile_exec": true}',                                        # the issue's: a `ran` key
    '{"ran": false, "skipped": "x", "listed": true}', '{"skipped": 5}', '{"palettes": "many"}',
    '{"tile_exec": ' + BIG + '}', '{"palettes": ' + "9" * 4000 + '}', '[true]', '{' + DEEP, DEEP,
    '{"listed": {"a": [1, 2]}, "correct": [true]}', '{"permission_errno": 1e999}',
]
STACK = [
    MARKER + '{"torch": {"present": true, "version": 2.9}}',                  # the issue's: a number for a version
    MARKER + '{"torch": 5}', MARKER + '{"cuda": {"device_count": "two"}}', MARKER + '[1]', MARKER + DEEP,
    MARKER + '{"gpus_asked": ' + BIG + '}', MARKER + '{"triton": {"present": "yes please"}}',
]
CPUINFO = ["processor: 0\nphysical id: x\ncore id: 1\n", "processor: " + BIG + "\nflags: avx2\n",
           "processor\x00: 0\n\x1b]0;x\x07: 1\n"]


def _facts(**outputs: str):
    raw = load_raw(str(GOLDEN))
    for name, text in outputs.items():
        raw.sections[name] = Section(stdout=text, rc=0, stderr="")
    return build_facts(raw)


def _all_checks_run(facts) -> list:
    recipe = load_recipe(ROOT / "recipes" / "tiny-moe-lora.yaml")
    checks = run_checks(facts, recipe)
    json.dumps(DoctorReport(facts, checks).to_json(), default=str)  # the report serialises
    return checks


def _bounded(fn):
    t0, c0 = time.monotonic(), time.process_time()
    out = fn()
    # CPU time bounds the parse (a loaded CI machine stretches the wall clock); the wall bound catches a hang
    assert time.process_time() - c0 < 5 and time.monotonic() - t0 < 60
    return out


@pytest.mark.parametrize("text", LSCPU, ids=range(len(LSCPU)))
def test_lscpu_of_any_shape_is_a_section_not_a_crash(text):
    facts = _bounded(lambda: _facts(lscpu_json=text))
    assert facts.cpu.logical_cpus == _facts().cpu.logical_cpus   # /proc/cpuinfo's facts still stand
    _all_checks_run(facts)


@pytest.mark.parametrize("text", DOCKER, ids=range(len(DOCKER)))
def test_docker_info_of_any_shape_is_a_section_not_a_crash(text):
    facts = _bounded(lambda: _facts(docker_info=text))
    assert all(isinstance(r, str) for r in facts.docker.runtimes)
    _all_checks_run(facts)


def test_docker_runtimes_as_a_list_are_still_read():
    facts = _facts(docker_info=DOCKER[0])
    assert facts.docker.reachable and facts.docker.runtimes == ["nvidia", "runc"]


@pytest.mark.parametrize("text", PROBE, ids=range(len(PROBE)))
def test_a_probe_line_of_any_shape_is_unreadable_not_a_crash(text):
    for probe in PROBE_SOURCES:
        got = _bounded(lambda probe=probe: probe.read(text))
        assert got.ran is (got.skipped is None)           # the probe never decides `ran` or `skipped` itself
        if text.startswith('{"ran": false'):
            assert got.ran and got.skipped is None
    raw = load_raw(str(GOLDEN))
    raw.probes["amx_probe"] = text
    _all_checks_run(build_facts(raw))


@pytest.mark.parametrize("text", STACK, ids=range(len(STACK)))
def test_a_stack_report_of_any_shape_is_unreadable_not_a_crash(text):
    from ktdeploy.core.checks.stack import stack_checks

    facts = _bounded(lambda: parse_stack_output(text, 0, ""))
    assert not facts.ran and "unreadable" in (facts.error or "")
    assert any(c.status == "fail" for c in stack_checks(facts))


@pytest.mark.parametrize("text", CPUINFO, ids=range(len(CPUINFO)))
def test_cpuinfo_of_any_shape_is_reported_unreadable(text):
    facts = _bounded(lambda: _facts(cpuinfo=text, lscpu_json="", lscpu_parse=""))
    _all_checks_run(facts)


def test_an_unreadable_section_is_named_in_the_report():
    facts = _facts(lscpu_json=LSCPU[0], cpuinfo=CPUINFO[0])
    assert facts.errors.get("cpu", "").startswith("unreadable")
    checks = _all_checks_run(facts)
    readable = [c for c in checks if c.name == "facts.readable"]
    assert readable and readable[0].status == "warn" and "cpu" in readable[0].detail


json_values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(),
                                     st.text(max_size=6)),
                           lambda kids: st.one_of(st.lists(kids, max_size=3),
                                                  st.dictionaries(st.sampled_from(
                                                      ["lscpu", "field", "data", "children", "Runtimes",
                                                       "ServerVersion", "ServerErrors", "ran", "tile_exec",
                                                       "palettes", "torch", "version", "x"]), kids, max_size=4)),
                           max_leaves=12)


@settings(max_examples=int(os.environ.get("KTDEPLOY_ADV_EXAMPLES", 40)), deadline=None, derandomize=True,
          database=None, suppress_health_check=list(HealthCheck))
@given(lscpu=json_values, docker=json_values, probe=json_values, stack=json_values)
def test_generated_json_shapes_never_crash_the_parsers(lscpu, docker, probe, stack):
    raw = load_raw(str(GOLDEN))
    raw.sections["lscpu_json"] = Section(stdout=json.dumps(lscpu), rc=0, stderr="")
    raw.sections["docker_info"] = Section(stdout=json.dumps(docker), rc=0, stderr="")
    raw.probes["amx_probe"] = json.dumps(probe)
    _bounded(lambda: _all_checks_run(build_facts(raw)))
    parse_stack_output(MARKER + json.dumps(stack), 0, "")


# ---------------------------------------------------------------- end to end: `ktdeploy doctor` on this machine

def _shim(folder: Path, name: str, text: str) -> None:
    (folder / f"{name}.out").write_text(text)
    p = folder / name
    p.write_text(f'#!/bin/sh\ncat "{folder / (name + ".out")}"\n')
    p.chmod(0o755)


@pytest.mark.parametrize("command,text", [("lscpu", LSCPU[0]), ("docker", DOCKER[0]), ("lscpu", DEEP),
                                          ("amx_probe", PROBE[0])])
def test_doctor_end_to_end_never_exits_70_on_host_text(tmp_path, monkeypatch, command, text):
    bin_dir, probes = tmp_path / "bin", tmp_path / "probes"
    bin_dir.mkdir()
    probes.mkdir()
    target = probes if command.endswith("_probe") else bin_dir
    _shim(target, command, text)
    _shim(probes, "numa_probe", '{"ok": true}') if command != "numa_probe" else None
    if command != "amx_probe":
        _shim(probes, "amx_probe", '{"listed": false}')
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("KTDEPLOY_PROBE_DIR", str(probes))
    from ktdeploy.controller import local_host

    monkeypatch.setattr(local_host, "_RAW", {})   # this host's facts are gathered once per process: again here
    rc, out, secs = invoke(["doctor", "--json"], cwd=tmp_path)
    assert not problems(rc, out), (rc, out[-2000:])
    assert rc in (0, 1) and secs < 60
    report = json.loads(out[out.index("{"):])
    if command == "lscpu":
        assert report["facts"]["cpu"]["logical_cpus"]   # cpuinfo still read
        assert report["facts"]["errors"].get("lscpu_json", "").startswith("unreadable") or text == LSCPU[0]
    if command == "docker":
        assert report["facts"]["docker"]["runtimes"] == ["nvidia", "runc"]
    if command == "amx_probe":
        assert report["facts"]["probes"]["amx"]["tile_exec"] is True  # what it printed, read as data
        assert report["facts"]["probes"]["amx"]["ran"] is True and report["facts"]["probes"]["amx"]["skipped"] is None
