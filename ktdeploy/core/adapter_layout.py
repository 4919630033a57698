"""Where the served artefact of a training run lives: one rule shared by `ktdeploy up`'s plan and `ktdeploy convert`.

* A LoRA run (``finetuning_type: lora``) is converted into a *sibling* of the training output,
  ``<output_dir>-sglang``: never inside the training output (KT's output is the record of a multi-hour run and
  `convert` refuses to write into it), never over an existing adapter.
* With ``deploy.serve.merge`` a LoRA run is also merged into the base (`ktdeploy merge`) into the sibling
  ``<output_dir>-merged``, served as a plain model.
* A full fine-tune (``finetuning_type: full``) has no adapter: sglang-kt serves the trained weights in
  ``output_dir`` themselves, so there is nothing to convert.

The paths themselves are core/job_layout.py's (JobLayout); here the rules on them. Pure functions of paths and
the recipe; no I/O.
"""

from __future__ import annotations

import posixpath


def destination_problem(src: str, dst: str) -> str | None:
    """Why ``dst`` may not receive the adapter converted from training output ``src`` (None when it may).

    Both are absolute, normalised paths. ``dst`` must lie outside ``src`` and must not contain it."""
    s, d = posixpath.normpath(str(src)), posixpath.normpath(str(dst))
    if d == s or d.startswith(s.rstrip("/") + "/") or s.startswith(d.rstrip("/") + "/"):
        return f"output {d} must lie outside the training output {s}"
    return None
