"""docs/api.md's examples run as written, in order, from the repository's root (they use the recipes).

They are the real calls behind the docstring examples that must skip (``hunt``, ``profile``,
``reproduce``, ``run_contained`` start child processes): see tests/test_docstrings.py.
"""

from __future__ import annotations

import doctest
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
API = ROOT / "docs" / "api.md"

# ```pycon fenced blocks: an interactive session each, run one after another in one namespace
_BLOCK = re.compile(r"^```pycon\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def _session() -> doctest.DocTest:
    text = API.read_text()
    parser = doctest.DocTestParser()
    examples = []
    for block in _BLOCK.finditer(text):
        offset = text.count("\n", 0, block.start(1))
        for example in parser.get_examples(block.group(1), name=str(API)):
            example.lineno += offset
            examples.append(example)
    return doctest.DocTest(examples, {}, "docs/api.md", str(API), 0, None)


def test_api_examples_run(monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    session = _session()
    assert len(session.examples) > 40  # the page's examples were found (a parse that finds none cannot fail)
    report: list[str] = []
    result = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS).run(session, out=report.append)
    assert result.failed == 0, "".join(report)


def test_every_export_is_documented() -> None:
    import jaxdbg

    exported = {name for name in dir(jaxdbg) if not name.startswith("_") and not _is_module(getattr(jaxdbg, name))}
    documented = set(re.findall(r"^\| `(\w+)` \|", API.read_text(), re.MULTILINE))
    assert exported | {"__version__"} == documented, (exported ^ documented)


def _is_module(value: object) -> bool:
    return type(value).__name__ == "module"
