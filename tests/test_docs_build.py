"""The user guide and the API reference (generated from the docstrings by mkdocstrings)
build with every warning an error: `mkdocs build --strict`, as mkdocs.yml configures it;
and the built site has no dead link, no public name without a reference entry, and no
page in the nav that the home page does not list.

A docstring that griffe cannot parse, a nav entry naming no page or a broken anchor
fails the build. mkdocs and mkdocstrings[python] come with the `test` extra (and the
`docs` extra), so every CI venv has them: the tests are never skipped.
"""

import html.parser
import inspect
import pathlib
import posixpath
import re
import subprocess
import sys
import types
import urllib.parse

import pytest
import yaml

import towerlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    site = tmp_path_factory.mktemp("docs") / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-5000:]
    # Only mkdocs' own three lines: no "link target not found" noise for repository files.
    said = [line for line in result.stderr.splitlines() if line.strip()
            and not re.match(r"INFO\s+-\s+(Cleaning site|Building documentation|"
                             r"Documentation built)", line)]
    assert said == [], said
    return site


def test_docs_build_strict(site):
    assert (site / "reference" / "building" / "index.html").exists()
    built = (site / "reference" / "building" / "index.html").read_text()
    assert 'id="towerlib.build_train_graph"' in built


class _Links(html.parser.HTMLParser):
    """The href and src values of a page, and the ids it defines."""

    def __init__(self):
        super().__init__()
        self.links, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("href", "src") and value:
                self.links.append(value)
            if name in ("id", "name") and value:
                self.ids.add(value)


def _parsed(page):
    parser = _Links()
    parser.feed(page.read_text(errors="replace"))
    return parser


def _markdown_anchors(text):
    """GitHub's anchors of a Markdown file's headings."""
    anchors = set()
    for heading in re.findall(r"^#+\s+(.*)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


def _target_of(page, link, site):
    """(the file a relative link names, its fragment); None for another site's link."""
    parts = urllib.parse.urlsplit(link)
    if parts.scheme or parts.netloc or link.startswith(("mailto:", "data:")):
        return None
    if not parts.path:
        return page, parts.fragment
    path = urllib.parse.unquote(parts.path)
    folder = site if path.startswith("/") else page.parent   # 404.html's are from the root
    target = pathlib.Path(posixpath.normpath(posixpath.join(str(folder), path.lstrip("/"))))
    if path.endswith("/") or target.is_dir():
        target = target / "index.html"
    return target, parts.fragment


def test_the_site_has_no_dead_link(site):
    """Every relative href and src of every page names a file of the site (a repository
    file a page links to is copied into it), and every fragment an id of its page (or a
    heading of a copied Markdown file)."""
    dead = []
    pages = {page: _parsed(page) for page in site.rglob("*.html")}
    for page, parsed in pages.items():
        for link in parsed.links:
            found = _target_of(page, link, site)
            if found is None:
                continue
            target, fragment = found
            where = f"{page.relative_to(site)}: {link}"
            if not target.is_file() or site not in target.resolve().parents:
                dead.append(where)
            elif fragment and target.suffix == ".html":
                ids = (pages.get(target) or _parsed(target)).ids
                if fragment not in ids:
                    dead.append(where + " (no such anchor)")
            elif fragment and target.suffix == ".md":
                if fragment not in _markdown_anchors(target.read_text()):
                    dead.append(where + " (no such heading)")
    assert not dead, "\n".join(dead)
    assert (site / "repository" / "BENCHMARKS.md").is_file()
    # A page's link into a repository Markdown file opens it rendered, where anchors work.
    raw = [f"{page.relative_to(site)}: {link}" for page, parsed in pages.items()
           for link in parsed.links if re.search(r"\.md(#|$)", link)
           and not re.match(r"[a-z]+:", link)]
    assert raw == [], raw


def _public_names():
    """towerlib.X for every name of towerlib.__all__, and towerlib.m.Y for the public
    members of each module it exports (the module's __all__, else its own functions and
    classes)."""
    names = []
    for name in towerlib.__all__:
        value = getattr(towerlib, name)
        if not isinstance(value, types.ModuleType):
            names.append(f"towerlib.{name}")
            continue
        members = getattr(value, "__all__", None)
        if members is None:
            members = [member for member, item in vars(value).items()
                       if not member.startswith("_")
                       and (inspect.isfunction(item) or inspect.isclass(item))
                       and getattr(item, "__module__", "").startswith("towerlib")]
        names.extend(f"towerlib.{name}.{member}" for member in members)
    return names


def test_every_public_name_has_a_reference_entry(site):
    entries = set()
    for page in (site / "reference").rglob("*.html"):
        entries.update(re.findall(r'id="(towerlib\.[\w.]+)"', page.read_text()))
    names = _public_names()
    assert "towerlib.layers.for_tower" in names and len(names) > 100
    missing = [name for name in names if name not in entries
               and f"towerlib.{name.rsplit('.', 1)[1]}" not in entries]
    assert not missing, missing


def _nav_pages(entries):
    for entry in entries:
        values = entry.values() if isinstance(entry, dict) else [entry]
        for value in values:
            if isinstance(value, list):
                yield from _nav_pages(value)
            else:
                yield value


def _linked_pages(markdown_page):
    text = re.sub(r"```.*?```", "", markdown_page.read_text(), flags=re.S)
    folder = markdown_page.parent.relative_to(ROOT / "docs").as_posix()
    return {posixpath.normpath(posixpath.join(folder, link.split("#")[0]))
            for link in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in link}


def test_every_page_of_the_nav_is_in_the_index():
    """docs/index.md lists every page of the nav; the reference's own index lists its
    pages, and the home page links that index."""
    nav = list(_nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]))
    assert "large_batches.md" in nav
    home = _linked_pages(ROOT / "docs" / "index.md")
    reference = _linked_pages(ROOT / "docs" / "reference" / "index.md")
    missing = [page for page in nav if page != "index.md" and page not in (
        reference if page.startswith("reference/") and page != "reference/index.md"
        else home)]
    assert not missing, missing
