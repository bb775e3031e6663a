"""Every row of the compatibility matrix in one process, the target of one `jaxdbg profile`, one `jaxdbg memory` and
one `jaxdbg hang-hunt` run (tests/test_compat_matrix.py).

`python profile_all.py ERRORS.json ROW [ROW ...]` imports each row's program and runs its `main()`; a row
that raises does not stop the others: its exception is written to ERRORS.json (row -> "Type: message"),
so the test of that cell can say what went wrong.
"""
import importlib
import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def run(rows):
    errors = {}
    for row in rows:
        try:
            importlib.import_module(row).main()
        except Exception as err:  # noqa: BLE001 - a row's failure is that cell's answer, not the end of the run
            errors[row] = f"{type(err).__name__}: {err}\n{traceback.format_exc()}"
    return errors


if __name__ == "__main__":
    with open(sys.argv[1], "w") as handle:
        json.dump(run(sys.argv[2:]), handle)
