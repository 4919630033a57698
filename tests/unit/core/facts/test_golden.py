"""Every golden folder: parsing its recorded raw outputs gives exactly its facts.json."""

import pytest

from tests.unit.core.facts.golden import GOLDEN, expected, facts_of, folders


@pytest.mark.parametrize("folder", folders(), ids=lambda p: p.name)
def test_raw_outputs_parse_to_recorded_facts(folder):
    got = facts_of(folder.name).model_dump(mode="json")
    assert got == expected(folder.name)


def test_every_golden_folder_documents_its_source():
    for p in GOLDEN.iterdir():
        if p.is_dir() and p.name != "tools":
            assert (p / "SOURCE.md").exists() or p.name == "cpu-generations", f"{p.name} lacks SOURCE.md"
            assert (p / "facts.json").exists() or p.name in ("gpu-h200-vm", "cpu-generations"), f"{p.name} lacks facts.json"
