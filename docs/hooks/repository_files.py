"""An mkdocs hook: a page's link to a repository file outside docs/ works on the site too.

The pages link to files of the repository (BENCHMARKS.md, examples/quickstart.py,
tests/faults_ledger.md) by their path from the page, as GitHub resolves them. The site
has no such files, so each linked file is copied to site/repository/<its path>, and the
link is pointed there; a Markdown file is also rendered to <its path>.html, which the
link points to, so that its anchors ('BENCHMARKS.md#...') work in a browser. Links that
mkdocs resolved (to pages, images) are left alone.
"""

import os
import posixpath
import re
import shutil

import markdown

# A relative href or src (no scheme, no leading slash or '#'), then an optional fragment.
_LINK = re.compile(r'(href|src)="(?![a-zA-Z][\w+.-]*:|/|#)([^"#]+)(#[^"]*)?"')
_FOLDER = "repository"

_included = {}   # the file's path in the repository -> its absolute path


def on_config(config):
    _included.clear()
    return config


def _page_folder(page):
    """The folder of the page's HTML file in the site ('' for the home page)."""
    url = page.url
    return url.rstrip("/") if url.endswith("/") or not url else posixpath.dirname(url)


def on_page_content(html, page, config, files):
    docs_dir = os.path.abspath(config["docs_dir"])
    root = os.path.dirname(docs_dir)
    source_folder = os.path.join(docs_dir, os.path.dirname(page.file.src_path))

    def point_to_the_copy(match):
        attribute, target, fragment = match.group(1), match.group(2), match.group(3) or ""
        source = os.path.normpath(os.path.join(source_folder, target))
        inside_docs = source.startswith(docs_dir + os.sep)
        if inside_docs or not source.startswith(root + os.sep) or not os.path.isfile(source):
            return match.group(0)
        path = os.path.relpath(source, root).replace(os.sep, "/")
        _included[path] = source
        shown = f"{path}.html" if path.endswith(".md") else path
        url = posixpath.relpath(f"{_FOLDER}/{shown}", _page_folder(page) or ".")
        return f'{attribute}="{url}{fragment}"'

    return _LINK.sub(point_to_the_copy, html)


def on_post_build(config):
    docs_dir = os.path.abspath(config["docs_dir"])
    root = os.path.dirname(docs_dir)
    queue = sorted(_included.items())
    done = set()
    while queue:
        path, source = queue.pop(0)
        if path in done:
            continue
        done.add(path)
        destination = os.path.join(config["site_dir"], _FOLDER, *path.split("/"))
        os.makedirs(os.path.dirname(destination), exist_ok=True)
        shutil.copyfile(source, destination)
        if path.endswith(".md"):
            queue += _render(source, path, destination, docs_dir, root)


def _render(source, path, destination, docs_dir, root):
    """Writes `destination`.html from the Markdown file; its links point into the site (a
    page of docs/ to the page, a repository file to its copy). Returns the repository
    files it links to, as (path, absolute path), to copy in turn."""
    with open(source, encoding="utf-8") as text:
        body = markdown.markdown(text.read(), extensions=["toc", "tables", "fenced_code"])
    to_site_root = "../" * (len(f"{_FOLDER}/{path}".split("/")) - 1)
    linked = []

    def into_the_site(match):
        attribute, target, fragment = match.group(1), match.group(2), match.group(3) or ""
        linked_file = os.path.normpath(os.path.join(os.path.dirname(source), target))
        if not linked_file.startswith(root + os.sep) or not os.path.isfile(linked_file):
            return match.group(0)
        if linked_file.startswith(docs_dir + os.sep) and linked_file.endswith(".md"):
            page = os.path.relpath(linked_file, docs_dir).replace(os.sep, "/")[:-3]
            url = "" if page == "index" else page + "/"
        else:
            repository_path = os.path.relpath(linked_file, root).replace(os.sep, "/")
            linked.append((repository_path, linked_file))
            shown = repository_path + (".html" if repository_path.endswith(".md") else "")
            url = f"{_FOLDER}/{shown}"
        return f'{attribute}="{to_site_root}{url}{fragment}"'

    with open(destination + ".html", "w", encoding="utf-8") as page:
        page.write(f"<!doctype html><meta charset='utf-8'><title>{path}</title>"
                   f"<body>{_LINK.sub(into_the_site, body)}</body>")
    return linked
