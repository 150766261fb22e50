"""mkdocs hook: README.md and CONTRIBUTING.md are pages of the site too.

They live at the repository's root, where people read them first, and their links are
written for the repository (README.md links ``docs/run.md``; a page under docs/ links
``../README.md``), so they work when browsing the source. Here both files become pages
(``readme.md``, ``contributing.md``) and those links are rewritten to the site's pages;
``mkdocs build --strict`` then checks every one of them like any other link.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

#: a file at the repository's root -> its page in the site
ROOT_PAGES = {"README.md": "readme.md", "CONTRIBUTING.md": "contributing.md"}


def on_files(files, config):
    root = Path(config.config_file_path).parent
    for name, page in ROOT_PAGES.items():
        files.append(File.generated(config, page, abs_src_path=str(root / name)))
    return files


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri in ROOT_PAGES.values():            # a root file: docs/X.md is the page X.md
        markdown = re.sub(r"\]\(docs/", "](", markdown)
        prefix = ""
    else:                                                   # a page of docs/: the root is ../
        prefix = "../"
    for name, target in ROOT_PAGES.items():
        markdown = markdown.replace(f"]({prefix}{name}", f"]({target}")
    return markdown
