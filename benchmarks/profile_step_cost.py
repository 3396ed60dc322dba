"""Time one decode step verifying q tokens per request, on a reduced-layer decoder with random weights.

Dense (Qwen3-32B shape) by default, or ``--model moe`` (Qwen3-235B-A22B shape: 128 experts, real
top-8 routing over random weights, so every step reads the experts its tokens route to). Each row is
one (context, batch, q): the batch's KV cache is allocated at that context and written in place by
the step, attention reads it (GQA-packed: each KV head's q x group query rows in one call, as
FlashAttention and FlashInfer decode do; see ``packed_gqa_attention``), and the measured time of
``--layers`` layers is scaled to the full model's layer count; the LM head is timed once per step and added unscaled.

GPU (about 3-5 minutes on one H200; bf16, CUDA graphs where capture works):

    .venv/bin/python -m benchmarks.profile_step_cost --device cuda --layers 4 \
        --batches 1,2,4,8,16,32,64,128,256 --contexts 2048,8192,32768 --qs 1,2,3,5,9,17 \
        --out benchmarks/results/step_cost_dense_cuda.csv
    .venv/bin/python -m benchmarks.profile_step_cost --device cuda --model moe --tp 4 --layers 4 \
        --batches 1,2,4,8,16,32,64 --contexts 2048,8192,32768 --qs 1,2,3,5,9,17 \
        --out benchmarks/results/step_cost_moe_tp4_cuda.csv

CPU, tiny shapes (a few seconds; what the tests run):

    .venv/bin/python -m benchmarks.profile_step_cost --device cpu --tiny --layers 1 --batches 1,2,4 \
        --contexts 512 --out /tmp/profile.csv

CSV columns (a superset of the shared anchor's): device, ctx, batch, q, masked, then
``ms_per_step_<L>_layers`` (L = the full model's layers: 64 dense, 94 MoE), then model, dtype, tp,
layers_measured, graphs (1 = CUDA graph replay), and for MoE: experts, top_k, distinct_experts (mean
per layer per step, measured from the routing) and moe_kernel (grouped_mm on CUDA, else a loop over
the experts that have tokens). ``masked`` is 0 unless ``--masked``: the q new tokens attend to the
whole cache without a causal mask among themselves (the same work as masked, one fewer kernel
argument; the shared anchors were timed so). Not modelled: RoPE, the sampler, tensor-parallel
communication (``--tp`` times one rank's shard only), and, with the plain SDPA call, split-KV decode
kernels (long contexts at small batch read pessimistically).
Combinations whose KV cache would exceed ``--max-kv-gb`` are skipped (e.g. batch 256 at 32k).
"""

from __future__ import annotations

import argparse
import csv
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from benchmarks.model_shapes import QWEN3_32B, QWEN3_235B_A22B

DENSE, MOE = QWEN3_32B, QWEN3_235B_A22B
# the full models' layer counts (the CSV's ms_per_step_<L>_layers column), every width tiny
TINY_DENSE = dict(layers=DENSE["layers"], hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=1000)
TINY_MOE = dict(
    layers=MOE["layers"],
    hidden=64,
    heads=4,
    kv_heads=2,
    head_dim=16,
    experts=16,
    top_k=2,
    moe_intermediate=32,
    vocab=1000,
)


# q = 1 + drafts: 0, 1, 2, 4, 8 and 16 drafted tokens, so drafts up to 16 long can be priced.
QS = "1,2,3,5,9,17"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--model", choices=("dense", "moe"), default="dense")
    p.add_argument("--tiny", action="store_true", help="tiny shapes (CPU tests)")
    p.add_argument("--tp", type=int, default=1, help="tensor parallel degree: this device's shard of heads and MLPs")
    p.add_argument("--layers", type=int, default=4, help="layers actually run; times are scaled to the full model")
    p.add_argument("--batches", default="1,2,4,8,16,32,64,128,256")
    p.add_argument("--contexts", default="2048,8192,32768")
    p.add_argument("--qs", default=QS, help="tokens per request to verify (1 = plain decode)")
    p.add_argument("--masked", action="store_true", help="causal mask among the q new tokens (default: none)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--max-kv-gb", type=float, default=100.0)
    p.add_argument("--no-graphs", action="store_true", help="never capture CUDA graphs")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU threads (1: on a shared machine, more threads wait on each other at every op)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def shard(shape: dict, tp: int) -> dict:
    """One tensor-parallel rank's shapes: heads, KV heads and MLP width divided by tp."""
    s = dict(shape)
    s["heads"] = max(1, shape["heads"] // tp)
    s["kv_heads"] = max(1, shape["kv_heads"] // tp)
    for key in ("intermediate", "moe_intermediate"):
        if key in s:
            s[key] = max(1, shape[key] // tp)
    s["vocab"] = shape["vocab"] // tp
    return s


# --------------------------------------------------------------------------------------------
# The decoder
# --------------------------------------------------------------------------------------------


def rms_norm(x, w, eps=1e-6):
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype) * w


class Layer:
    """One decoder layer's weights; ``step`` runs q new tokens per request against a KV cache."""

    def __init__(self, s: dict, moe: bool, device, dtype, gen):
        h, d = s["hidden"], s["head_dim"]
        self.s, self.moe = s, moe

        def w(*shape):  # drawn on the device: billions of weights, fast there
            return torch.empty(*shape, device=device, dtype=dtype).normal_(0.0, shape[-1] ** -0.5, generator=gen)

        self.norm1 = torch.ones(h, device=device, dtype=dtype)
        self.norm2 = torch.ones(h, device=device, dtype=dtype)
        self.qkv = w((s["heads"] + 2 * s["kv_heads"]) * d, h)
        self.o = w(h, s["heads"] * d)
        if moe:
            e, i = s["experts"], s["moe_intermediate"]
            self.router = w(e, h)
            self.gate_up = w(e, 2 * i, h)
            self.down = w(e, h, i)
        else:
            self.gate_up = w(2 * s["intermediate"], h)
            self.down = w(h, s["intermediate"])
        self.distinct = None  # a device tensor: distinct experts routed to in the last step

    def attention(self, x, k_cache, v_cache, ctx, masked: bool = False):
        s, d = self.s, self.s["head_dim"]
        b, q, _ = x.shape
        qkv = F.linear(x, self.qkv)
        qh, kh, vh = qkv.split([s["heads"] * d, s["kv_heads"] * d, s["kv_heads"] * d], dim=-1)
        k_cache[:, :, ctx : ctx + q] = kh.view(b, q, s["kv_heads"], d).transpose(1, 2)  # KV written in place
        v_cache[:, :, ctx : ctx + q] = vh.view(b, q, s["kv_heads"], d).transpose(1, 2)
        out = packed_gqa_attention(
            qh.view(b, q, s["heads"], d), k_cache[:, :, : ctx + q], v_cache[:, :, : ctx + q], masked
        )
        return F.linear(out, self.o)

    def mlp(self, x):
        g, u = F.linear(x, self.gate_up).chunk(2, dim=-1)
        return F.linear(F.silu(g) * u, self.down)

    def moe_mlp(self, x):
        """Real top-k routing; only the experts some token routes to are read."""
        s = self.s
        t = x.reshape(-1, s["hidden"])
        weights, experts = torch.topk(torch.softmax(F.linear(t, self.router).float(), -1), s["top_k"], dim=-1)
        flat = experts.reshape(-1)
        counts = torch.zeros(s["experts"], device=x.device, dtype=torch.int32).scatter_add_(
            0, flat, torch.ones_like(flat, dtype=torch.int32)
        )
        self.distinct = (counts > 0).sum()
        order = torch.argsort(flat)
        rows = t[order // s["top_k"]]
        out = grouped_expert_mlp(rows, counts, self.gate_up, self.down)
        y = torch.zeros_like(t, dtype=torch.float32)
        y.index_add_(0, order // s["top_k"], out.float() * weights.reshape(-1)[order, None])
        return y.to(x.dtype).view_as(x)

    def step(self, x, k_cache, v_cache, ctx, masked: bool = False):
        x = x + self.attention(rms_norm(x, self.norm1), k_cache, v_cache, ctx, masked)
        h = rms_norm(x, self.norm2)
        return x + (self.moe_mlp(h) if self.moe else self.mlp(h))


def packed_gqa_attention(queries, keys, values, masked: bool):
    """Attention of q new tokens per request, each KV head's q x group query rows in one call.

    ``queries``: ``[batch, q, heads, head_dim]``; ``keys``, ``values``: ``[batch, kv_heads, length,
    head_dim]`` whose last q positions are the new tokens. Returns ``[batch, q, heads * head_dim]``.
    Packing the group's query heads as rows of one KV head is what FlashAttention and FlashInfer
    decode kernels do; SDPA's GQA flag (``enable_gqa``) instead repeats the KV per query head, which for
    q > 1 times 2-5x slower on an H200 than the work verification costs. ``masked``: the causal mask
    among the q new tokens (token i sees the cache and new tokens 0..i); without it every row reads
    the whole length, the same work.
    """
    batch, q, heads, head_dim = queries.shape
    kv_heads, length = keys.shape[1], keys.shape[2]
    group = heads // kv_heads
    # Head h reads KV head h // group (the grouping of enable_gqa); rows ordered (position, head in group).
    packed = queries.view(batch, q, kv_heads, group, head_dim).permute(0, 2, 1, 3, 4)
    packed = packed.reshape(batch, kv_heads, q * group, head_dim)
    mask = None
    if masked:
        row_position = torch.arange(q * group, device=queries.device) // group
        mask = torch.arange(length, device=queries.device) <= (length - q + row_position).unsqueeze(1)
    out = F.scaled_dot_product_attention(packed, keys, values, attn_mask=mask)
    out = out.view(batch, kv_heads, q, group, head_dim).permute(0, 2, 1, 3, 4)
    return out.reshape(batch, q, heads * head_dim)


GROUPED_MM = {"ok": True}  # turned off after the first failure (e.g. a GPU or torch without it)


def grouped_expert_mlp(rows, counts, gate_up, down):
    """Expert MLPs over token rows sorted by expert. torch._grouped_mm on CUDA (one kernel per
    projection, empty groups read nothing); elsewhere a loop over the experts that have tokens."""
    if rows.is_cuda and hasattr(torch, "_grouped_mm") and GROUPED_MM["ok"]:
        try:
            offs = torch.cumsum(counts, 0, dtype=torch.int32)
            gu = torch._grouped_mm(rows, gate_up.transpose(1, 2), offs=offs)
            g, u = gu.chunk(2, dim=-1)
            return torch._grouped_mm((F.silu(g) * u).contiguous(), down.transpose(1, 2), offs=offs)
        except RuntimeError as e:
            GROUPED_MM["ok"] = False
            print(f"  torch._grouped_mm failed ({e}); looping over experts instead (moe_kernel=loop)")
    out = torch.empty(rows.shape[0], down.shape[1], device=rows.device, dtype=rows.dtype)
    start = 0
    for e, c in enumerate(counts.tolist()):
        if c:
            g, u = F.linear(rows[start : start + c], gate_up[e]).chunk(2, dim=-1)
            out[start : start + c] = F.linear(F.silu(g) * u, down[e])
            start += c
    return out


@dataclass
class Timer:
    device: torch.device

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def time_ms(self, fn, warmup: int, repeats: int) -> float:
        for _ in range(warmup):
            fn()
        self.sync()
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            self.sync()
            samples.append(1e3 * (time.perf_counter() - t0))
        samples.sort()
        return samples[len(samples) // 2]  # median


def maybe_graph(fn, device, enabled: bool):
    """A CUDA-graph replay of fn when capture works (static shapes), else fn itself."""
    if not enabled or device.type != "cuda":
        return fn, 0
    try:
        s = torch.cuda.Stream(device)
        s.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(s):
            for _ in range(2):
                fn()
        torch.cuda.current_stream(device).wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        return g.replay, 1
    except Exception as e:  # e.g. a data-dependent op; eager timing is still a measurement
        print(f"  CUDA graph capture failed ({type(e).__name__}: {e}); timing eagerly")
        torch.cuda.synchronize(device)
        return fn, 0


# --------------------------------------------------------------------------------------------
# The sweep
# --------------------------------------------------------------------------------------------


def kv_gb(s: dict, layers: int, batch: int, ctx: int, q: int, dtype) -> float:
    return 2 * layers * batch * s["kv_heads"] * (ctx + q) * s["head_dim"] * torch.finfo(dtype).bits / 8 / 1e9


def profile(args) -> list[dict]:
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    moe = args.model == "moe"
    full = (TINY_MOE if moe else TINY_DENSE) if args.tiny else (MOE if moe else DENSE)
    s = shard(full, args.tp)
    gen = torch.Generator(device=device).manual_seed(args.seed)
    layers = [Layer(s, moe, device, dtype, gen) for _ in range(args.layers)]
    head = torch.empty(s["vocab"], s["hidden"], device=device, dtype=dtype)
    head.normal_(0.0, s["hidden"] ** -0.5, generator=gen)
    timer = Timer(device)
    qs = ints(args.qs)
    col = f"ms_per_step_{full['layers']}_layers"
    rows = []
    for ctx in ints(args.contexts):
        for batch in ints(args.batches):
            if kv_gb(s, args.layers, batch, ctx, max(qs), dtype) > args.max_kv_gb:
                print(f"skip ctx {ctx} batch {batch}: KV cache over {args.max_kv_gb} GB")
                continue
            shape = (batch, s["kv_heads"], ctx + max(qs), s["head_dim"])
            # filled on the device (tens of GB at long context); values do not change the timing
            caches = [
                tuple(torch.empty(shape, device=device, dtype=dtype).normal_(generator=gen) for _ in "kv")
                for _ in layers
            ]
            for q in qs:
                x = torch.empty(batch, q, s["hidden"], device=device, dtype=dtype).normal_(generator=gen)

                def run_layers(x=x, caches=caches, ctx=ctx):
                    h = x
                    for layer, (kc, vc) in zip(layers, caches):
                        h = layer.step(h, kc, vc, ctx, args.masked)
                    return h

                def run_head(x=x):
                    return F.linear(x, head)

                with torch.inference_mode():
                    fn, graphs = maybe_graph(run_layers, device, not args.no_graphs)
                    ms_layers = timer.time_ms(fn, args.warmup, args.repeats)
                    fh, _ = maybe_graph(run_head, device, not args.no_graphs)
                    ms_head = timer.time_ms(fh, args.warmup, args.repeats)
                row = dict(device=device_name(device), ctx=ctx, batch=batch, q=q, masked=int(args.masked))
                row[col] = round(ms_layers * full["layers"] / args.layers + ms_head, 4)
                row.update(model=args.model, dtype=args.dtype, tp=args.tp, layers_measured=args.layers, graphs=graphs)
                if moe:
                    distinct = float(torch.stack([layer.distinct for layer in layers]).float().mean())
                    row.update(
                        experts=s["experts"],
                        top_k=s["top_k"],
                        distinct_experts=round(distinct, 2),
                        moe_kernel="grouped_mm" if device.type == "cuda" and GROUPED_MM["ok"] else "loop",
                    )
                rows.append(row)
                print(", ".join(f"{k}={v}" for k, v in row.items()), flush=True)
            # drop every reference to this KV cache before the next one is allocated (tens of GB)
            caches = fn = fh = run_layers = run_head = None
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def device_name(device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({torch.get_num_threads()} threads)"


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    t0 = time.time()
    rows = profile(args)
    if not rows:
        raise SystemExit("nothing profiled (all combinations skipped)")
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {len(rows)} rows to {args.out} in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
