"""The ktsft image's entrypoint: `docker run ktsft:<isa> doctor|check|render|train|convert|serve …`.

Before anything that runs kt-kernel, it checks that this CPU can run the image's ISA variant
($KTSFT_VARIANT, set by the Dockerfile's final stage, which also pins KT_KERNEL_CPU_VARIANT).
kt-kernel trusts that pin and would die with "Illegal instruction" deep inside training, so a
mismatch is refused up front, naming the variant this CPU can run. Then the arguments go to the
ktdeploy CLI unchanged: the image's agent and the controller share one code path.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from ktdeploy.core.terminal_text import esc

if TYPE_CHECKING:
    from ktdeploy.core.check_result import CheckResult

# Pure recipe work, the merge (numpy only) and tiny-model (torch: random weights, transformers' own FP8 quantizer)
# never touch kt-kernel: they run on any CPU, whatever the variant.
NO_ISA_COMMANDS = {"check", "render", "merge", "tiny-model", "--help", "-h", "help", "--version"}


def isa_gate(variant: str | None, argv: list[str]) -> CheckResult | None:
    """The CheckResult that refuses or admits this run, or None when no check applies."""
    if not variant or (argv and argv[0] in NO_ISA_COMMANDS):
        return None
    from ktdeploy.controller.local_host import local_facts
    from ktdeploy.core.checks.isa import variant_check

    # The probe (a tile multiply, one instruction per AVX512 extension) proves what the pinned build needs; the
    # facts are gathered once for the process: the command that follows (train's doctor, serve, tune) reuses them.
    facts = local_facts(probes=True)
    return variant_check(facts, variant)


def pin_job_cpus(argv: list[str]) -> None:
    """A trainer in a scheduler's job runs on the job's CPUs (agent/job_cpus.py): the mask is narrowed before the
    ISA gate gathers the facts that train's doctor reuses, so the derived threads are the job's cores."""
    if not argv or argv[0] not in ("train", "tune"):
        return
    from ktdeploy.agent.job_cpus import pin_to_job
    from ktdeploy.cli.output import err_console

    pinned = pin_to_job()
    if pinned is not None:
        err_console.print(f"ktdeploy: the job's CPUs {pinned.text} ({pinned.source}): this process and everything "
                          "it starts run there", markup=False, highlight=False)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv) or ["doctor"]
    variant = os.environ.get("KTSFT_VARIANT") or None

    from ktdeploy.cli import handle
    from ktdeploy.cli import main as cli_main

    try:  # the ISA check gathers this host's facts (a second or more): Ctrl-C there is one line and exit 130
        from ktdeploy.cli.output import err_console, print_error
        from ktdeploy.core import variants as V
        from ktdeploy.core.errors import CheckFailed

        pin_job_cpus(argv)
        result = isa_gate(variant, argv)
        if result is not None and result.status == "fail":
            print_error(CheckFailed(
                f"this CPU cannot run the {V.image(str(variant))} image: {result.detail}",
                fix=result.fix, key=result.name, results=[result]))
            sys.exit(CheckFailed.exit_code)
        if result is not None and result.status == "warn":
            err_console.print(f"[yellow]note:[/yellow] {esc(result.detail)}. {esc(result.fix)}", highlight=False)
    except SystemExit:
        raise
    except BaseException as err:  # noqa: BLE001 - mapped by the CLI's one mapping, as every other error
        handle(err)
    cli_main(argv)


if __name__ == "__main__":
    main()
