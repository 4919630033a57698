"""PROBE 4 FINDINGS (outside review of `render --slurm` / `render --k8s` after round three). Written from the
renderers and from sbatch's source, not from probe 3's tests (test_batch_files_quote_values.py).

Every test named test_p4_escape_* failed on the code this probe reviewed (main at 2600041): each is one class of
escape, reproduced by one minimal value that `ktdeploy check` accepted. Fixed after the probe (the probe did not fix
code): hetjob/packjob in a value bound for an #SBATCH line is refused naming the key (core/sched/batch.sbatch_values),
and YAML's NEL/LS/PS line breaks are written escaped in double quotes (core/recipe/render.dump_yaml).

test_p4_generator_finds_no_escape runs the seeded generator (hostile_sbatch_gen.py: 1,000 hostile values over
every recipe key and CLI option that reaches the batch scripts or the manifests) and fails while any escape is left.

How sbatch reads a batch script (SchedMD/slurm src/sbatch/opt.c, ``_opt_batch_script`` and ``get_argument``; the
burst-buffer code's ``_hetjob_check`` shows both words): every line starting with ``#SBATCH`` whose text holds
``packjob`` or ``hetjob`` (``strcasestr``: any case, anywhere in the line, quoted or not) counts as a
heterogeneous-job separator: the options before it form component 0, the ones after it component 1, and
get_argument blanks the word inside the option. Quoting the token (``sbatch_line``'s shlex.quote) does not help.
"""

from __future__ import annotations

import base64
import re
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))
import hostile_sbatch_gen as gen  # noqa: E402

from ktdeploy.core.errors import KtdeployError  # noqa: E402


def _recipe(tmp_path: Path, stem: str = "tiny", **keys: object):
    from ktdeploy.core.recipe.document import load_recipe
    from ktdeploy.core.recipe.validate import require_valid

    doc = gen._base()
    for dotted, value in keys.items():
        gen._set(doc, dotted.replace("__", "."), value)
    p = tmp_path / f"{stem}.yaml"
    p.write_text(yaml.safe_dump(doc, allow_unicode=False))
    r = load_recipe(p)
    require_valid(r)   # `ktdeploy check` accepts it: the finding is about what is rendered from it
    return r


SPLITTING = [  # (what, recipe file stem, recipe keys): one hetjob/packjob per entry point into an #SBATCH line
    ("recipe file name -> --job-name and --output", "hetjob", {}),
    ("recipe file name, another case", "nightly-PackJob-run", {}),
    ("deploy.volumes.output -> --output", "tiny", {"deploy__volumes__output": "/srv/hetjob",
                                                   "train__output_dir": "/srv/hetjob/run"}),
    ("deploy.scheduler.partition -> --partition", "tiny", {"deploy__scheduler__partition": "hetjob"}),
    ("deploy.scheduler.account -> --account", "tiny", {"deploy__scheduler__account": "packjob"}),
]


def test_p4_escape_hetjob_word_in_a_directive_line_splits_the_job(tmp_path):
    """ESCAPE CLASS 1 (failed before the fix in core/sched/batch.sbatch_values, which refuses the word naming the key): a recipe value holding ``hetjob`` / ``packjob`` that check accepts lands in an
    ``#SBATCH`` line; sbatch reads that line as a heterogeneous-job separator, so the job ktdeploy submits is not
    the one it meant (minimal: a recipe file named ``hetjob.yaml`` -> ``#SBATCH --job-name=ktd-hetjob-…``: the
    options before it (none) are component 0, all the others component 1, and the job name loses the word).
    Expected: check refuses such a value naming the key (or the renderer never writes the word into a directive)."""
    from ktdeploy.core.sched.job_files import slurm_scripts

    escapes = []
    for what, stem, keys in SPLITTING:
        try:
            jobs = slurm_scripts(_recipe(tmp_path, stem, **keys), "avx2")
        except KtdeployError:
            continue   # refused with ktdeploy's own error: no escape
        for job in jobs:
            comps, problems = gen.sbatch_header(job.script)
            if len(comps) != 1:
                escapes.append(f"{what}: {job.role}.sbatch has {len(comps)} components: {problems[0]}")
    assert not escapes, "\n".join(escapes)


def test_p4_escape_nel_in_a_recipe_value_changes_the_recipe_the_container_runs(tmp_path):
    """ESCAPE CLASS 2 (failed before the fix in core/recipe/render.dump_yaml, which double-quotes such strings): U+0085 (NEL) in a recipe string that check accepts (train.run_name, any train key
    outside rules_text.TRAIN_PATHS, any accelerate value) is written by ``dump_yaml`` raw inside a single-quoted
    scalar; YAML readers (PyYAML and ktdeploy's own loader, which the container reads its recipe with) fold that
    line break to a space. The recipe shipped in the batch script (base64) and the ConfigMap's recipe.yaml are
    therefore not the recipe check accepted: 'a\\x85b' arrives as 'a b'.
    Expected: dump_yaml escapes it (double-quoted \\N), or check refuses it naming the key."""
    from ktdeploy.core.recipe.loader import parse_recipe_text
    from ktdeploy.core.sched.job_files import k8s_manifests, slurm_scripts

    value = "a\x85b"
    r = _recipe(tmp_path, train__run_name=value)
    train = next(j for j in slurm_scripts(r, "avx2") if j.role == "train")
    b64 = re.search(r"^echo '?([A-Za-z0-9+/=]+)'? \| base64 -d", train.script, re.M)
    assert b64 is not None
    shipped = parse_recipe_text(base64.b64decode(b64.group(1)).decode()).doc
    configmap = parse_recipe_text(k8s_manifests(r, "avx2")[0]["data"]["recipe.yaml"]).doc
    got = {"batch script's recipe": shipped["train"]["run_name"], "ConfigMap recipe.yaml": configmap["train"]["run_name"]}
    assert got == dict.fromkeys(got, value), f"checked {value!r}, shipped {got!r}"


def test_p4_the_oracles_see_a_planted_escape():
    """Control (passes): the independent sbatch reader finds a planted option and a planted split, and keeps a
    quoted blank, quote or # inside one option (so a passing generator run means something)."""
    comps, _ = gen.sbatch_header("#!/bin/bash\n#SBATCH '--output=/a b#c'\"'\"'d' # c\n#SBATCH --x\n\necho\n#SBATCH --late\n")
    assert comps == [["--output=/a b#c'd", "--x"]]
    comps, problems = gen.sbatch_header("#!/bin/bash\n#SBATCH --a\n#SBATCH --output=/srv/hetjob\n#SBATCH --b\n")
    assert len(comps) == 2 and problems
    assert gen.slurm_filename("/a%%b/train-%j.out") == f"/a%b/train-{gen.JOB_ID}.out"
    assert gen.slurm_filename("/a%xb/train-%j.out") != f"/a%xb/train-{gen.JOB_ID}.out"


def test_p4_generator_finds_no_escape():
    """Runs the seeded generator (1,000 values; all targets): fails while any escape class above is left. The
    counts are in the message (accepted by check / rendered / escapes by class, one example each)."""
    report = gen.run(1000, seed=4)
    assert report.generated >= 1000 and report.accepted >= 300 and report.rendered >= 300, report.summary()
    assert not report.escapes, report.summary()


@pytest.mark.parametrize("target,value", [("deploy.volumes.output", "a'b"), ("deploy.volumes.output", "a b#c"),
                                          ("deploy.volumes.output", "a%xb"), ("deploy.volumes.output", "a$(id)b"),
                                          ("train.output_dir", "a`id`b"), ("deploy.registry", "r e;g")])
def test_p4_quoting_still_holds_for_blanks_quotes_hash_percent_and_substitutions(target, value):
    """Control (passes): what round three fixed stays fixed: such values are one word to sbatch and to bash."""
    report = gen.run(1000, seed=4, only=lambda t, v: False)   # an empty run: the Report type
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        case = gen.Case(target=target, value=value, doc=gen._base())
        gen.TARGETS[target](case)
        gen.judge_case(case, report, Path(d))
    assert report.accepted == 1 and not report.escapes, report.summary()
