"""Every row of the compatibility matrix under `jaxdbg.watch`, in one process (tests/test_compat_matrix.py).

`python watch_all.py OUT ROW [ROW ...]` imports each row's program and runs its `main()` inside
`jaxdbg.watch(out=OUT/ROW)`, and writes OUT/watch.json: per row, the NonFiniteError's report (the origin
the watch found), or the exception that ended the row instead (type, message, traceback), or nothing when
the row finished without one.
"""
import importlib
import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jaxdbg


def watch_row(row, out):
    try:
        with jaxdbg.watch(out=os.path.join(out, row)):
            importlib.import_module(row).main()
    except jaxdbg.NonFiniteError as err:
        return {"raised": "NonFiniteError", "report": err.report, "path": err.path}
    except Exception as err:  # noqa: BLE001 - the row's answer: what the user would have seen instead
        return {"raised": type(err).__name__, "message": str(err), "traceback": traceback.format_exc()}
    return {"raised": None}


if __name__ == "__main__":
    out, rows = sys.argv[1], sys.argv[2:]
    results = {row: watch_row(row, out) for row in rows}
    with open(os.path.join(out, "watch.json"), "w") as handle:
        json.dump(results, handle, default=str)
