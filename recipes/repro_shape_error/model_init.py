"""A small transformer whose initialisation fails with a shape error deep inside.

`init_model` builds the parameters and then runs a dry forward pass (as many codebases do to check
shapes or to calibrate an output scale). The attention output projection was declared d_model -> d_model
instead of (n_heads * head_dim) -> d_model, so the dry run fails four calls deep with a TypeError from
`dot_general`.
"""
import jax
import jax.numpy as jnp
import numpy as np

CONFIG = dict(vocab=256, d_model=64, n_heads=4, head_dim=12, d_ff=128, n_layers=3, seq=16, batch=2)


def dense_init(key, fan_in, fan_out, scale=1.0):
    w = jax.random.normal(key, (fan_in, fan_out)) * scale / np.sqrt(fan_in)
    return {"w": w, "b": jnp.zeros((fan_out,))}


def dense_apply(p, x):
    return x @ p["w"] + p["b"]


def layer_norm_init(dim):
    return {"scale": jnp.ones((dim,)), "bias": jnp.zeros((dim,))}


def layer_norm_apply(p, x, eps=1e-6):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + eps) * p["scale"] + p["bias"]


def attention_init(key, cfg):
    kq, kk, kv, ko = jax.random.split(key, 4)
    inner = cfg["n_heads"] * cfg["head_dim"]
    return {
        "q": dense_init(kq, cfg["d_model"], inner),
        "k": dense_init(kk, cfg["d_model"], inner),
        "v": dense_init(kv, cfg["d_model"], inner),
        "o": dense_init(ko, cfg["d_model"], cfg["d_model"]),  # bug: should be (inner, d_model)
    }


def attention_apply(p, x, cfg):
    b, t, _ = x.shape
    heads = lambda y: y.reshape(b, t, cfg["n_heads"], cfg["head_dim"]).transpose(0, 2, 1, 3)
    q, k, v = heads(dense_apply(p["q"], x)), heads(dense_apply(p["k"], x)), heads(dense_apply(p["v"], x))
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(cfg["head_dim"])
    mask = jnp.tril(jnp.ones((t, t), bool))
    weights = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
    mixed = (weights @ v).transpose(0, 2, 1, 3).reshape(b, t, -1)
    return dense_apply(p["o"], mixed)


def block_init(key, cfg):
    ka, kf1, kf2 = jax.random.split(key, 3)
    return {
        "ln1": layer_norm_init(cfg["d_model"]),
        "attn": attention_init(ka, cfg),
        "ln2": layer_norm_init(cfg["d_model"]),
        "ff1": dense_init(kf1, cfg["d_model"], cfg["d_ff"]),
        "ff2": dense_init(kf2, cfg["d_ff"], cfg["d_model"]),
    }


def block_apply(p, x, cfg):
    x = x + attention_apply(p["attn"], layer_norm_apply(p["ln1"], x), cfg)
    h = jax.nn.gelu(dense_apply(p["ff1"], layer_norm_apply(p["ln2"], x)))
    return x + dense_apply(p["ff2"], h)


def init_model(key, cfg):
    keys = jax.random.split(key, cfg["n_layers"] + 2)
    params = {
        "embed": jax.random.normal(keys[0], (cfg["vocab"], cfg["d_model"])) * 0.02,
        "blocks": [block_init(k, cfg) for k in keys[1:-1]],
        "ln_f": layer_norm_init(cfg["d_model"]),
        "head": dense_init(keys[-1], cfg["d_model"], cfg["vocab"]),
    }
    # Dry run to calibrate the output scale.
    tokens = jnp.zeros((cfg["batch"], cfg["seq"]), jnp.int32)
    x = params["embed"][tokens]
    for blk in params["blocks"]:
        x = block_apply(blk, x, cfg)
    logits = dense_apply(params["head"], layer_norm_apply(params["ln_f"], x))
    params["head"]["w"] = params["head"]["w"] / jnp.std(logits)
    return params


if __name__ == "__main__":
    params = init_model(jax.random.key(0), CONFIG)
    print("parameters:", sum(x.size for x in jax.tree_util.tree_leaves(params)))
