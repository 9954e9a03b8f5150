#!/usr/bin/env python3
"""Summarises a JUnit report of e2e.test: the counts of the tests the focus selected (passed,
failed, skipped while running), then every one that did not pass, with its reason. Tests the
focus or skip expressions left out are not counted."""
import sys
import xml.etree.ElementTree as ET

passed, failed, skipped = [], [], []
for path in sys.argv[1:]:
    for case in ET.parse(path).iter("testcase"):
        name = case.get("name", "").removeprefix("[It] ")
        if name.startswith(("[ReportBeforeSuite]", "[ReportAfterSuite]", "[SynchronizedBeforeSuite]", "[SynchronizedAfterSuite]")):
            continue  # the suite's own setup, not a test
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        skip = case.find("skipped")
        if failure is not None:
            reason = (failure.get("message") or "").strip() or (failure.text or "").strip()
            failed.append((name, reason.splitlines()[:1]))
        elif skip is not None:
            message = skip.get("message") or ""
            # "skipped" alone: left out by --ginkgo.focus / --ginkgo.skip, never started.
            if message.strip() != "skipped":
                skipped.append((name, [message.removeprefix("skipped - ").strip()]))
        else:
            passed.append(name)

conformance = sum("[Conformance]" in name for name in passed)
print(f"passed {len(passed)} ({conformance} [Conformance]), failed {len(failed)}, skipped while running {len(skipped)}")
for kind, cases in (("FAILED", failed), ("SKIPPED", skipped)):
    for name, reason in sorted(cases):
        print(f"{kind}  {name}\n        {' '.join(reason)}")
