"""TARGET specs: what the user asks jaxdbg to run, and the inputs of a function target.

Forms (see docs/cli.md, "TARGET"):
- ``path/to/script.py`` with script arguments: run as ``__main__``, unmodified (:func:`run_script`).
- ``path/to/file.py::func`` or ``package.module:func``: one function (:func:`load_function`), with inputs
  from ``--args "f32[8,128] i32[8] key"`` (:func:`parse_args_spec`, :func:`random_inputs`) or
  ``--inputs file.py::make_inputs`` / ``--inputs data.npz`` (:func:`load_inputs`); none for a function
  seen to take no arguments (:func:`takes_no_inputs`).

Example:
    >>> spec = parse_target("numpy:tanh")              # package.module:func; file.py::func names a file
    >>> spec.kind, spec.module, spec.function
    ('function', 'numpy', 'tanh')
    >>> load_function(spec).__name__
    'tanh'
    >>> args = random_inputs(parse_args_spec("f32[8,4] i32[]"), seed=0)
    >>> [a.shape for a in args]
    [(8, 4), ()]
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import os
import re
import runpy
import sys
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from jaxdbg._errors import TargetFailedError, UsageError
from jaxdbg.protocol import Done, Request, handles

if TYPE_CHECKING:  # annotations only: numpy is imported where arrays are made or read (a command's parent never)
    import numpy as np


@dataclass(frozen=True)
class TargetSpec:
    """A parsed TARGET: a script, or a function (by path or module); paths are absolute."""

    kind: Literal["script", "function"]
    text: str
    path: str | None = None
    module: str | None = None
    function: str | None = None
    script_args: tuple[str, ...] = ()

    @property
    def is_script(self) -> bool:
        return self.kind == "script"

    @property
    def display_name(self) -> str:
        return self.function or os.path.basename(self.path or self.text)


_MODULE_FUNC = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*:[A-Za-z_][\w.]*$")


def parse_target(text: str, script_args: Sequence[str] = ()) -> TargetSpec:
    """Parse a TARGET string; raise :class:`UsageError` with a fix when it names nothing runnable."""
    if not text:
        raise UsageError("no TARGET given; pass a script (train.py), a function (model.py::loss) or module:function")
    if "::" in text:
        path, _, func = text.partition("::")
        _require_python_file(path, text)
        if not func:
            raise UsageError(f"target '{text}': no function after '::'; write it as file.py::function_name")
        return TargetSpec("function", text, path=os.path.abspath(path), function=func)
    if text.endswith(".py") or os.path.sep in text:
        _require_python_file(text, text)
        return TargetSpec("script", text, path=os.path.abspath(text), script_args=tuple(script_args))
    if _MODULE_FUNC.match(text):
        module, _, func = text.partition(":")
        return TargetSpec("function", text, module=module, function=func)
    raise UsageError(
        f"target '{text}' is not a script, file.py::function or package.module:function; "
        "check the spelling, or pass a path ending in .py"
    )


def _require_python_file(path: str, text: str) -> None:
    if not os.path.exists(path):
        raise UsageError(f"target '{text}': no such file '{path}'; check the path (relative to {os.getcwd()})")
    if os.path.isdir(path):
        raise UsageError(f"target '{text}': '{path}' is a folder; name a .py file inside it")
    if not path.endswith(".py"):
        raise UsageError(f"target '{text}': '{path}' is not a Python file; pass a .py script")


# ----------------------------------------------------------------------------------------------------------
# Loading user code
# ----------------------------------------------------------------------------------------------------------


def check_syntax(path: str) -> None:
    """UsageError naming the line when a user file does not parse (checked without running it)."""
    with open(path, "rb") as handle:
        source = handle.read()
    try:
        compile(source, path, "exec")
    except SyntaxError as err:
        raise UsageError(
            f"target '{path}' has a syntax error at line {err.lineno}: {err.msg}; fix the file and run again"
        ) from None


def check_target(spec: TargetSpec) -> None:
    """Refuse a TARGET that cannot run, without running user code: syntax, and for ``file.py::func`` that
    the file defines ``func`` at top level. (A module target is checked when it is imported.)"""
    if spec.path is None:
        return
    check_syntax(spec.path)
    if spec.kind != "function":
        return
    assert spec.function is not None  # parse_target sets it on every function target
    with open(spec.path, "rb") as handle:
        tree = ast.parse(handle.read(), spec.path)
    defined = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(a.name == "*" for a in node.names):
                return
            defined.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif not isinstance(node, (ast.Expr, ast.Pass)):
            return  # conditional or dynamic definitions: leave the check to loading
    if spec.function.split(".")[0] not in defined:
        shown = ", ".join(sorted(n for n in defined if not n.startswith("_"))[:12]) or "none"
        raise UsageError(f"target '{spec.text}': no function '{spec.function}' there; names defined: {shown}")


def load_module_from_file(path: str) -> Any:
    """Import a user file as a module (its folder on sys.path while it imports). Raises UsageError/TargetFailedError."""
    check_syntax(path)
    name = "_jaxdbg_target_" + re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None  # a .py path always gets a source loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.insert(0, folder)  # stays: the function may import siblings lazily when called
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        sys.modules.pop(name, None)
        raise TargetFailedError(
            f"importing '{path}' raised {type(err).__name__}: {err}; the file must import cleanly to load a function"
        ) from err
    return module


def load_function(spec: TargetSpec) -> Callable:
    """The callable a function TARGET names (``file.py::func``, ``pkg.mod:func``; dotted attributes allowed)."""
    if spec.kind != "function":
        raise UsageError(f"target '{spec.text}' is a script, not a function; write it as file.py::function_name")
    assert spec.function is not None  # parse_target sets it on every function target
    if spec.path is not None:
        module = load_module_from_file(spec.path)
    else:
        assert spec.module is not None  # a function target without a file is module:function
        if os.getcwd() not in sys.path:  # as `python -m`: modules of the current folder are importable
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(spec.module)
        except SyntaxError as err:
            raise UsageError(f"module '{spec.module}' has a syntax error at line {err.lineno}: {err.msg}") from None
        except ImportError as err:
            raise UsageError(
                f"cannot import module '{spec.module}': {err}; check the name and that it is on PYTHONPATH"
            ) from None
    obj: Any = module
    for part in spec.function.split("."):
        if not hasattr(obj, part):
            available = sorted(n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n)))
            shown = ", ".join(available[:12]) or "none"
            raise UsageError(
                f"target '{spec.text}': no function '{spec.function}' there; callables defined: {shown}"
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise UsageError(f"target '{spec.text}': '{spec.function}' is a {type(obj).__name__}, not a function")
    return obj


@contextlib.contextmanager
def script_context(spec: TargetSpec) -> Iterator[None]:
    """sys.argv and sys.path as ``python script.py ARGS`` would set them; restored afterwards."""
    assert spec.path is not None  # every script target has its file
    old_argv, old_path = sys.argv[:], sys.path[:]
    sys.argv = [spec.path, *spec.script_args]
    sys.path.insert(0, os.path.dirname(spec.path))
    try:
        yield
    finally:
        sys.argv[:] = old_argv
        sys.path[:] = old_path


def run_script(spec: TargetSpec) -> dict:
    """Run a script TARGET as ``__main__``, unmodified; returns its globals.

    Install instrumentation before calling this and remove it afterwards: the script imports jax itself.
    A ``sys.exit(0)`` in the script counts as success.
    """
    assert spec.path is not None  # every script target has its file
    check_syntax(spec.path)
    with script_context(spec):
        try:
            return runpy.run_path(spec.path, run_name="__main__")
        except SystemExit as done:
            if done.code in (None, 0):
                return {}
            raise


# ----------------------------------------------------------------------------------------------------------
# Inputs of a function target
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArraySpec:
    """One entry of ``--args``: a dtype name (canonical, e.g. 'f32') and a shape. For a PRNG key the dtype is
    ``key`` (typed, ``jax.random.key``) or ``PRNGKey`` (raw uint32 key data, ``jax.random.PRNGKey``), with the
    seed it is made from (None: ``--seed``); a shape holds that many keys split from it."""

    dtype: str
    shape: tuple[int, ...]
    seed: int | None = None

    @property
    def is_key(self) -> bool:
        return self.dtype in KEY_KINDS

    def __str__(self) -> str:
        seed = "" if self.seed is None else f":{self.seed}"
        return f"{self.dtype}{seed}[{','.join(map(str, self.shape))}]"


KEY_KINDS = ("key", "PRNGKey")  # --args spellings of a typed and of a raw PRNG key


DTYPE_ALIASES = {
    "bool": "bool", "b1": "bool", "pred": "bool",
    "i8": "i8", "int8": "i8", "i16": "i16", "int16": "i16", "i32": "i32", "int32": "i32",
    "i64": "i64", "int64": "i64", "u8": "u8", "uint8": "u8", "u16": "u16", "uint16": "u16",
    "u32": "u32", "uint32": "u32", "u64": "u64", "uint64": "u64",
    "f16": "f16", "float16": "f16", "bf16": "bf16", "bfloat16": "bf16",
    "f32": "f32", "float32": "f32", "f64": "f64", "float64": "f64",
}


def numpy_dtype(name: str) -> np.dtype:
    """numpy dtype for a canonical dtype name ('bf16' comes from ml_dtypes, a jax dependency)."""
    import numpy as np  # heavy: only where arrays are made or read

    if name == "bf16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(_NUMPY_NAMES[name])


_NUMPY_NAMES = {
    "bool": "bool", "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64", "u8": "uint8",
    "u16": "uint16", "u32": "uint32", "u64": "uint64", "f16": "float16", "f32": "float32", "f64": "float64",
}


def short_dtype(dtype: Any) -> str:
    """'f32' for float32, 'bf16' for bfloat16, ...: the contract's dtype spelling."""
    import numpy as np  # heavy: only where arrays are made or read

    name = np.dtype(dtype).name
    return {"bool": "bool", "bfloat16": "bf16"}.get(name) or (
        name.replace("float", "f").replace("uint", "u").replace("int", "i"))


_ARRAY_SPEC = re.compile(r"^([A-Za-z0-9]+)\[([0-9,\s]*)\]$")
_KEY_SPEC = re.compile(r"^(key|prngkey)(?::(\d+))?(?:\[([0-9,\s]*)\])?$", re.IGNORECASE)
_ARGS_EXAMPLE = "\"f32[8,128] i32[] bf16[4] key\""


def parse_args_spec(text: str) -> list[ArraySpec]:
    """Parse ``--args "f32[8,128] i32[8] bf16[4] f32[] key:0 PRNGKey"`` into ArraySpecs; UsageError on anything
    else. A key is ``key`` (``jax.random.key(--seed)``), ``key:N`` (``jax.random.key(N)``), ``key[4]`` (4 keys
    split from it); ``PRNGKey`` likewise, as raw key data.

    Example:
        >>> [str(s) for s in parse_args_spec("f32[2,3] key:7 PRNGKey[4]")]
        ['f32[2,3]', 'key:7[]', 'PRNGKey[4]']
    """
    specs = []
    for token in re.findall(r"[^\s\[\]]+\[[^\]]*\]|\S+", text or ""):
        key = _KEY_SPEC.match(token)
        if key:
            kind = "key" if key.group(1).lower() == "key" else "PRNGKey"  # (any case, as dtypes)
            seed = int(key.group(2)) if key.group(2) is not None else None
            specs.append(ArraySpec(kind, _dims(key.group(3) or ""), seed))
            continue
        match = _ARRAY_SPEC.match(token)
        if not match:
            raise UsageError(
                f"--args '{text}': cannot read '{token}'; write each argument as dtype[dims] (or key), "
                f"e.g. {_ARGS_EXAMPLE}"
            )
        dtype = DTYPE_ALIASES.get(match.group(1).lower())
        if dtype is None:
            raise UsageError(
                f"--args '{text}': unknown dtype '{match.group(1)}'; "
                f"use one of {', '.join(sorted(set(DTYPE_ALIASES.values())))}, or key / PRNGKey for a PRNG key"
            )
        specs.append(ArraySpec(dtype, _dims(match.group(2))))
    if not specs:
        raise UsageError(f"--args is empty; give one dtype[dims] per argument, e.g. {_ARGS_EXAMPLE}")
    return specs


def _dims(text: str) -> tuple[int, ...]:
    return tuple(int(d.strip()) for d in text.split(",") if d.strip())


def random_inputs(specs: Sequence[ArraySpec], seed: int = 0) -> tuple[Any, ...]:
    """Seeded random numpy arrays for ArraySpecs: normal floats, small integers, fair booleans; PRNG keys
    (made with jax: this starts its backend) from their own seed, or ``seed``."""
    import numpy as np  # heavy: only where arrays are made or read

    rng = np.random.default_rng(seed)
    out: list[Any] = []
    for spec in specs:
        if spec.is_key:
            out.append(_keys(spec, seed))
            continue
        dtype = numpy_dtype(spec.dtype)
        value: np.ndarray
        if spec.dtype == "bool":
            value = rng.random(spec.shape) < 0.5
        elif spec.dtype.startswith("u"):
            value = rng.integers(0, 10, spec.shape)
        elif spec.dtype.startswith("i"):
            value = rng.integers(-10, 10, spec.shape)
        else:
            value = rng.standard_normal(spec.shape)
        out.append(np.asarray(value).astype(dtype))
    return tuple(out)


def _keys(spec: ArraySpec, seed: int) -> Any:
    """``jax.random.key(seed)``, or ``math.prod(shape)`` keys split from it in that shape; raw key data (numpy,
    as ``jax.random.PRNGKey`` gives it) for ``PRNGKey``."""
    import math

    import jax
    import numpy as np

    key = jax.random.key(spec.seed if spec.seed is not None else seed)
    if spec.shape:
        key = jax.random.split(key, math.prod(spec.shape)).reshape(spec.shape)
    return np.asarray(jax.random.key_data(key)) if spec.dtype == "PRNGKey" else key


_NPZ_KEY = re.compile(r"^(?:arg|arr_)(\d+)$")
# The npz entry describing inputs that are not a flat list of plain arrays (see :func:`save_npz_inputs`).
TREE_KEY = "__jaxdbg_tree__"


@dataclass(frozen=True)
class FlatInputs:
    """A function target's positional inputs as array leaves plus a JSON-able description of their nesting.

    ``args`` holds one node per positional argument; a node is ``{"leaf": i}`` (``leaves[i]``), ``{"tuple":
    [...]}``, ``{"list": [...]}``, ``{"dict": [[key, node], ...]}``, ``{"none": None}`` or ``{"scalar": v}``
    (a Python bool, int or float, kept weakly typed). Only containers that plain Python can rebuild are taken:
    a reproducer written from them needs no user code.
    """

    leaves: tuple[np.ndarray, ...]
    args: tuple[Any, ...]

    @property
    def flat(self) -> bool:
        """Every argument is itself an array (the classic ``arg0, arg1, ...`` npz)."""
        return all("leaf" in node for node in self.args)

    def rebuild(self, leaves: Sequence[Any] | None = None) -> tuple[Any, ...]:
        """The positional arguments, with ``leaves`` (default: these) in place of the array leaves."""
        values = self.leaves if leaves is None else leaves
        return tuple(_rebuild(node, values) for node in self.args)


def flatten_inputs(inputs: Sequence[Any]) -> FlatInputs:
    """Describe positional inputs as leaves and nesting; UsageError for containers plain Python cannot rebuild.

    Example:
        >>> import numpy as np
        >>> flat = flatten_inputs(([(np.ones(2), np.zeros(2))], np.float32(3.0), 0.5))
        >>> len(flat.leaves), flat.args[0], flat.args[2]
        (3, {'list': [{'tuple': [{'leaf': 0}, {'leaf': 1}]}]}, {'scalar': 0.5})
    """
    import numpy as np  # heavy: only where arrays are made or read

    from jaxdbg.storable import is_key  # imports numpy (heavy)

    leaves: list[Any] = []  # numpy arrays, and typed PRNG keys as they are

    def node(value: Any, where: str) -> Any:
        if value is None:
            return {"none": None}
        if isinstance(value, (bool, int, float)) and not isinstance(value, np.generic):
            return {"scalar": value}
        if isinstance(value, tuple) and not hasattr(value, "_fields"):
            return {"tuple": [node(v, f"{where}[{i}]") for i, v in enumerate(value)]}
        if isinstance(value, list):
            return {"list": [node(v, f"{where}[{i}]") for i, v in enumerate(value)]}
        if isinstance(value, dict) and all(isinstance(k, (str, int)) for k in value):
            return {"dict": [[k, node(v, f"{where}[{k!r}]")] for k, v in value.items()]}
        if is_key(value):  # a typed PRNG key: saved as its key data (jaxdbg.storable)
            leaves.append(value)
            return {"leaf": len(leaves) - 1}
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            array = np.asarray(value)
            if array.dtype != object:
                leaves.append(array)
                return {"leaf": len(leaves) - 1}
        raise UsageError(f"input {where} is a {type(value).__name__}; repro takes arrays, Python numbers and "
                         "tuples, lists and dicts of them (rebuild other containers inside the function)")

    args = tuple(node(value, f"arg{i}") for i, value in enumerate(inputs))
    return FlatInputs(tuple(leaves), args)


def _rebuild(node: Any, leaves: Sequence[Any]) -> Any:
    if "leaf" in node:
        return leaves[node["leaf"]]
    if "tuple" in node:
        return tuple(_rebuild(n, leaves) for n in node["tuple"])
    if "list" in node:
        return [_rebuild(n, leaves) for n in node["list"]]
    if "dict" in node:
        return {k: _rebuild(n, leaves) for k, n in node["dict"]}
    return node.get("scalar")  # {"none": None} too


def save_npz_inputs(path: str, inputs: Sequence[Any] | FlatInputs) -> FlatInputs:
    """Write inputs as ``arg0, arg1, ...`` leaves; nesting and the dtypes npz cannot keep go into ``TREE_KEY``
    (JSON), so :func:`load_npz_inputs` gives back the same arguments. Never pickles."""
    import json

    import numpy as np  # heavy: only where arrays are made or read

    from jaxdbg.storable import storable  # imports numpy (heavy)

    flat = inputs if isinstance(inputs, FlatInputs) else flatten_inputs(inputs)
    arrays: dict[str, Any] = {}  # (Any: np.savez's **kwargs are typed against its allow_pickle flag)
    dtypes = {}
    for i, leaf in enumerate(flat.leaves):
        arrays[f"arg{i}"], special = storable(leaf)
        if special:
            dtypes[f"arg{i}"] = special
    if not flat.flat or dtypes:
        arrays[TREE_KEY] = np.array(json.dumps({"args": list(flat.args), "dtypes": dtypes}))
    np.savez(path, **arrays)
    return flat


def load_npz_inputs(path: str) -> tuple[Any, ...]:
    """Arrays ``arg0, arg1, ...`` (or numpy's default ``arr_0, ...``) of an npz, in positional order, no pickle;
    an npz written by :func:`save_npz_inputs` gives back its nesting and dtypes."""
    import numpy as np  # heavy: only where arrays are made or read

    if not os.path.exists(path):
        raise UsageError(f"--inputs '{path}': no such file; check the path")
    if not zipfile.is_zipfile(path):  # np.load would otherwise try to read it as a pickle
        raise UsageError(f"--inputs '{path}': not a readable npz file (not a zip archive); save it with np.savez")
    try:
        with np.load(path, allow_pickle=False) as data:
            keys = [k for k in data.files if k != TREE_KEY]
            order = [_NPZ_KEY.match(k) for k in keys]
            if not keys or not all(order):
                raise UsageError(
                    f"--inputs '{path}': arrays must be named arg0, arg1, ... (found {', '.join(keys) or 'none'}); "
                    "save them with np.savez(path, arg0=x, arg1=y)"
                )
            ranked = sorted(zip((int(m.group(1)) for m in order if m is not None), keys))
            arrays = tuple(data[key] for _, key in ranked)
            tree = str(data[TREE_KEY]) if TREE_KEY in data.files else None
    except UsageError:
        raise
    except ValueError as err:
        if "pickle" in str(err).lower() or "object" in str(err).lower():
            raise UsageError(
                f"--inputs '{path}': it holds Python objects, which jaxdbg will not unpickle; save plain numeric arrays"
            ) from None
        raise UsageError(f"--inputs '{path}': not a readable npz file ({err}); save it with np.savez") from None
    except (OSError, zipfile.BadZipFile, EOFError) as err:
        raise UsageError(f"--inputs '{path}': not a readable npz file ({err}); save it with np.savez") from None
    if tree is None:
        return arrays
    return _described(path, arrays, [key for _, key in ranked], tree)


def _described(path: str, arrays: tuple[np.ndarray, ...], keys: list[str], text: str) -> tuple[Any, ...]:
    """Arguments rebuilt from the leaves and the ``TREE_KEY`` description :func:`save_npz_inputs` wrote."""
    import json

    from jaxdbg.storable import restore  # imports numpy (heavy)

    try:
        tree = json.loads(text)
        leaves = [restore(a, tree["dtypes"].get(k)) for k, a in zip(keys, arrays)]
        return FlatInputs(tuple(leaves), tuple(tree["args"])).rebuild()
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as err:
        raise UsageError(f"--inputs '{path}': its {TREE_KEY} entry is unreadable ({err}); write it with "
                         "jaxdbg.target.save_npz_inputs or save plain arrays arg0, arg1, ...") from None


def check_inputs(spec: TargetSpec, inputs: str | None, args: str | None) -> None:
    """Fail fast (exit 2) on a target's ``--inputs``/``--args`` that cannot work, without running user code: the
    one place every command validates them (a script takes neither; a function exactly one, well formed).

    Example:
        >>> step = TargetSpec("function", "model.py::step", "/abs/model.py", function="step")
        >>> check_inputs(step, None, "f32[8] i32[]")   # well formed: nothing to say
        >>> check_inputs(step, None, None)
        Traceback (most recent call last):
        ...
        jaxdbg._errors.UsageError: a function target needs inputs: pass --args "f32[8,128] ..." or --inputs ...
    """
    if spec.is_script:
        if args or inputs:
            raise UsageError("--args/--inputs are for a function target (file.py::func); a script makes its own "
                             "inputs")
        return
    if not inputs and not args and takes_no_inputs(spec):
        return  # def f(): called with nothing
    check_one_input_source(inputs, args)
    if args:
        parse_args_spec(args)
    elif inputs and "::" in inputs:
        parse_target(inputs)
    elif inputs and inputs.endswith(".npz"):
        load_npz_inputs(inputs)
    else:
        raise UsageError(f"--inputs '{inputs}': expected file.py::make_inputs or a .npz file")


def check_one_input_source(inputs: str | None, args: str | None) -> None:
    """A function target's inputs come from exactly one of ``--inputs`` and ``--args``."""
    if inputs and args:
        raise UsageError("give either --args or --inputs, not both")
    if not inputs and not args:
        raise UsageError(
            "a function target needs inputs: pass --args \"f32[8,128] ...\" or --inputs file.py::make_inputs "
            "or data.npz (only a function whose def takes no arguments needs none)"
        )


def takes_no_inputs(spec: TargetSpec) -> bool:
    """Whether the function of a function target is seen, without running user code, to take no arguments: its
    file (``file.py::f``, or ``module:f``'s source found on ``sys.path``) defines it at top level with a
    ``def`` that has no required parameter.

    Example:
        >>> takes_no_inputs(parse_target("getpass:getuser")), takes_no_inputs(parse_target("json:dumps"))
        (True, False)
    """
    path = spec.path or (_module_source(spec.module) if spec.module else None)
    if path is None or spec.function is None or "." in spec.function:
        return False  # (a method, or a module not found without importing it: inputs are asked for)
    try:
        with open(path, "rb") as handle:
            tree = ast.parse(handle.read(), path)
    except (OSError, SyntaxError, ValueError):
        return False
    defs = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == spec.function]
    if not defs:
        return False
    params = defs[-1].args  # (the last definition is the one the module ends with)
    return (len(params.posonlyargs) + len(params.args) == len(params.defaults)
            and all(default is not None for default in params.kw_defaults))


def _module_source(module: str) -> str | None:
    """The file of ``module`` on ``sys.path`` (and the current folder), found without importing anything."""
    parts = module.split(".")
    for folder in [os.getcwd(), *sys.path]:
        base = os.path.join(folder or os.getcwd(), *parts)
        for path in (base + ".py", os.path.join(base, "__init__.py")):
            if os.path.isfile(path):
                return path
    return None


def load_inputs(inputs: str | None, args: str | None, seed: int = 0) -> tuple[Any, ...]:
    """The positional inputs of a function target from ``--inputs`` or ``--args``; none when neither is given
    (a function that takes none: :func:`check_inputs` lets only such a target through without them)."""
    if not inputs and not args:
        return ()
    check_one_input_source(inputs, args)
    if args:
        return random_inputs(parse_args_spec(args), seed)
    assert inputs is not None  # one of the two, checked above
    if "::" in inputs:
        maker = load_function(parse_target(inputs))
        try:
            value = maker()
        except Exception as err:
            raise TargetFailedError(f"--inputs '{inputs}' raised {type(err).__name__}: {err}") from err
        return value if isinstance(value, tuple) else (value,)
    if inputs.endswith(".npz"):
        return load_npz_inputs(inputs)
    raise UsageError(f"--inputs '{inputs}': expected file.py::make_inputs or a .npz file")


@dataclass(frozen=True)
class ScriptRun(Request):
    """A contained run of a script TARGET, plainly (``run_contained(ScriptRun(parse_target("train.py")))``)."""

    spec: TargetSpec


@handles(ScriptRun)
def script_job(request: ScriptRun, channel: Any) -> None:
    """Run the script TARGET as ``__main__``; :class:`~jaxdbg.protocol.Done` when it ends."""
    run_script(request.spec)
    channel.send(Done())


def check_arity(fn: Callable, inputs: Sequence[Any], name: str | None = None) -> None:
    """Raise :class:`UsageError` (exit 2) when ``inputs`` do not fit ``fn``'s parameters: bad input, not a crash.

    Example:
        >>> check_arity(lambda w, x: w, (1.0,), "step")
        Traceback (most recent call last):
        ...
        jaxdbg._errors.UsageError: the inputs do not fit step(w, x): missing a required argument: 'x'; give one ...
    """
    import inspect

    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C callable: let the call itself decide
        return
    try:
        signature.bind(*inputs)
    except TypeError as err:
        label = name or getattr(fn, "__name__", "the function")
        raise UsageError(f"the inputs do not fit {label}{signature}: {err}; "
                         f"give one input per parameter with --args or --inputs") from None
