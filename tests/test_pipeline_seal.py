"""Message authentication between the processes of a real pipeline job: what each mode signs, and that a
receiver refuses a note or array that does not verify (the two-process run is in test_pipeline_real_processes)."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

from jaxdbg.pipeline.seal import MessageRefused, Seal, agree, array_digest

KEY = bytes(range(32))
NOTE = {"kind": "data", "to": 2, "uuid": 5, "shape": [4, 16], "dtype": "float32", "arrival": 0.25, "task": 9}
WHERE = "run 0: process 0 -> 1 #3"


def test_full_seals_the_note_and_the_arrays_bytes():
    seal, array = Seal(KEY, "full"), np.arange(64, dtype=np.float32).reshape(4, 16)
    text = seal.wrap(NOTE, WHERE, array)
    body = seal.unwrap(text, WHERE, "process 0")
    assert {k: body[k] for k in NOTE} == NOTE and body["digest"] == array_digest(array)
    seal.check_array(body, array.copy(), "process 0", WHERE)
    altered = array.copy()
    altered[1, 2] += 1e-3
    with pytest.raises(MessageRefused, match="not the one its note was sealed for"):
        seal.check_array(body, altered, "process 0", WHERE)
    with pytest.raises(MessageRefused, match="not the one"):  # same bytes, another shape
        seal.check_array(body, array.reshape(16, 4), "process 0", WHERE)


@pytest.mark.parametrize("mode", ["full", "notes"])
def test_an_altered_replayed_or_foreign_note_is_refused(mode):
    seal = Seal(KEY, mode)
    text = seal.wrap(NOTE, WHERE, np.zeros(3))
    sealed = json.loads(text)
    forged = json.dumps({**sealed, "note": sealed["note"].replace('"task": 9', '"task": 10')})
    refused = r"refused a message from process 0 \(run 0: process 0 -> 1 #3\): its HMAC"
    with pytest.raises(MessageRefused, match=refused):
        seal.unwrap(forged, WHERE, "process 0")
    with pytest.raises(MessageRefused, match="does not verify"):  # the same note replayed at another place
        seal.unwrap(text, "run 1: process 0 -> 1 #3", "process 0")
    with pytest.raises(MessageRefused, match="does not verify"):  # sealed with another job's key
        Seal(bytes(32), mode).unwrap(text, WHERE, "process 0")
    with pytest.raises(MessageRefused, match="carries no HMAC"):
        seal.unwrap(json.dumps(NOTE), WHERE, "process 0")
    if mode == "notes":  # the note alone: no digest, the array's bytes are not checked
        body = seal.unwrap(text, WHERE, "process 0")
        assert "digest" not in body
        seal.check_array(body, np.ones(3), "process 0", WHERE)


def test_off_signs_nothing():
    seal = Seal(None, "off")
    assert seal.unwrap(seal.wrap(NOTE, WHERE, np.zeros(2)), WHERE, "process 0") == NOTE


def _agree_in_two_threads(secrets: tuple[str | None, str | None], mode: str = "full"):
    """Two processes' agree() against one in-memory store (the coordination service's set and blocking get)."""
    store: dict[str, str] = {}
    lock = threading.Lock()

    class Client:
        def key_value_set(self, key, value, allow_overwrite=False):
            with lock:
                store[key] = value

    def wait_for(key, what):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with lock:
                if key in store:
                    return store[key]
            time.sleep(0.001)
        raise TimeoutError(what)

    out: dict[int, object] = {}

    def run(index):
        try:
            out[index] = agree(Client(), "jaxdbg/auth", index, 2, mode, wait_for, secrets[index])
        except MessageRefused as refused:
            out[index] = refused

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    return out, store


def test_processes_agree_on_a_key_and_refuse_one_that_differs():
    out, store = _agree_in_two_threads((None, None))
    assert isinstance(out[0], Seal) and out[0].key == out[1].key and store["jaxdbg/auth/key"] == out[0].key.hex()
    # With JAXDBG_JOB_SECRET the key never enters the store; a process with another secret is refused.
    out, store = _agree_in_two_threads(("one", "one"))
    assert "jaxdbg/auth/key" not in store and out[0].key == out[1].key
    out, store = _agree_in_two_threads(("one", "two"))
    for refused in out.values():
        assert isinstance(refused, MessageRefused)
        assert "the processes hold different keys; set the same JAXDBG_JOB_SECRET in every process" in str(refused)
