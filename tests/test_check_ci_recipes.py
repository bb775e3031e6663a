"""The CI recipes of docs/ci.md run as written: the ``jaxdbg`` commands of the GitHub Actions workflow's
``run:`` steps and of the GitLab job's ``script:`` run locally on a one-check project (install steps are the
CI machine's business and are left out), each leaving valid JUnit XML and exiting 0.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import xmlschema
import yaml

ROOT = Path(__file__).resolve().parent.parent
CI_MD = ROOT / "docs" / "ci.md"
JUNIT_XSD = ROOT / "tests" / "data" / "junit.xsd"


def _recipes() -> dict[str, list[str]]:
    """Recipe (GitHub Actions / GitLab CI) -> the jaxdbg commands its YAML runs."""
    text = CI_MD.read_text()
    found = {}
    for title, body in re.findall(r"^## (.+?)\n(.*?)(?=^## |\Z)", text, flags=re.MULTILINE | re.DOTALL):
        block = re.search(r"```yaml\n(.*?)```", body, flags=re.DOTALL)
        if block is None:
            continue
        document = yaml.safe_load(block.group(1))
        if title.startswith("GitHub"):
            steps = [step for job in document["jobs"].values() for step in job["steps"]]
            lines = [step["run"] for step in steps if "run" in step]
        else:
            lines = [line for job in document.values() if isinstance(job, dict) for line in job.get("script", [])]
        found[title] = [line for line in lines if line.startswith("jaxdbg ")]
    return found


RECIPES = _recipes()


def test_both_recipes_run_jaxdbg_check() -> None:
    assert set(RECIPES) == {"GitHub Actions", "GitLab CI"}
    assert all(any(c.startswith("jaxdbg check") for c in commands) for commands in RECIPES.values())


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_recipe_commands_run_locally(recipe: str, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("import jax.numpy as jnp\n\nprint(float(jnp.tanh(jnp.ones(4)).sum()))\n")
    (tmp_path / "pyproject.toml").write_text(
        "[tool.jaxdbg.check.no-nan]\ncommand = \"nan-hunt\"\ntarget = \"train.py\"\n")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")}
    environ["PYTHONPATH"] = str(ROOT)
    for command in RECIPES[recipe]:
        argv = [sys.executable, "-m", "jaxdbg", *shlex.split(command)[1:]]
        done = subprocess.run(argv, cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"
    xmlschema.XMLSchema(str(JUNIT_XSD)).validate(str(tmp_path / "jaxdbg-junit.xml"))
    assert len(list(tmp_path.glob("jaxdbg-out/check-*/no-nan/report.json"))) == 1
