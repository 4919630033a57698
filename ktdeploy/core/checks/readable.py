"""facts.readable: a section the host printed in a shape no parser expected (core/facts/total.py) is named, so a
check that reads "unknown" is explained instead of silently passing or skipping."""

from __future__ import annotations

from ktdeploy.core.check_names import CheckName
from ktdeploy.core.check_result import CheckResult
from ktdeploy.core.facts.host import HostFacts
from ktdeploy.core.facts.total import unreadable


def readable_checks(facts: HostFacts) -> list[CheckResult]:
    bad = unreadable(facts.errors)
    if not bad:
        return []
    detail = "; ".join(f"{k}: {v}" for k, v in sorted(bad.items()))[:600]
    return [CheckResult(name=CheckName.FACTS_READABLE, status="warn", layer=facts.layer,
                        detail=f"host output ktdeploy could not read (those facts are unknown): {detail}",
                        fix="Run the named command on the host by hand; a wrapper or an unusual version may print "
                            "another format. The checks that need those facts treat them as unknown.")]
