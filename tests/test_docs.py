"""The docs cannot rot: every ```python snippet in docs/*.md runs (a page's snippets in order, in one
namespace); a snippet right after `<!-- docs-test: skip -->` is illustrative and skipped. Every public error
class and every PREPJIT_* environment variable the package reads is documented."""
import pathlib
import re

import pytest

import prepjit as pj

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SNIPPET = re.compile(r"(<!-- docs-test: skip -->[ \t]*\n)?```python\n(.*?)^```", re.S | re.M)
PAGES = sorted(p.name for p in DOCS.glob("*.md"))


def snippets(text: str) -> list[tuple[int, str, bool]]:
    """(line of the code's first line, code, skipped) for each python snippet of a page."""
    return [(text.count("\n", 0, m.start(2)) + 1, m.group(2), m.group(1) is not None)
            for m in SNIPPET.finditer(text)]


def test_the_pages_exist_and_have_snippets():
    assert "README.md" in PAGES and len(PAGES) >= 5
    assert all(any(not skip for _, _, skip in snippets((DOCS / page).read_text())) for page in PAGES)


@pytest.mark.parametrize("page", PAGES)
def test_snippets_run(page):
    namespace = {"__name__": f"docs.{page[:-3]}"}
    for line, code, skipped in snippets((DOCS / page).read_text()):
        if not skipped:  # padded so a failure's traceback points at the page's own line numbers
            exec(compile("\n" * (line - 1) + code, str(DOCS / page), "exec"), namespace)


def test_every_error_class_is_documented():
    text = (DOCS / "errors.md").read_text()
    classes = [name for name in dir(pj) if isinstance(getattr(pj, name), type)
               and issubclass(getattr(pj, name), pj.PrepjitError)]
    assert len(classes) >= 7
    assert [name for name in classes if f"`pj.{name}`" not in text] == []


def test_every_environment_variable_is_documented():
    source = " ".join(p.read_text() for p in (ROOT / "prepjit").rglob("*.py"))
    names = set(re.findall(r"\bPREPJIT_[A-Z_]+\b", source))
    assert {"PREPJIT_DEVICE", "PREPJIT_LOG", "PREPJIT_CACHE_DIR"} <= names
    text = (DOCS / "configuration.md").read_text()
    assert sorted(n for n in names if f"`{n}`" not in text) == []


def test_nothing_refers_outside_the_project():
    outside = "../" + "shared"  # the design notes the project was written from; users do not have them
    paths = [ROOT / "README.md", ROOT / "pyproject.toml", *DOCS.glob("*.md")]
    paths += [p for folder in ("prepjit", "examples", "benchmarks", "tests") for p in (ROOT / folder).rglob("*.py")]
    assert [str(p) for p in paths if outside in p.read_text()] == []
