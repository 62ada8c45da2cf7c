"""``policy test`` results as people read them (text), as scripts read them (json/yaml) and as CI
systems read them (JUnit XML: one testsuite per case file, one testcase per case)."""
from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import asdict
from pathlib import PurePath

from .cases import CaseResult

INDENT = " " * 6


def _came_back(result: CaseResult) -> list[str]:
    """A failed case's failures, then what the decision was, so the two can be read side by side."""
    got = result.got.lines() if result.got else []
    return result.failures + (["came back:"] + [f"  {line}" for line in got] if got else [])


def text(results: list[CaseResult]) -> str:
    lines = []
    for result in results:
        lines.append(f"{'PASS' if result.passed else 'FAIL'}  {result.name}  ({result.source})")
        if not result.passed:
            lines += [INDENT + line for line in _came_back(result)]
    failed = sum(not r.passed for r in results)
    lines.append(f"{len(results) - failed} passed, {failed} failed")
    return "\n".join(lines)


def as_json(results: list[CaseResult]) -> dict:
    failed = sum(not r.passed for r in results)
    return {"results": [asdict(r) for r in results], "passed": len(results) - failed, "failed": failed}


CSV_COLUMNS = ("source", "name", "result", "failures")


def csv_rows(results: list[CaseResult]) -> list[list[str]]:
    """One row per case (``-o csv``), its failures joined by " | " (the CLI escapes and writes them)."""
    return [[r.source, r.name, "pass" if r.passed else "fail", " | ".join(r.failures)] for r in results]


def junit(results: list[CaseResult]) -> str:
    """JUnit XML (the Jenkins/GitLab/GitHub reporters' dialect); a failure's message holds what was
    expected and what came back, its text the whole decision."""
    failed = sum(not r.passed for r in results)
    root = ET.Element("testsuites", name="trainjob-admission policy test", tests=str(len(results)),
                      failures=str(failed), errors="0")
    suites: dict[str, ET.Element] = {}
    for result in results:
        suite = suites.get(result.source)
        if suite is None:
            suite = suites[result.source] = ET.SubElement(root, "testsuite", name=result.source, tests="0",
                                                          failures="0", errors="0")
        suite.set("tests", str(int(suite.get("tests", "0")) + 1))
        case = ET.SubElement(suite, "testcase", name=result.name,
                             classname=str(PurePath(result.source).with_suffix("")).replace(".", "_"))
        if not result.passed:
            suite.set("failures", str(int(suite.get("failures", "0")) + 1))
            got = result.got.decision if result.got else "nothing"
            failure = ET.SubElement(case, "failure", type="CaseFailed",
                                    message=f"{'; '.join(result.failures)} (came back: {got})")
            failure.text = "\n".join(_came_back(result))
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True)
