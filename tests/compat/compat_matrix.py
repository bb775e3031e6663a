"""The compatibility matrix: JAX features (rows) against jaxdbg's commands (columns).

Each row is one small program in this folder, written the way a user of JAX, Flax, Equinox or Optax
writes that feature, with a bug that makes a NaN at a line marked ``# NaN`` (and, where a chain of
Inf values leads to it, the lines those come from, by their own markers). Every command runs the same
program, and each cell is that command's expected answer:

- ``nan-hunt``: the origin (kind, operation, pass, line, call, the path through the feature; on some rows the
  names its bundle gives the call's inputs);
- ``profile``: the row's jitted functions found, with their compiles and calls (and recompile causes);
- ``repro``: a verified reproducer of the NaN, cut from the jitted computation (run on a few rows only);
- ``watch``: ``jaxdbg.watch`` raises ``NonFiniteError`` with the same origin;
- ``check``: the row as a ``[tool.jaxdbg.check]`` nan-hunt check fails, at the origin's line;
- ``memory``: the row's jitted functions found, each compile with a positive peak and its largest buffers,
  the arguments among them named as the user passed them (every row in one ``jaxdbg memory`` run);
- ``hang-hunt``: the program finished, no stall (exit 0), every call of the row's jitted functions in the flight
  record with its program, and the collectives of the rows that run them (every row in one run).

A cell that does not work carries a :class:`Known`: a bug, being fixed (its test is ``xfail(strict=True)``,
so it fails loudly once the fix lands and the entry must go). ``tests/test_compat_matrix.py``
runs the cells; ``scripts/compat_page.py`` writes ``docs/compat.md`` from this file.

A new row: a program ``tests/compat/<name>.py`` with a ``main()`` that runs a few steps (every command runs
it: as a script, and imported by ``profile_all.py`` (for profile, memory and hang-hunt) and ``watch_all.py``,
so no global state that another row could see, e.g. ``jax.enable_x64`` as a context, not a config update), one
``# NaN`` marker, a :class:`Row` here, then ``python scripts/compat_page.py``. Build the bug so that only one
operation can make the NaN on any CPU (0 / 0, log or sqrt of a negative value, inf - inf): never pin which op
of an overflowing chain goes first; where the feature needs such a chain (a run diverging), list every op that
can legitimately make the first non-finite value in ``or_origins`` (and ``watch_origins``). Each row costs
about 6 s of CPU for its check, 2.5 s under the watch, 1 s in profile and about 0.7 s under memory and under
hang-hunt each.
"""

from __future__ import annotations

from dataclasses import dataclass, field

COLUMNS = ("nan-hunt", "profile", "repro", "watch", "check", "memory", "hang-hunt")


@dataclass(frozen=True)
class Op:
    """An operation the answer must name: ``kind`` (nan/inf), primitive, pass, and the marker of its line."""

    kind: str
    primitive: str
    pass_: str
    marker: str = "# NaN"


@dataclass(frozen=True)
class Function:
    """A jitted function profile must find in the row's program (by name and file; two of one name are matched by
    their figures: ``jax.jit(loss)`` and ``jax.jit(jax.value_and_grad(loss))`` are both 'loss')."""

    name: str
    compiles: int
    calls: int
    recompile: str | None = None  # words of the recompile cause, when it compiles twice


@dataclass(frozen=True)
class Known:
    """A cell, or one ``aspect`` of it, that does not work: a bug (``owner`` is the branch fixing it, or
    None when this matrix found it and nobody is on it yet)."""

    reason: str
    owner: str | None = None
    jax: str | None = None  # "0.10" or "0.11": only on that jax version
    aspect: str | None = None  # e.g. "device": the rest of the cell works

    def applies(self, jax_version: str) -> bool:
        return self.jax is None or jax_version.startswith(self.jax + ".") or jax_version == self.jax


@dataclass(frozen=True)
class Row:
    name: str  # the program: tests/compat/<name>.py
    feature: str
    origin: Op
    call: int  # the origin's call index
    functions: tuple[Function, ...]
    path: str | None = None  # an element the origin's path must hold, e.g. "scan[iteration=3]"
    chain: tuple[Op, ...] = ()
    dtype: str | None = None  # the dtype of the origin's first input
    device: str | None = None  # the device holding the first non-finite value
    explanation: tuple[str, ...] = ()  # words the explanation must hold
    leaves: tuple[str, ...] = ()  # names nan-hunt's bundle must give inputs of the origin's call
    hint: str | None = None  # words the first hint must hold
    collectives: tuple[str, ...] = ()  # the collectives (HLO ops) hang-hunt's flight record names in the row's programs
    repro: bool = False
    # Other (origin, call) the answer may name, each as right as ``origin``: where a diverging run overflows, which
    # op of the chain makes the NaN first is the CPU's arithmetic (a dot of infinities, its gradient, the update).
    or_origins: tuple[tuple[Op, int], ...] = ()
    # The watch's (origin, call), where they are not nan-hunt's: it raises at the first non-finite output, and a
    # diverging run overflows to Inf calls before nan-hunt's NaN.
    watch_origins: tuple[tuple[Op, int], ...] = ()
    known: dict[str, tuple[Known, ...]] = field(default_factory=dict)  # column -> what does not work there

    def origins(self, column: str = "nan-hunt") -> tuple[tuple[Op, int], ...]:
        """Each (origin, call) ``column``'s answer may name."""
        if column == "watch" and self.watch_origins:
            return self.watch_origins
        return ((self.origin, self.call), *self.or_origins)

    def known_in(self, column: str, jax_version: str, aspect: str | None = None) -> Known | None:
        """The entry that makes this cell (or its ``aspect``) not work on this jax version, if any."""
        return next((k for k in self.known.get(column, ()) if k.aspect == aspect and k.applies(jax_version)), None)


def _train(calls: int = 4, compiles: int = 1, recompile: str | None = None) -> tuple[Function, ...]:
    return (Function("train_step", compiles, calls, recompile),)


ROWS: tuple[Row, ...] = (
    Row("jit_options", "jit: nested jit, static and donated arguments", Op("nan", "div", "forward"), 2, _train(),
        path="jit(layer_norm)", explanation=("variance (mean square) is 0", "the epsilon added to it is 0"),
        hint="give the normalisation a positive epsilon"),
    Row("pmap_step", "jax.pmap with lax.pmean", Op("nan", "log", "forward"), 2,
        _train(compiles=2, recompile="sharding"), path="pmap", device="cpu:7", collectives=("all-reduce",)),
    Row("shard_map_manual", "shard_map, every mesh axis manual (pmean; jnp.linalg.norm in the body)",
        Op("nan", "div", "forward"), 2, _train(compiles=2, recompile="sharding changed"), path="shard_map",
        device="cpu:7", collectives=("all-reduce",)),
    Row("shard_map_auto", "shard_map, manual over one axis and auto over another (axis_names)",
        Op("nan", "log", "forward"), 2, _train(), path="shard_map", collectives=("all-reduce",)),
    Row("vmap_per_example", "vmap (per-example gradients)", Op("nan", "div", "forward"), 2, _train(), path="vmap"),
    Row("scan_rnn", "lax.scan", Op("nan", "log", "forward"), 1, _train(calls=3), path="scan[iteration=3]"),
    Row("while_power", "lax.while_loop / fori_loop (traced bound)", Op("nan", "div", "forward"), 1,
        (Function("normalise", 1, 3),), path="while[iteration=2]"),
    Row("cond_switch", "lax.cond / lax.switch", Op("nan", "log", "forward"), 2, _train(), path="cond[branch=2]"),
    Row("remat_policy", "jax.checkpoint with a save_only_these_names policy", Op("nan", "mul", "backward"), 2,
        _train(), path="checkpoint", chain=(Op("inf", "div", "backward"),)),
    Row("custom_vjp_norm", "jax.custom_vjp (NaN in the backward rule)", Op("nan", "div", "backward"), 1, _train(),
        path="custom_vjp_bwd(row_norm_bwd)"),
    Row("custom_jvp_softplus", "jax.custom_jvp (NaN in the derivative rule)", Op("nan", "div", "backward"), 2,
        _train(), chain=(Op("inf", "exp", "backward"),)),
    Row("callbacks", "pure_callback, io_callback, debug.callback", Op("nan", "pure_callback", "forward"), 2,
        _train()),
    Row("keys_typed", "typed PRNG keys (jax.random.key)", Op("nan", "sqrt", "forward"), 2, _train()),
    Row("keys_raw", "raw uint32 PRNG keys (jax.random.PRNGKey)", Op("nan", "div", "backward"), 2, _train(),
        chain=(Op("inf", "div", "forward"),)),
    Row("dtype_bf16", "bfloat16", Op("nan", "sub", "forward"), 2, _train(), dtype="bf16",
        chain=(Op("inf", "convert_element_type", "forward", "# padding: -inf"),)),
    Row("dtype_f16", "float16 (overflow)", Op("nan", "sub", "forward"), 2, _train(), dtype="f16",
        chain=(Op("inf", "dot_general", "forward", "# the root cause"),), explanation=("float16 overflow",),
        hint="float32"),
    Row("dtype_f64", "float64 (jax.enable_x64)", Op("nan", "sqrt", "forward"), 1,
        (Function("neg_log_likelihood", 1, 3),), dtype="f64"),
    Row("dtype_int", "integer arrays (int32 tokens)", Op("nan", "div", "forward"), 2, _train()),
    Row("dtype_complex", "complex64 (jnp.fft)", Op("nan", "div", "forward"), 1, (Function("phase_correlation", 1, 3),),
        dtype="complex64"),
    Row("flax_struct_state", "Flax struct dataclasses (Linen TrainState)", Op("nan", "log", "forward"), 2, _train()),
    Row("eqx_module", "Equinox Modules (eqx.filter_jit)", Op("nan", "log", "forward"), 2,
        _train(calls=5, compiles=2, recompile="weak type")),
    Row("eqx_module_call", "Equinox module jitted and called directly (eqx.filter_jit(model)(x))",
        Op("nan", "log", "forward"), 0, (Function("Head", 1, 3),), leaves=("x", "Head.mlp.layers[0].weight"),
        repro=True),
    Row("nnx_graph_state", "Flax NNX graph state (nnx.jit, BatchNorm, nnx.Optimizer)", Op("nan", "div", "forward"),
        2, _train()),
    Row("sharded_dp", "arrays sharded over 8 CPU devices (NamedSharding)", Op("nan", "div", "forward"), 2, _train(),
        device="cpu:7", repro=True, collectives=("all-reduce",)),
    Row("associative_scan_lru", "lax.associative_scan (a linear recurrent unit)", Op("nan", "sqrt", "forward"), 2,
        _train()),
    Row("linalg_gp", "jnp.linalg.cholesky / cho_solve (Gaussian-process regression)", Op("nan", "div", "forward"), 2,
        (Function("fit_step", 1, 4),), explanation=("The zero denominator was made by `exp`", "underflowed to 0")),
    Row("eigh_spectral", "jnp.linalg.eigh (a spectral loss; its gradient at repeated eigenvalues)",
        Op("nan", "mul", "backward"), 2, _train(calls=3), path="jit(eigh)",
        chain=(Op("inf", "integer_pow", "backward"),), explanation=("derivative of `eigh`", "degenerate")),
    Row("ode_neural", "jax.experimental.ode.odeint (a neural ODE, adjoint backward)", Op("nan", "sqrt", "forward"), 2,
        _train(calls=3), path="custom_vjp(_odeint)"),
    Row("pallas_softmax", "Pallas kernel (pallas_call in interpret mode, no grid)", Op("nan", "sub", "forward"), 1,
        (Function("attend", 1, 3),), path="pallas(softmax_kernel)",
        chain=(Op("inf", "convert_element_type", "forward", "# mask: -inf"),)),
    Row("pallas_grid", "Pallas kernel with a grid and BlockSpecs (a block of rows per program)",
        Op("nan", "div", "forward"), 2, _train(), path="pallas(rms_norm_kernel)[program=2]"),
    Row("shard_map_ring", "shard_map with a ring of lax.ppermute (blockwise ring attention)",
        Op("nan", "sub", "forward"), 2, _train(compiles=2, recompile="sharding changed"), path="shard_map",
        device="cpu:0", collectives=("collective-permute", "all-reduce"),
        chain=(Op("inf", "convert_element_type", "forward", "# padding: -inf"),)),
    Row("nnx_scan_layers", "Flax NNX scan over layers (nnx.vmap-stacked blocks applied with nnx.scan)",
        Op("nan", "div", "forward"), 2, _train(), path="scan[iteration=0]"),
    Row("sparse_gcn", "jax.experimental.sparse BCOO (sparse @ dense in a graph layer)", Op("nan", "div", "forward"),
        2, _train(), explanation=("the argument adj.data",)),
    Row("checkify_guard", "jax.experimental.checkify (jit of checkify with user checks)",
        Op("nan", "log", "forward"), 2, (Function("checkify(step)", 1, 4),)),
    Row("lax_map_chunks", "lax.map with batch_size (a scan over vmapped chunks), jax.checkpoint inside",
        Op("nan", "sqrt", "forward"), 1, (Function("kernel_rows", 1, 3),), path="scan[iteration=2]"),
    Row("vmap_cond_select", "lax.cond under vmap (a select of both branches), in_axes as dicts",
        Op("nan", "log", "forward"), 2, _train(), path="vmap",
        explanation=("into a select", "computes both branches", "in a result that was selected")),
    Row("aot_compiled", "ahead-of-time compiled: jax.jit(f).lower(...).compile(), the Compiled called in a loop",
        Op("nan", "log", "forward"), 2, _train(), path="jit(train_step)"),
    Row("eager_grad", "jax.value_and_grad called eagerly, outside jit (only the update jitted)",
        Op("nan", "mul", "backward"), 2, (Function("sgd_update", 1, 4),), path="eager",
        chain=(Op("inf", "div", "backward"),), explanation=("derivative of a norm at the zero vector",),
        known={"watch": (Known("the watch checks jitted calls only (no eager operations, for its cost): the NaN "
                               "that eager jax.grad makes reaches it as an input (argument `grad`) of the jitted "
                               "update, reported as kind 'input' (a hint says to run it under jaxdbg nan-hunt, "
                               "which checks eager operations)"),)}),
    Row("jit_loss_and_grad", "jax.jit(loss) beside jax.jit(jax.value_and_grad(loss)) (evaluation and training from "
        "one loss), an SGD run diverging to Inf, then NaN", Op("nan", "dot_general", "forward"), 22,
        (Function("loss", 1, 24), Function("value_and_grad(loss)", 1, 24)), explanation=("the run was diverging",),
        or_origins=((Op("nan", "dot_general", "backward"), 23), (Op("nan", "sub", "forward", "# update"), 0)),
        watch_origins=((Op("inf", "integer_pow", "forward", "# Inf"), 17),
                       (Op("inf", "reduce_sum", "forward", "# Inf"), 17))),
)

DEVICES = 8  # every program runs with this many CPU devices
