"""What the checkout says about itself is true: the license pyproject names is the one in
LICENSE (with a NOTICE), and no page says verify runs in the agent's container."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SECTIONS = (
    "1. Definitions.",
    "2. Grant of Copyright License.",
    "3. Grant of Patent License.",
    "4. Redistribution.",
    "5. Submission of Contributions.",
    "6. Trademarks.",
    "7. Disclaimer of Warranty.",
    "8. Limitation of Liability.",
    "9. Accepting Warranty or Additional Liability.",
)


def test_the_license_is_the_full_apache_2_text_pyproject_names() -> None:
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert meta["license"] == {"text": "Apache-2.0"}
    text = (REPO / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert all(section in text for section in SECTIONS)
    assert "END OF TERMS AND CONDITIONS" in text
    assert "APPENDIX: How to apply the Apache License to your work." in text
    notice = (REPO / "NOTICE").read_text()
    assert notice.startswith("kagura-agent\nCopyright ") and "LICENSE" in notice


# Verify runs in a fresh container from the same image and mounts, with no network and
# no credentials, after the agent's container is stopped (apply/run/verify.py).
STALE = re.compile(
    r"verify\W+(runs|is run|executes)\W+(inside|in)\W+(the\W+)?(run's|agent's|same)\W+container",
    re.I,
)


def test_no_page_says_verify_runs_in_the_agents_container() -> None:
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    said = [
        f"{page.relative_to(REPO)}: {match.group(0)}"
        for page in pages
        for match in STALE.finditer(page.read_text())
    ]
    assert said == []
    architecture = (REPO / "docs" / "architecture.md").read_text()
    assert "**Verify runs in a fresh container, never the agent's.**" in architecture
