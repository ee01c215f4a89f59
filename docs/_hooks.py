"""MkDocs hooks: pages built from the package itself, so renames are followed without editing.

* ``api/index.md`` and one page per name in ``eatta.__all__`` (``api/<name>.md``), rendered by
  mkdocstrings; a public name whose docstring is missing (as mkdocstrings reads it, through
  griffe) stops the build. Dunder names (``__version__``) are metadata and exempt.
* ``api/methods.md``: every registered method (``eatta.available()``) with its keys, read from
  ``eatta.describe(name)``.
* ``changelog.md``: the repository's ``CHANGELOG.md``.
* Links from a page to a repository file outside ``docs/`` (``../examples/quickstart.py``) point
  nowhere on the site: they become the file's path as code, and a link to a file that does not
  exist stops the build.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
API_TITLE = "API reference"
CHANGELOG_URI = "changelog.md"


def _eatta() -> Any:
    try:
        return importlib.import_module("eatta")
    except ImportError:  # a checkout without `pip install -e .`
        sys.path.insert(0, str(ROOT / "src"))
        return importlib.import_module("eatta")


@dataclass(frozen=True)
class PublicName:
    name: str  # as exported: eatta.<name>
    path: str  # where mkdocstrings finds it (the defining module's dotted path)
    kind: str  # class, function, exception, constant


def public_names() -> list[PublicName]:
    """Every name of ``eatta.__all__``, with the dotted path of its definition."""
    eatta = _eatta()
    found = []
    for name in eatta.__all__:
        obj = getattr(eatta, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            path = f"{obj.__module__}.{obj.__qualname__}"
            if inspect.isclass(obj) and issubclass(obj, BaseException):
                kind = "exception" if not issubclass(obj, Warning) else "warning"
            else:
                kind = "class" if inspect.isclass(obj) else "function"
        else:
            path, kind = f"eatta.{name}", "constant"
        found.append(PublicName(name, path, kind))
    return found


def static_docstring(n: PublicName) -> str:
    """The docstring of ``n`` as griffe (mkdocstrings' reader) sees it; empty if none."""
    import griffe

    global _PACKAGE
    if _PACKAGE is None:
        _PACKAGE = griffe.load("eatta", search_paths=[str(ROOT / "src")], resolve_aliases=False)
    try:
        obj = _PACKAGE[n.path.removeprefix("eatta.")]
        target = obj.final_target if obj.is_alias else obj
        return target.docstring.value.strip() if target.docstring else ""
    except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return ""


_PACKAGE: Any = None


def missing_docstrings(names: list[PublicName]) -> list[str]:
    """The public names without a docstring (dunder metadata such as ``__version__`` exempt)."""
    return [
        f"eatta.{n.name} ({n.path})"
        for n in names
        if not n.name.startswith("__") and not static_docstring(n)
    ]


def _summary(doc: str | None) -> str:
    first = (doc or "").strip().split("\n\n", 1)[0]
    return " ".join(first.split()).replace("|", "\\|")


def api_index(names: list[PublicName]) -> str:
    eatta = _eatta()
    lines = [
        "# API reference",
        "",
        "Every public name of the package (`eatta.__all__`), generated from the docstrings. The",
        "keys of every registered method are on [Method keys](methods.md).",
        "",
        "| name | kind | what |",
        "|---|---|---|",
    ]
    for n in names:
        obj = getattr(eatta, n.name)
        doc = inspect.getdoc(obj) if n.kind != "constant" else static_docstring(n)
        if n.name == "__version__":
            doc = f"the package's version ({obj})"
        link = f"[`eatta.{n.name}`]({_page(n.name)})"
        lines.append(f"| {link} | {n.kind} | {_summary(doc)} |")
    return "\n".join(lines) + "\n"


def _page(name: str) -> str:
    return f"{name.strip('_') or name}.md"


def api_page(n: PublicName) -> str:
    if n.name == "__version__":
        return f"# eatta.__version__\n\nThe package's version: `{_eatta().__version__}`.\n"
    return (
        f"# eatta.{n.name}\n\n"
        f"::: {n.path}\n"
        "    options:\n"
        "      show_root_heading: false\n"
        "      show_root_toc_entry: false\n"
    )


_KEY = re.compile(
    r"^  (?P<key>[\w.]+): (?P<type>.*?) = (?P<default>.*?)(?: \[(?P<datasets>[^\]]*)\])?"
    r"  (?P<doc>.*)$"
)


def _code(text: str) -> str:
    text = text.replace("|", "\\|")
    return f"`{text}`" if text else ""


def methods_page() -> str:
    """The keys of every registered method, parsed from ``eatta.describe``; a line that does not
    parse is shown as it is."""
    eatta = _eatta()
    lines = [
        "# Method keys",
        "",
        "Every method registered with `eatta.create(name, model, **keys)` and `eatta-bench`",
        "(`--methods NAME --hp NAME.KEY=VALUE`), with its keys: type, default, the per-dataset",
        "defaults (`dataset=`), and meaning. Generated from `eatta.describe(name)`; an unknown key",
        "or a value of the wrong type is refused before the model is touched.",
        "",
    ]
    for name in eatta.available():
        head, *rows = eatta.describe(name).splitlines()
        rest = head.removeprefix(name)
        is_active = rest.startswith(" (active")
        summary = rest.split("): ", 1)[-1] if is_active else rest.removeprefix(": ")
        active = " (active: needs `oracle=`)" if is_active else ""
        lines += [f"## `{name}`", "", f"{summary}{active}", ""]
        parsed = [_KEY.match(r) for r in rows]
        if all(parsed):
            lines += ["| key | type | default | per dataset | meaning |", "|---|---|---|---|---|"]
            for m in parsed:
                assert m is not None
                lines.append(
                    f"| `{m['key']}` | {_code(m['type'])} | {_code(m['default'])} | "
                    f"{_code(m['datasets'] or '')} | {m['doc'].replace('|', chr(92) + '|')} |"
                )
        else:
            lines += ["```text", *rows, "```"]
        lines.append("")
    return "\n".join(lines)


def changelog_page() -> str:
    return (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")


# ----------------------------------------------------------------------------- hooks


def on_config(config: Any) -> Any:
    """Fill the nav's API reference section with one entry per public name."""
    names = public_names()
    missing = missing_docstrings(names)
    if missing:
        raise PluginError(
            "public names without a docstring (the API reference needs one each): "
            + ", ".join(missing)
        )
    entries: list[Any] = [{"Overview": "api/index.md"}, {"Method keys": "api/methods.md"}]
    entries += [{f"eatta.{n.name}": f"api/{_page(n.name)}"} for n in names]
    for item in config["nav"] or []:
        if isinstance(item, dict) and API_TITLE in item:
            item[API_TITLE] = entries
            break
    else:
        raise PluginError(f"mkdocs.yml's nav has no '{API_TITLE}' section")
    return config


def generated_pages() -> dict[str, str]:
    """The pages the hooks add, by their path under ``docs/``."""
    names = public_names()
    pages = {"api/index.md": api_index(names), "api/methods.md": methods_page()}
    pages.update({f"api/{_page(n.name)}": api_page(n) for n in names})
    pages[CHANGELOG_URI] = changelog_page()
    return pages


def on_files(files: Files, config: Any) -> Files:
    """Add the generated pages."""
    for uri, text in generated_pages().items():
        files.append(File.generated(config, uri, content=text))
    return files


_ROLE = re.compile(r":(?:attr|func|class|meth|mod|data|exc|obj):(?=<code>)")
_TILDE = re.compile(r"<code>~(?:[\w]+\.)*(?P<last>\w+)</code>")


def on_page_content(html: str, page: Any, config: Any, files: Files) -> str:
    """Docstrings use Sphinx roles (``:class:`X` ``): show them as code, ``~a.b.C`` as ``C``."""
    if not page.file.src_uri.startswith("api/"):
        return html
    return _TILDE.sub(r"<code>\g<last></code>", _ROLE.sub("", html))


_LINK = re.compile(r"(?<!!)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s#]+)(?P<anchor>#[^)\s]*)?\)")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """A link to a repository file outside the docs becomes its path as code (the file must
    exist); the changelog's links into ``docs/`` become links to the site's pages."""
    docs = Path(config["docs_dir"]).resolve()
    changelog = page.file.src_uri == CHANGELOG_URI  # its links are relative to the repository
    here = ROOT if changelog else (docs / page.file.src_uri).parent

    def rewrite(m: re.Match[str]) -> str:
        target = m["target"]
        if re.match(r"[a-z]+:", target) or target.startswith("/"):
            return m[0]
        dest = (here / target).resolve()
        try:
            inside = dest.relative_to(docs)
        except ValueError:
            inside = None
        if inside is not None:
            if changelog:  # at the site's root: relative to docs/
                return f"[{m['text']}]({inside.as_posix()}{m['anchor'] or ''})"
            return m[0]
        if not dest.exists():
            raise PluginError(f"{page.file.src_uri}: link to a missing file: {target}")
        shown = dest.relative_to(ROOT).as_posix()
        text = m["text"].strip("`")
        return f"{m['text']} (`{shown}`)" if text != shown else f"`{shown}`"

    return _LINK.sub(rewrite, markdown)
