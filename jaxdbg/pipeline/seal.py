"""Authentication of the messages between the processes of a real pipeline job (``--message-auth``).

Across processes (:class:`~jaxdbg.pipeline.transport.ProcessTransport`) a message is a note in the job's
coordination-service key-value store (which array to pull, for which task, when it was sent) and, for data,
the array itself, pulled with ``jax.experimental.transfer``. Neither channel authenticates anything: any
party that can write the store, or sit on the transfer's plain TCP stream, could hand a stage a forged or
altered input, and a note left over from another run or job would be taken for this one's.

Each process therefore holds the job's key: HMAC-SHA256 with a 32-byte secret, from ``JAXDBG_JOB_SECRET``
in every process's environment when the launcher sets one (then it never passes through the store), else
drawn by process 0 and published in the store for the others. The processes check they agree at the start
(each posts a sealed hello; a process with another key is refused). Then:

- ``full`` (the default): a note carries an HMAC over its exact text and over where it sits in the job (run,
  sender, receiver, sequence number: a note replayed elsewhere or reordered does not verify), and the text
  holds the SHA-256 of the array's bytes, shape and dtype, checked on the bytes the receiver pulled;
- ``notes``: the HMAC covers the note (with the array's shape and dtype) but not the array's bytes, which
  saves a copy to the host and a hash per message on each side;
- ``off``: nothing (to measure what the rest costs).

The parts each process publishes at the end of a run (its tasks' times, its gradients' check) are sealed
the same way. A message that does not verify is refused: the receiving process stops the run with
:class:`MessageRefused` naming the sender, the note and why (exit 3), and tells the others.

Not protected: confidentiality (notes and arrays travel in the clear); a party that can read the
coordination service's store when the key is published there (set ``JAXDBG_JOB_SECRET`` to keep it out); the
store's barrier, start-time and failure notes (they carry no data: forging them can delay or stop a run, as
any writer of the store can anyway); and the binding of the transfer server to a host: it listens on
``--transfer-bind`` for whoever can reach that address, and a pulled array is checked after it arrives.

Example:
    >>> seal = Seal(b"k" * 32, "notes")
    >>> text = seal.wrap({"task": 3}, "run 0: 0->1 #0")
    >>> seal.unwrap(text, "run 0: 0->1 #0", "process 0")
    {'task': 3}
    >>> try:
    ...     seal.unwrap(text.replace('3', '4'), "run 0: 0->1 #0", "process 0")
    ... except MessageRefused as refused:
    ...     print(str(refused)[:75])
    refused a message from process 0 (run 0: 0->1 #0): its HMAC does not verify
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Callable
from typing import Any

from jaxdbg._errors import TargetFailedError

AUTH = ("full", "notes", "off")
ENV_SECRET = "JAXDBG_JOB_SECRET"
_DOMAIN = b"jaxdbg pipeline-bench messages v1"


class MessageRefused(TargetFailedError):
    """A message between processes did not verify with the job's key: the run stops (exit 3)."""


class Seal:
    """The job's key and what it covers (``mode``, one of :data:`AUTH`): wraps and checks each message."""

    def __init__(self, key: bytes | None, mode: str):
        self.key, self.mode = key, mode

    @property
    def on(self) -> bool:
        return self.mode != "off" and self.key is not None

    def _mac(self, text: str, context: str) -> str:
        assert self.key is not None  # only asked when on
        return hmac.new(self.key, f"{context}\n{text}".encode(), hashlib.sha256).hexdigest()

    def wrap(self, body: dict, context: str, array: Any = None) -> str:
        """The text to post for ``body`` at ``context`` (with ``full``, ``array``'s digest joins the body)."""
        if not self.on:
            return json.dumps(body)
        if array is not None and self.mode == "full":
            body = {**body, "digest": array_digest(array)}
        text = json.dumps(body)
        return json.dumps({"note": text, "mac": self._mac(text, context)})

    def unwrap(self, text: str, context: str, sender: str) -> dict:
        """The body of a posted ``text``, once its HMAC verifies for ``context``; else :class:`MessageRefused`."""
        if not self.on:
            return json.loads(text)
        try:
            sealed = json.loads(text)
            inner, mac = sealed["note"], sealed["mac"]
            if not isinstance(inner, str) or not isinstance(mac, str):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            raise self._refused(sender, context, "it carries no HMAC (sent without --message-auth, or not by "
                                "jaxdbg)") from None
        if not hmac.compare_digest(mac, self._mac(inner, context)):
            raise self._refused(sender, context, "its HMAC does not verify with this job's key (altered, or "
                                "sealed by a process of another job)")
        return json.loads(inner)

    def check_array(self, body: dict, array: Any, sender: str, context: str) -> None:
        """With ``full``: the pulled ``array`` must hash to the digest its (verified) note holds."""
        if self.on and self.mode == "full" and not hmac.compare_digest(str(body.get("digest")), array_digest(array)):
            raise self._refused(sender, context, "the array pulled for it is not the one its note was sealed for "
                                "(altered in transit, or another array offered under its id)")

    @staticmethod
    def _refused(sender: str, context: str, why: str) -> MessageRefused:
        return MessageRefused(f"refused a message from {sender} ({context}): {why}; the run stops")


def array_digest(array: Any) -> str:
    """SHA-256 of an array's dtype, shape and bytes (a device array is copied to the host first)."""
    import numpy as np

    host = np.ascontiguousarray(np.asarray(array))
    head = f"{host.dtype.str}{host.shape}".encode()
    return hashlib.sha256(head + host.tobytes()).hexdigest()


def agree(client: Any, prefix: str, index: int, count: int, mode: str, wait_for: Callable[[str, str], str],
          secret: str | None = None) -> Seal:
    """The job's :class:`Seal`: the key from ``secret`` (``JAXDBG_JOB_SECRET``), else process 0's published one;
    every peer's sealed hello checked (``wait_for(key, what)`` reads the store, waiting for a peer)."""
    if mode == "off":
        return Seal(None, mode)
    if secret:
        key = hashlib.sha256(_DOMAIN + secret.encode()).digest()
    elif index == 0:
        key = secrets.token_bytes(32)
        client.key_value_set(f"{prefix}/key", key.hex(), allow_overwrite=True)
    else:
        key = bytes.fromhex(wait_for(f"{prefix}/key", "process 0's message key"))
    seal = Seal(key, mode)
    client.key_value_set(f"{prefix}/hello/{index}", seal.wrap({"hello": index}, f"hello {index}"),
                         allow_overwrite=True)
    for peer in range(count):
        if peer != index:
            text = wait_for(f"{prefix}/hello/{peer}", f"process {peer}'s hello")
            try:
                seal.unwrap(text, f"hello {peer}", f"process {peer}")
            except MessageRefused as refused:
                raise MessageRefused(f"{refused.message[:-len('; the run stops')]}: the processes hold different "
                                     f"keys; set the same {ENV_SECRET} in every process, or none") from None
    return seal
