"""The plan as text a person can read and copy (pure)."""

from __future__ import annotations

import shlex

from ktdeploy.core.plan.steps import Plan

MARK = {"done": "✓", "todo": "→", "fail": "✗", "skip": "-"}


def plan_text(plan: Plan, *, run_dir: str | None = None) -> str:
    lines = [f"ktdeploy up plan — host {plan.host}, recipe {plan.recipe}",
             f"  job container : {plan.job}",
             f"  image         : {plan.image}" + (f" (variant {plan.variant})" if plan.variant else ""),
             f"  output dir    : {plan.output_dir}",
             f"  adapter dir   : {plan.adapter_dir}",
             f"  job folder    : {plan.job_dir} (on the host)"]
    if plan.resume_from:
        lines.append(f"  resume from   : {plan.resume_from}")
    if plan.waived:
        lines.append(f"  WAIVED CHECKS : {', '.join(plan.waived)}")
    if plan.rendered:
        lines.append("  rendered      : " + "\n                  ".join(f"{v}" for _, v in sorted(plan.rendered.items())))
    if run_dir:
        lines.append(f"  run record    : {run_dir}")
    for note in plan.notes:
        lines.append(f"  note: {note}")
    for i, st in enumerate(plan.stages, 1):
        lines.append("")
        lines.append(f"[{i}/{len(plan.stages)}] {st.name}: {st.title}" + (f" — skipped ({st.skipped})" if st.skipped else ""))
        for s in st.steps:
            if s.satisfied:
                mark = MARK["done"]
            elif s.action == "fail" and not s.probe:
                mark = MARK["fail"]
            else:
                mark = MARK["todo"]
            head = f"  {mark} {s.title}"
            if s.satisfied and s.why:
                head += f"  [already satisfied: {s.why}]"
            elif s.action == "fail" and not s.probe:
                head += f"  [WILL STOP HERE: {s.why}]"
            elif s.why and s.action != "fail":
                head += f"  ({s.why})"
            lines.append(head)
            if s.satisfied:
                continue
            if s.argv and len(s.argv) >= 3 and s.argv[:2] == ("sh", "-c") and "\n" in s.argv[2]:
                # a fixed script shipped with ktdeploy: shown as a block, its arguments after it
                lines.append("      $ sh -c SCRIPT" + "".join(" " + shlex.quote(a) for a in s.argv[3:]))
                lines.extend(f"      | {ln}" for ln in s.argv[2].strip().splitlines())
            elif s.argv:
                lines.append(f"      $ {s.command()}")
            elif s.action == "put":
                lines.append(f"      upload {s.local} -> {s.remote}")
            elif s.action == "fetch":
                lines.append(f"      fetch {s.remote} -> <run record>/{s.local}" + (" (if present)" if s.optional else ""))
            if s.action == "fail" and s.probe:
                lines.append(f"      check: {' '.join(shlex.quote(a) for a in s.probe)}  (else stop: {s.why})")
            elif s.probe and s.action in ("run", "put"):
                lines.append(f"      skip when: {' '.join(shlex.quote(a) for a in s.probe)}")
    stop = plan.stop()
    lines.append("")
    if stop:
        lines.append(f"This plan stops at {stop[0].name}: {stop[1].why}")
        if stop[1].fix:
            lines.append(f"  fix: {stop[1].fix}")
    return "\n".join(lines) + "\n"
