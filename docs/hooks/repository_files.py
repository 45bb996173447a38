"""An mkdocs hook: a page's link to a repository file outside docs/ works on the site too.

The pages link to files of the repository (BENCHMARKS.md, examples/quickstart.py,
tests/faults_ledger.md) by their path from the page, as GitHub resolves them. The site
has no such files, so each linked file is copied to site/repository/<its path>, and the
link is pointed there. Links that mkdocs resolved (to pages, images) are left alone.
"""

import os
import posixpath
import re
import shutil

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
        url = posixpath.relpath(f"{_FOLDER}/{path}", _page_folder(page) or ".")
        return f'{attribute}="{url}{fragment}"'

    return _LINK.sub(point_to_the_copy, html)


def on_post_build(config):
    for path, source in sorted(_included.items()):
        destination = os.path.join(config["site_dir"], _FOLDER, *path.split("/"))
        os.makedirs(os.path.dirname(destination), exist_ok=True)
        shutil.copyfile(source, destination)
