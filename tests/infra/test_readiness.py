"""One test per check doctor reports: the host is ready when none fails (warnings are printed, skips skip)."""

from __future__ import annotations

import pytest


def test_check(report, waived, check_name):
    results = [c for c in report["checks"] if c["name"] == check_name]
    if not results:
        pytest.skip(f"{check_name}: not reported on this host")
    for r in results:
        if r["status"] == "skip":
            pytest.skip(f"{check_name}: {r['detail']}")
        if r["status"] == "fail":
            msg = f"{check_name} [{r.get('layer')}]: {r['detail']}" + (f" — fix: {r['fix']}" if r.get("fix") else "")
            if check_name in waived:
                pytest.xfail("waived: " + msg)
            pytest.fail(msg, pytrace=False)
        if r["status"] == "warn":
            print(f"warn {check_name}: {r['detail']}" + (f" — fix: {r['fix']}" if r.get("fix") else ""))


def test_report_agrees_with_doctor(report, waived):
    """doctor's own verdict (its 'failed' list, waivers applied) is what the per-check tests add up to."""
    failing = sorted({c["name"] for c in report["checks"] if c["status"] == "fail"} - waived)
    assert sorted(set(report.get("failed", failing))) == failing
