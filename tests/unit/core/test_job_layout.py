"""JobLayout(output_dir): every path derived from a training output, held to what the seven functions that
derived them before (adapter_dir_for, merged_dir_for, trainer_workdir, agent_runs_base, cuda_jit_cache and the
trainer_log joins of the docker and Slurm plans) returned, spelled out."""

import pytest

from ktdeploy.core.job_layout import JobLayout

CASES = {  # output_dir: (adapter, merged, trainer workdir, agent runs, CUDA JIT cache, trainer log)
    "/vol/out/run-a": ("/vol/out/run-a-sglang", "/vol/out/run-a-merged", "/vol/out/.ktdeploy-runs",
                       "/vol/out/.ktdeploy-runs/run-a", "/vol/out/.ktdeploy-runs/.cuda-cache",
                       "/vol/out/run-a/trainer_log.jsonl"),
    "/vol/out//run-b/": ("/vol/out/run-b-sglang", "/vol/out/run-b-merged", "/vol/out/.ktdeploy-runs",
                         "/vol/out/.ktdeploy-runs/run-b", "/vol/out/.ktdeploy-runs/.cuda-cache",
                         "/vol/out//run-b//trainer_log.jsonl"),
    "rel/out": ("rel/out-sglang", "rel/out-merged", "rel/.ktdeploy-runs", "rel/.ktdeploy-runs/out",
                "rel/.ktdeploy-runs/.cuda-cache", "rel/out/trainer_log.jsonl"),
    "/out": ("/out-sglang", "/out-merged", "/.ktdeploy-runs", "/.ktdeploy-runs/out", "/.ktdeploy-runs/.cuda-cache",
             "/out/trainer_log.jsonl"),
    "out": ("out-sglang", "out-merged", ".ktdeploy-runs", ".ktdeploy-runs/out", ".ktdeploy-runs/.cuda-cache",
            "out/trainer_log.jsonl"),
}


@pytest.mark.parametrize("output_dir", CASES)
def test_every_derived_path_is_what_it_was(output_dir):
    j = JobLayout(output_dir)
    assert (j.adapter_dir, j.merged_dir, j.trainer_workdir, j.agent_runs, j.cuda_jit_cache,
            j.trainer_log) == CASES[output_dir]


@pytest.mark.parametrize("output_dir", ["/", ".", "./"])
def test_a_root_output_has_no_sibling(output_dir):
    for sibling in ("adapter_dir", "merged_dir"):
        with pytest.raises(ValueError, match="has no sibling directory"):
            getattr(JobLayout(output_dir), sibling)


def test_runs_into_one_output_root_share_the_trainer_workdir_and_the_cache():
    a, b = JobLayout("/vol/out/run-a"), JobLayout("/vol/out//run-b/")
    assert a.trainer_workdir == b.trainer_workdir != JobLayout("/vol/other/run-a").trainer_workdir
    assert a.cuda_jit_cache == b.cuda_jit_cache and a.agent_runs != b.agent_runs
