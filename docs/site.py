"""Builds the documentation site (MkDocs + Material) from the repository's own documents.

    ./bazelw run //docs:site                 # -> site/ (open site/index.html)
    ./bazelw run //docs:site -- --out=/tmp/site --serve

Pages come from where they already live, so the site can never drift from the repository:
the top-level README (home), each library's README and CHANGELOG, the design notes, the
tutorials (`docs/tutorials/*.ipynb`, rendered with their outputs by mkdocs-jupyter) and an
API reference generated from the docstrings by mkdocstrings. Relative links between those
documents are rewritten to the pages they become; links to other repository files (images,
JSON) copy the file into the site. A link to a file that does not exist is an error. The build
is strict: any MkDocs warning (a broken link or anchor, a missing API reference) fails it.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import posixpath
import re
import shutil
import subprocess
import sys
import tempfile

LIBRARIES = ("haliax", "fray", "data", "models", "levanter")
# Every wheel's folder: the libraries and the opt-in hook wheel (a README and a changelog, no API).
WHEELS = LIBRARIES + ("lm-eval",)
_LINK = re.compile(r"(!?\[[^\]]*\])\(([^)\s]+)\)")


class SiteError(Exception):
    """The documents cannot be assembled into a site (e.g. a link to a missing file)."""


def pages(root: pathlib.Path) -> dict[str, str]:
    """Repository path -> site path of every page, in navigation order."""
    out = {"README.md": "index.md"}
    tutorials = sorted((root / "docs" / "tutorials").glob("*.ipynb"))
    for nb in tutorials:
        out[f"docs/tutorials/{nb.name}"] = f"tutorials/{nb.name}"
    for lib in WHEELS:
        out[f"{lib}/README.md"] = f"libraries/{lib}.md"
    for note in sorted((root / "docs" / "design").glob("*.md")):
        out[f"docs/design/{note.name}"] = f"design/{note.name}"
    for lib in WHEELS:
        if (root / lib / "CHANGELOG.md").exists():
            out[f"{lib}/CHANGELOG.md"] = f"changelog/{lib}.md"
    return out


def rewrite_links(text: str, src: str, dest: str, mapping: dict[str, str], root: pathlib.Path,
                  docs: pathlib.Path) -> str:  # fmt: skip
    """Points relative links of page `src` (repo path) at their site pages or copied files."""

    def fix(m: re.Match) -> str:
        label, target = m.group(1), m.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            return m.group(0)  # absolute URL, mailto:, or an anchor on the same page
        path, _, fragment = target.partition("#")
        repo_path = posixpath.normpath(posixpath.join(posixpath.dirname(src), path))
        if repo_path in mapping:
            new = mapping[repo_path]
        elif (root / repo_path).is_file():
            new = f"files/{repo_path}"
            (docs / new).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / repo_path, docs / new)
        else:
            raise SiteError(f"{src}: link to {target!r}, but {repo_path} does not exist")
        rel = posixpath.relpath(new, posixpath.dirname(dest) or ".")
        return f"{label}({rel}{'#' + fragment if fragment else ''})"

    return _LINK.sub(fix, text)


# The public modules of each library, one section each on its API page.
API_MODULES = {
    "haliax": ["", "nn", "nn.attention", "partitioning", "random", "tree_util", "state_dict",
               "quantization", "debug", "specialized_fns"],
    "fray": [""],
    "data": [""],
    "models": ["", "hf"],
    "levanter": ["config", "optim", "trainer", "checkpoint", "mesh", "tracking"],
}  # fmt: skip


def api_page(lib: str) -> str:
    parts = [
        f"# `meltemi.{lib}` API\n\n"
        "Generated from the docstrings of each module's public names (`__all__`).\n"
    ]
    for sub in API_MODULES[lib]:
        module = f"meltemi.{lib}" + (f".{sub}" if sub else "")
        parts.append(f"\n## `{module}`\n\n::: {module}\n    options:\n      heading_level: 3\n")
    return "".join(parts)


def assemble(root: pathlib.Path, docs: pathlib.Path) -> dict:
    """Writes every page under `docs` and returns the MkDocs configuration."""
    mapping = pages(root)
    for src, dest in mapping.items():
        target = docs / dest
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.endswith(".md"):
            text = (root / src).read_text()
            target.write_text(rewrite_links(text, src, dest, mapping, root, docs))
        else:
            shutil.copyfile(root / src, target)
    for lib in LIBRARIES:
        (docs / "api").mkdir(exist_ok=True)
        (docs / "api" / f"{lib}.md").write_text(api_page(lib))

    def section(prefix: str) -> list[str]:
        return [d for d in mapping.values() if d.startswith(prefix)]

    nav: list = [{"Home": "index.md"}]
    if section("tutorials/"):
        nav.append({"Tutorials": section("tutorials/")})
    nav += [
        {"Libraries": section("libraries/")},
        {"Design notes": section("design/")},
        {"API reference": [f"api/{lib}.md" for lib in LIBRARIES]},
        {"Changelogs": section("changelog/")},
    ]
    plugins: list = ["search"]
    if section("tutorials/"):
        plugins.append({"mkdocs-jupyter": {"include": ["tutorials/*.ipynb"], "execute": False}})
    config = {
        "site_name": "Meltemi",
        "site_description": "A JAX stack for training language models reproducibly.",
        "docs_dir": str(docs),
        "nav": nav,
        "theme": {"name": "material", "features": ["navigation.sections", "content.code.copy"]},
        "markdown_extensions": [
            "admonition",
            "tables",
            "toc",
            {"pymdownx.highlight": {}},
            "pymdownx.superfences",
        ],
        "plugins": plugins
        + [
            {
                "mkdocstrings": {
                    "handlers": {
                        "python": {
                            "paths": [str(root / lib / "src") for lib in LIBRARIES],
                            "options": {
                                "docstring_style": "google",
                                "docstring_options": {"warn_missing_types": False},
                                "extensions": [
                                    str(pathlib.Path(__file__).parent / "griffe_doctests.py")
                                    + ":DoctestsAsCode"
                                ],
                                "show_source": False,
                                "show_root_heading": False,
                                "members_order": "source",
                                "filters": ["!^_"],
                                "show_signature_annotations": False,
                                "heading_level": 3,
                                "force_inspection": True,
                                "show_submodules": False,
                            },
                        }
                    }
                }
            },
        ],
        "validation": {
            "omitted_files": "warn",
            "absolute_links": "warn",
            "unrecognized_links": "warn",
            "anchors": "warn",
        },
    }
    return config


def build(
    root: pathlib.Path, out: pathlib.Path, strict: bool = True
) -> subprocess.CompletedProcess:
    """Assembles and builds the site into `out`; returns mkdocs' completed process."""
    with tempfile.TemporaryDirectory() as tmp:
        docs = pathlib.Path(tmp) / "docs"
        config = assemble(root, docs)
        config_path = pathlib.Path(tmp) / "mkdocs.yml"
        config_path.write_text(json.dumps(config, indent=1))  # JSON is YAML
        cmd = [sys.executable, "-m", "mkdocs", "build", "-f", str(config_path), "-d", str(out)]
        env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
        return subprocess.run(
            [*cmd, *(["--strict"] if strict else [])], capture_output=True, text=True, env=env
        )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="site", help="output folder (relative to the root)")
    parser.add_argument("--no_strict", action="store_true", help="report warnings, don't fail")
    args = parser.parse_args(argv)
    root = pathlib.Path(os.environ.get("BUILD_WORKSPACE_DIRECTORY", ".")).resolve()
    out = (root / args.out).resolve()
    try:
        proc = build(root, out, strict=not args.no_strict)
    except SiteError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        print("error: the site did not build (see the warnings above)", file=sys.stderr)
        return 1
    print(f"site built in {out} (open {out / 'index.html'})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
