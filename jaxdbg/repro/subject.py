"""The subject of a reduction: one script to run and shrink, whatever the TARGET form was.

A script TARGET is its own subject. A function TARGET (``file.py::f``, ``pkg.mod:f``) becomes a script:
the module's source (its ``if __name__ == "__main__":`` blocks blanked, so line numbers stay), plus a driver
that loads the inputs from ``inputs.npz`` next to it (array leaves, rebuilt into the tuples, lists and dicts
they came in, bfloat16 restored from its bits) and calls ``jax.jit(f)(*inputs)``, the way jaxdbg runs a
function target. The user's files are only read; the subject lives in jaxdbg's work folder.

Example:
    >>> subject = prepare_subject(parse_target("model.py::loss"), options, "/tmp/work")   # doctest: +SKIP
    >>> subject.companions                                                                 # doctest: +SKIP
    {'inputs.npz': '/tmp/work/subject/inputs.npz'}
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from jaxdbg._errors import UsageError
from jaxdbg._source import SourceLocation
from jaxdbg.repro.inline import Combined, blank_main_blocks, inline_local_modules
from jaxdbg.repro.jobs import CHILD_ENV, InputsRequest, RunRequest
from jaxdbg.repro.messages import InputsBuilt
from jaxdbg.repro.program import INPUTS_FILE, count_lines
from jaxdbg.runner import run_contained
from jaxdbg.storable import key_impl, restore_source, storable
from jaxdbg.target import (
    FlatInputs,
    TargetSpec,
    check_inputs,
    flatten_inputs,
    load_npz_inputs,
    parse_args_spec,
    random_inputs,
    save_npz_inputs,
)


@dataclass(frozen=True)
class Subject:
    """A script to run (``path``) and the text to reduce (``source``: the same program, with the user's sibling
    modules pasted in when it imports any, see :mod:`jaxdbg.repro.inline`), how to run it, and the files every
    candidate needs beside it."""

    path: str
    source: str
    script_name: str
    request: RunRequest
    companions: dict = field(default_factory=dict)
    original_lines: int = 0
    data_free_source: str | None = None  # function targets: the same call with np.ones inputs (no inputs.npz)
    combined: Combined | None = None  # how ``source`` maps back to the user's files, when modules were pasted
    reduce_path: str = ""  # a file holding ``source`` (``path`` itself when nothing was pasted)
    # Function targets: the user's module and its line count (``path`` is a copy of it plus jaxdbg's driver).
    module: tuple[str, int] | None = None

    def locate(self, location: SourceLocation | None) -> SourceLocation | None:
        """Where a place of the original program (``models.py:21``) is in ``source``, as a place in ``reduce_path``;
        unchanged when nothing was pasted or it lies in a file that was not."""
        if location is None or self.combined is None:
            return location
        line = self.combined.line_of(location.file, location.line)
        return location if line is None else SourceLocation(self.reduce_path, line, location.function)

    def in_users_files(self, location: SourceLocation | None) -> SourceLocation | None:
        """Where a place of ``path`` is in the user's files, for the report: the work folder holding ``path`` is
        gone once repro ends. A line of a function target's module copy is that line of the module (main blocks
        are blanked, lines stay); a line of the driver is the call jaxdbg wrote, which the user never saw: None.

        Example:
            >>> subject = Subject("/tmp/w/subject/m.py", "", "m.py", RunRequest(), module=("/home/me/m.py", 9))
            >>> subject.in_users_files(SourceLocation("/tmp/w/subject/m.py", 4, "loss"))
            SourceLocation(file='/home/me/m.py', line=4, function='loss')
            >>> subject.in_users_files(SourceLocation("/tmp/w/subject/m.py", 12, "<module>")) is None
            True
        """
        if location is None or self.module is None or os.path.realpath(location.file) != os.path.realpath(self.path):
            return location
        file, lines = self.module
        return replace(location, file=file) if location.line <= lines else None


def prepare_subject(spec: TargetSpec, inputs: str | None, args: str | None, seed: int, work_dir: str,
                    timeout: float | None = None) -> Subject:
    """The subject for a TARGET; function targets get a synthesized script and ``inputs.npz``."""
    check_inputs(spec, inputs, args)
    if spec.is_script:
        assert spec.path is not None  # every script target has its file
        with open(spec.path) as handle:
            source = handle.read()
        request = RunRequest(argv=tuple(spec.script_args), sys_path=(os.path.dirname(spec.path),))
        subject = Subject(spec.path, source, os.path.basename(spec.path), request, {}, count_lines(source),
                          reduce_path=spec.path)
        return _with_modules_pasted(subject, os.path.dirname(spec.path), work_dir)
    module_path = _module_file(spec)
    with open(module_path) as handle:
        module_source = handle.read()
    assert spec.function is not None  # parse_target sets it on every function target
    flat = _function_inputs(spec, inputs, args, seed, timeout)
    folder = os.path.join(work_dir, "subject")
    os.makedirs(folder, exist_ok=True)
    companions = {}
    if flat.leaves:  # (a function that takes no arguments, or only scalars, reads no file)
        companions[INPUTS_FILE] = os.path.join(folder, INPUTS_FILE)
        save_npz_inputs(companions[INPUTS_FILE], flat)
    body = blank_main_blocks(module_source)
    source = body + driver_source(spec.function, flat)
    path = os.path.join(folder, os.path.basename(module_path))
    with open(path, "w") as handle:
        handle.write(source)
    request = RunRequest(sys_path=(os.path.dirname(module_path),))
    data_free = body + ones_driver_source(spec.function, flat) if flat.leaves else None
    subject = Subject(path, source, os.path.basename(module_path), request, companions,
                      count_lines(module_source), data_free, reduce_path=path,
                      module=(os.path.abspath(module_path), len(body.splitlines())))
    return _with_modules_pasted(subject, os.path.dirname(module_path), work_dir)


def _with_modules_pasted(subject: Subject, folder: str, work_dir: str) -> Subject:
    """The subject with the sibling modules it imports pasted into the text to reduce (kept in a file of its own)."""
    combined = inline_local_modules(subject.path, subject.source, folder)
    if combined is None:
        return subject
    data_free = subject.data_free_source
    if data_free is not None:
        pasted = inline_local_modules(subject.path, data_free, folder)
        data_free = pasted.text if pasted is not None else None
    reduce_path = os.path.join(work_dir, "combined", subject.script_name)
    os.makedirs(os.path.dirname(reduce_path), exist_ok=True)
    with open(reduce_path, "w") as handle:
        handle.write(combined.text)
    # The program is the script and the modules it brought in: a reproducer stands in for all of them.
    added = count_lines(combined.text) - count_lines(subject.source)
    return replace(subject, source=combined.text, data_free_source=data_free, combined=combined,
                   reduce_path=reduce_path, original_lines=subject.original_lines + added)


def driver_source(function: str, flat: FlatInputs) -> str:
    """Lines that call the function target as jaxdbg does: ``jax.jit(f)(*inputs)``, the inputs rebuilt (nesting,
    bfloat16) from the ``inputs.npz`` that :func:`~jaxdbg.target.save_npz_inputs` wrote, with numpy alone."""
    if not flat.leaves:  # no arrays: nothing to load
        call = f"_jax.jit({function})({_call_args(flat, str)})"
        return f"\n\n# jaxdbg: the call `jaxdbg repro` made\nimport jax as _jax\n{call}\n"
    lines = ["\n\n# jaxdbg: the call `jaxdbg repro` made (inputs saved next to this file)",
             "import jax as _jax", "import numpy as _np",
             "_inputs = _np.load((__file__.rpartition('/')[0] or '.') + '/inputs.npz')",
             f"_x = [_inputs[f'arg{{i}}'] for i in range({len(flat.leaves)})]"]
    for i, leaf in enumerate(flat.leaves):
        special = storable(leaf)[1]
        if special:
            lines.append(f"_x[{i}] = " + restore_source(f"_x[{i}]", special, "_jax.numpy", "_jax"))
    lines.append(f"_jax.jit({function})({_call_args(flat, lambda i: f'_x[{i}]')})")
    return "\n".join(lines) + "\n"


def ones_driver_source(function: str, flat: FlatInputs) -> str:
    """The same call with ``np.ones`` inputs of the same shapes and dtypes: when data does not matter, the
    reproducer needs no ``inputs.npz`` and the reducer can shrink the shapes written in it."""
    def ones(i: int) -> str:
        data, special = storable(flat.leaves[i])
        if key_impl(special) is not None:  # keys of all-ones key data
            return restore_source(f"_np.ones({tuple(data.shape)!r}, _np.uint32)", special, "_jax.numpy", "_jax")
        leaf = np.asarray(flat.leaves[i])
        dtype = f"_jax.numpy.{leaf.dtype.name}" if special else repr(leaf.dtype.name)
        return f"_np.ones({tuple(leaf.shape)!r}, {dtype})"

    return ("\n\n# jaxdbg: the call `jaxdbg repro` made, with all-ones inputs\n"
            f"import jax as _jax\nimport numpy as _np\n_jax.jit({function})({_call_args(flat, ones)})\n")


def _call_args(flat: FlatInputs, leaf: Callable[[int], str]) -> str:
    """The positional arguments as Python source, each array leaf written by ``leaf(index)``."""
    def expr(node: dict) -> str:
        if "leaf" in node:
            return leaf(node["leaf"])
        if "tuple" in node:
            items = [expr(n) for n in node["tuple"]]
            return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
        if "list" in node:
            return "[" + ", ".join(expr(n) for n in node["list"]) + "]"
        if "dict" in node:
            return "{" + ", ".join(f"{k!r}: {expr(n)}" for k, n in node["dict"]) + "}"
        return repr(node.get("scalar"))

    return ", ".join(expr(node) for node in flat.args)


def _module_file(spec: TargetSpec) -> str:
    if spec.path is not None:
        return spec.path
    assert spec.module is not None  # a function target without a file is module:function
    found = importlib.util.find_spec(spec.module)
    if found is None or not found.origin or not found.origin.endswith(".py"):
        raise UsageError(f"target '{spec.text}': cannot find the source file of module '{spec.module}'")
    return found.origin


def _function_inputs(spec: TargetSpec, inputs: str | None, args: str | None, seed: int,
                     timeout: float | None) -> FlatInputs:
    """Inputs as array leaves and nesting; ``--inputs file.py::make_inputs`` runs contained (it is user code), and
    so do ``--args`` with a PRNG key (made by jax: its backend starts in the child, not here)."""
    if not args and not inputs:  # a function that takes none (check_inputs)
        return flatten_inputs(())
    if args and not any(spec.is_key for spec in parse_args_spec(args)):  # well formed: check_inputs
        return flatten_inputs(random_inputs(parse_args_spec(args), seed))
    if inputs and inputs.endswith(".npz"):
        return flatten_inputs(load_npz_inputs(inputs))
    outcome = run_contained(InputsRequest(inputs=inputs, args=args, seed=seed), timeout=timeout or 120,
                            env=CHILD_ENV)
    built = outcome.last(InputsBuilt)
    if built is None:
        given = f"--inputs '{inputs}'" if inputs else f"--args '{args}'"
        raise outcome.failure(f"{given} could not be built: {outcome.describe()}")
    return built.inputs
