"""The read-only model volume on the host: symlinks that join the output and the model are found by doctor's path
facts (readlink -f of each path's nearest existing parent), on this machine through the local connector."""

from __future__ import annotations

from types import SimpleNamespace

from ktdeploy.controller.connectors import LocalConnector
from ktdeploy.controller.facts_gather import gather_facts
from ktdeploy.core.checks.resources import path_checks
from ktdeploy.core.facts.disk import parse_paths, real_path


def _recipe(model: str, data: str, output: str):
    vol = SimpleNamespace(model=model, data=data, output=output)
    return SimpleNamespace(deploy=SimpleNamespace(volumes=vol), train={"model_name_or_path": model + "/m",
                                                                       "output_dir": output + "/run"})


def _req():
    return SimpleNamespace(output_disk_bytes=0, basis={})


def test_real_path_appends_the_missing_tail():
    assert real_path("/a/link/x/y", "/a/link", "/srv/models") == "/srv/models/x/y"
    assert real_path("//a/./b/", "/a/b", "/real") == "/real"


def test_old_recorded_path_lines_still_parse():
    (pf,) = parse_paths("@@KTD-PATH\t/srv/models\tno\tno\tyes\t/srv\n")
    assert pf.real is None and pf.checked == "/srv"


def test_symlinked_output_inside_the_model_fails_doctor(tmp_path):
    models = tmp_path / "models"
    (models / "out").mkdir(parents=True)
    (tmp_path / "data").mkdir()
    (tmp_path / "output").symlink_to(models / "out")  # looks separate in the recipe, is inside the model
    r = _recipe(str(models), str(tmp_path / "data"), str(tmp_path / "output"))
    facts = gather_facts(LocalConnector(), [str(models), str(tmp_path / "data"), str(tmp_path / "output")],
                         probes=False)
    failed = [c for c in path_checks(facts, r, _req()) if c.status == "fail"]
    assert [c.name for c in failed] == ["path.model_readonly"]


def test_separate_real_folders_pass(tmp_path):
    for d in ("models", "data", "output"):
        (tmp_path / d).mkdir()
    r = _recipe(str(tmp_path / "models"), str(tmp_path / "data"), str(tmp_path / "output"))
    facts = gather_facts(LocalConnector(), [str(tmp_path / d) for d in ("models", "data", "output")], probes=False)
    assert not [c for c in path_checks(facts, r, _req()) if c.status == "fail"]
