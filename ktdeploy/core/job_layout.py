"""Every path ktdeploy derives from a training run's ``output_dir``: one value, ``JobLayout(output_dir)``.

* the served artefacts are *siblings* of the training output (core/adapter_layout.py says why): the converted
  adapter ``<output_dir>-sglang``, the merged model ``<output_dir>-merged`` and the training data less its held-out
  rows ``<output_dir>-holdout`` (deploy.eval.holdout);
* the trainer works beside it, in ``<dirname>/.ktdeploy-runs`` (one folder per output root: CUDA's JIT cache is
  keyed by the working directory, issue 18), which also holds ``ktdeploy train``'s run records of this output
  (``.ktdeploy-runs/<basename>``) and the CUDA JIT cache (``.ktdeploy-runs/.cuda-cache``);
* LlamaFactory's own progress log is ``<output_dir>/trainer_log.jsonl``.

Pure: paths only (POSIX, the host's), no I/O.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from ktdeploy.core.checkpoints import TRAINER_LOG

ADAPTER_SUFFIX = "-sglang"
MERGED_SUFFIX = "-merged"
HOLDOUT_DIR_SUFFIX = "-holdout"
RUNS_DIRNAME = ".ktdeploy-runs"
CUDA_CACHE_DIRNAME = ".cuda-cache"


@dataclass(frozen=True)
class JobLayout:
    output_dir: str

    @property
    def _norm(self) -> str:
        return posixpath.normpath(str(self.output_dir))

    def _sibling(self, suffix: str) -> str:
        out = self._norm
        if out in ("/", "."):
            raise ValueError(f"output_dir {self.output_dir!r} has no sibling directory")
        return out + suffix

    @property
    def adapter_dir(self) -> str:
        """The converted adapter `up` plans and `convert` suggests: the sibling ``<output_dir>-sglang``."""
        return self._sibling(ADAPTER_SUFFIX)

    @property
    def merged_dir(self) -> str:
        """Where `up` (deploy.serve.merge) writes the merged model: the sibling ``<output_dir>-merged``."""
        return self._sibling(MERGED_SUFFIX)

    @property
    def holdout_dir(self) -> str:
        """Where `train` writes the training data less the held-out rows (deploy.eval.holdout) and those rows: the
        sibling ``<output_dir>-holdout`` (LlamaFactory refuses a non-empty output dir)."""
        return self._sibling(HOLDOUT_DIR_SUFFIX)

    @property
    def trainer_workdir(self) -> str:
        """The working directory of every trainer writing beside ``output_dir``: ``<dirname>/.ktdeploy-runs``, the
        same for every run into that output root. Not the run's own record folder: kernels compiled at run time
        (inside torch's attention, at each new sequence length) go through CUDA's JIT cache under a key that changes
        with the working directory, so a fresh directory per run compiled them again at every run (8 kernels, a
        1-2 s stalled step; issue 18, bench/results/p1/)."""
        return posixpath.join(posixpath.dirname(self._norm), RUNS_DIRNAME)

    @property
    def agent_runs(self) -> str:
        """Where ``ktdeploy train`` keeps the records of runs into ``output_dir`` (outside it: LlamaFactory refuses a
        non-empty output dir it did not write)."""
        return posixpath.join(self.trainer_workdir, posixpath.basename(self._norm))

    @property
    def cuda_jit_cache(self) -> str:
        """CUDA_CACHE_PATH for the trainer when the environment sets none: in the trainer's working directory, on the
        output volume, so the kernels compiled at run time outlive a ``docker run --rm`` container (the default,
        ``~/.nv/ComputeCache``, is lost with it)."""
        return posixpath.join(self.trainer_workdir, CUDA_CACHE_DIRNAME)

    @property
    def stop_request(self) -> str:
        """Written to ask the trainer to save a checkpoint at its next step boundary and stop (the Slurm batch
        script's USR1 trap before the time limit, the Kubernetes pod's TERM trap); beside the run records, never in
        the output dir (LlamaFactory refuses a non-empty one). Any file there is a request: whoever starts a trainer
        removes an old one first."""
        return posixpath.join(self.agent_runs, "stop-request")

    @property
    def stopped_marker(self) -> str:
        """The trainer's answer to ``stop_request``: JSON naming the step and the checkpoint it saved before it
        stopped (its presence is what makes the batch script requeue the job)."""
        return posixpath.join(self.agent_runs, "stopped.json")

    @property
    def trainer_log(self) -> str:
        """LlamaFactory's trainer_log.jsonl (what `up` follows), spelled as ``output_dir`` is given."""
        return f"{self.output_dir}/{TRAINER_LOG}"
