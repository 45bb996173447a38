"""Every relative link of the pages under docs/ names a file or folder that exists.

Docs/benchmarks.md linked to a BENCHMARKS.md beside it
(the file is at the repository root). Links are resolved from the page's
own folder, as GitHub and other Markdown viewers resolve them; code blocks
are left out.
"""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").glob("*.md"))


def _relative_links(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for link in re.findall(r"\]\(([^)\s]+)\)", text):
        target = link.split("#")[0]
        if target and "://" not in link and not link.startswith("mailto:"):
            yield link, target


def test_there_are_pages():
    assert any(page.name == "benchmarks.md" for page in PAGES)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_relative_links_resolve_from_the_page(page):
    missing = [link for link, target in _relative_links(page)
               if not (page.parent / target).exists()]
    assert not missing, f"{page.relative_to(ROOT)}: {missing}"


def test_benchmarks_page_links_the_report_at_the_root():
    links = [target for _, target in _relative_links(ROOT / "docs" / "benchmarks.md")]
    assert "../BENCHMARKS.md" in links
