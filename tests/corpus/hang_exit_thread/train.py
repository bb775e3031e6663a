"""The training loop ends, but its non-daemon checkpoint-writer thread waits on a queue that never gets its
sentinel: run plainly, Python never exits. An idle ThreadPoolExecutor, which Python stops itself at exit,
is no part of it."""
import queue
import threading
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp

saves = queue.Queue()


def writer():
    while saves.get() is not None:  # <- waits for the sentinel nobody puts
        pass


threading.Thread(target=writer, name="ckpt-writer").start()
pool = ThreadPoolExecutor(1)
pool.submit(print, "pool ready").result()
step = jax.jit(lambda w: w * 0.9)
w = jnp.ones(8)
for i in range(3):
    w = step(w)
    saves.put(w)
print("trained", float(w.sum()))
