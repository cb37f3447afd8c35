"""Float64 numpy attention with hand-written gradients: the ground truth for the kernel tests.

Independent of JAX autodiff: forward softmax(S) V and its backward
dV = Pᵀ dO, dS = P ∘ (dO Vᵀ − rowsum(dO ∘ O)), dQ = s·dS K, dK = s·dSᵀ Q,
d(bias) = dS (summed over broadcast dims), d(table)[n, h] = Σ dS where bucket = n.
"""

from __future__ import annotations

import numpy as np

from t5x_like.kernels.relpos import relative_position_bucket


def mask_np(b, lq, lk, *, causal, q_segment_ids, kv_segment_ids, prefix_mask) -> np.ndarray:
    """Allowed [B, 1, Lq, Lk], written out from DESIGN.md's rule independently of the kernels."""
    allowed = np.ones((b, lq, lk), bool)
    for i in range(b):
        for q in range(lq):
            for k in range(lk):
                if kv_segment_ids is not None and q_segment_ids is not None:
                    qs, ks = int(q_segment_ids[i][q]), int(kv_segment_ids[i][k])
                    ok = qs == ks and qs != 0
                elif kv_segment_ids is not None:
                    ok = int(kv_segment_ids[i][k]) != 0
                elif q_segment_ids is not None:
                    ok = int(q_segment_ids[i][q]) != 0
                else:
                    ok = True
                if causal:
                    in_prefix = (prefix_mask is not None and bool(prefix_mask[i][q])
                                 and bool(prefix_mask[i][k]))
                    ok = ok and (k <= q or in_prefix)
                allowed[i, q, k] = ok
    return allowed[:, None]


def attention_f64(q, k, v, do, *, causal=False, q_segment_ids=None, kv_segment_ids=None,
                  prefix_mask=None, rel_bias=None, rel_bidirectional=True,
                  rel_max_distance=128, bias=None, sm_scale=1.0) -> dict[str, np.ndarray]:
    """q [B,Lq,H,D], k/v [B,Lk,Hkv,D], do [B,Lq,H,D] -> dict of o, dq, dk, dv, drel, dbias."""
    q, k, v, do = (np.asarray(x, np.float64) for x in (q, k, v, do))
    b, lq, h, _ = q.shape
    lk, hkv = k.shape[1], k.shape[2]
    g = h // hkv
    kr, vr = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, kr) * sm_scale
    bucket = None
    if rel_bias is not None:
        rel = np.arange(lk)[None, :] - np.arange(lq)[:, None]
        bucket = np.asarray(relative_position_bucket(
            rel, bidirectional=rel_bidirectional, num_buckets=rel_bias.shape[0],
            max_distance=rel_max_distance))
        table = np.asarray(rel_bias, np.float64)
        s = s + np.transpose(table[bucket], (2, 0, 1))[None]
    if bias is not None:
        s = s + np.asarray(bias, np.float64)
    mask = mask_np(b, lq, lk, causal=causal, q_segment_ids=q_segment_ids,
                   kv_segment_ids=kv_segment_ids, prefix_mask=prefix_mask)
    s = np.where(mask, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.where(mask, np.exp(s - m), 0.0)
    denom = p.sum(-1, keepdims=True)
    p = p / np.where(denom == 0, 1.0, denom)
    o = np.einsum("bhqk,bkhd->bqhd", p, vr)
    dv = np.einsum("bhqk,bqhd->bkhd", p, do)
    dp = np.einsum("bqhd,bkhd->bhqk", do, vr)
    delta = np.einsum("bqhd,bqhd->bhq", do, o)[..., None]
    ds = p * (dp - delta)
    out = {
        "o": o,
        "dq": np.einsum("bhqk,bkhd->bqhd", ds, kr) * sm_scale,
        "dk": np.einsum("bhqk,bqhd->bkhd", ds, q).reshape(b, lk, hkv, g, -1).sum(3) * sm_scale,
        "dv": dv.reshape(b, lk, hkv, g, -1).sum(3),
    }
    if rel_bias is not None:
        per_head = ds.sum(0)  # [H, Lq, Lk]
        drel = np.zeros(np.shape(rel_bias), np.float64)
        for n in range(drel.shape[0]):
            drel[n] = per_head[:, bucket == n].sum(-1)
        out["drel"] = drel
    if bias is not None:
        dbias = ds
        if np.shape(bias)[0] == 1:
            dbias = dbias.sum(0, keepdims=True)
        if np.shape(bias)[1] == 1:
            dbias = dbias.sum(1, keepdims=True)
        out["dbias"] = dbias
    return out
