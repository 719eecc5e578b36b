"""MkDocs hook: render the notebooks of ``tutorials/`` in the site.

The site shows each tutorial's executed copy, ``docs/tutorials/<name>.ipynb``, written by
``execute_tutorials.py`` beside this file (a test keeps it in step with its tutorial); a tutorial
without one is shown from ``tutorials/``, without outputs.

MkDocs reads only ``docs_dir``, and the notebooks live in ``tutorials/`` at the repository root
(the test suite executes them there). This hook adds each ``tutorials/*.ipynb`` to the site's
files as ``tutorials/<name>.ipynb`` (before mkdocs-jupyter converts notebooks, hence the
priority), so the nav can list them and pages can link to them.

Pages under ``docs/`` link to a notebook the way GitHub resolves it, ``../tutorials/<name>.ipynb``;
the hook rewrites such links to the notebook's place in the site, so one link works in both. The
same goes the other way: a notebook's link to ``../docs/<page>.md`` becomes that page's URL.
"""

from __future__ import annotations

import os
import posixpath
import re

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TUTORIALS = os.path.join(ROOT, "tutorials")
LINK = re.compile(r"\]\(([^)\s#]+\.ipynb)(#[^)\s]*)?\)")
DOCS_HREF = re.compile(r'href="\.\./docs/([^"#]+\.md)(#[^"]*)?"')


@event_priority(100)  # before mkdocs-jupyter's on_files (priority 0) wraps the notebooks
def on_files(files, config):
    for name in sorted(os.listdir(TUTORIALS)):
        # an executed copy in docs/tutorials/ (execute_tutorials.py) is already among the files
        if name.endswith(".ipynb") and files.get_file_from_path(f"tutorials/{name}") is None:
            files.append(File(f"tutorials/{name}", ROOT, config["site_dir"], config["use_directory_urls"]))
    return files


def on_page_markdown(markdown, page, config, files):
    if page.file.abs_src_path is None:
        return markdown
    page_dir = os.path.dirname(page.file.abs_src_path)
    page_uri_dir = posixpath.dirname(page.file.src_uri)

    def rewrite(match):
        target, anchor = match.group(1), match.group(2) or ""
        if "://" in target:
            return match.group(0)
        resolved = os.path.normpath(os.path.join(page_dir, target))
        if os.path.dirname(resolved) != TUTORIALS or not os.path.exists(resolved):
            return match.group(0)
        site_target = posixpath.relpath(f"tutorials/{os.path.basename(resolved)}", page_uri_dir or ".")
        return f"]({site_target}{anchor})"

    return LINK.sub(rewrite, markdown)


def on_page_content(html, page, config, files):
    if not (page.file.src_uri.startswith("tutorials/") and page.file.src_uri.endswith(".ipynb")):
        return html

    def rewrite(match):
        target = files.get_file_from_path(match.group(1))
        if target is None:
            return match.group(0)
        return f'href="{target.url_relative_to(page.file)}{match.group(2) or ""}"'

    return DOCS_HREF.sub(rewrite, html)
