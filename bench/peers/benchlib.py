"""bench/peers/benchlib.py: what the PyTorch peers of bench/gpu_train.sh
(gpt2_torch.py, llama_torch.py) and bench/gpu/summarize.py share.

- the model shapes trainrun trains (model/config.c), its parameter count
  and FLOPs per token (tr_model_config_num_params, tr_model_flops_per_token:
  torchtitan's count, 6 * (parameters - position embeddings - untied input
  embeddings) + 12 * layers * heads * head_dim * seq_len), and the dense
  bf16 peaks of trainer/metrics.c's table, so that every program's MFU is
  counted the same way;
- llm.c token shards: a 1024-byte header of 256 little-endian int32 (magic
  20240520 version 1 for uint16 tokens, 20240801 version 7 for uint32; the
  third is the token count) and the tokens;
- the training loop of the PyTorch peers (numpy is needed; torch only by
  the loop; numpy and torch are imported only where used, so that
  summarize.py needs neither).
"""
import contextlib
import json
import math
import sys
import time

FLOPS_FORMULA = ("6*(params - position embeddings - untied input embeddings)"
                 " + 12*layers*heads*head_dim*seq_len "
                 "(trainrun tr_model_flops_per_token, torchtitan's count)")

GPT2_124M = dict(family="gpt2", dim=768, n_layers=12, n_heads=12,
                 n_kv_heads=12, ffn_dim=3072, vocab=50257, max_seq_len=1024,
                 tie=True, norm_eps=1e-5)
LLAMA3_1B = dict(family="llama3", dim=2048, n_layers=16, n_heads=32,
                 n_kv_heads=8, ffn_dim=8192, vocab=128256, max_seq_len=131072,
                 tie=True, norm_eps=1e-5, rope_theta=500000.0,
                 rope_factor=32.0, rope_low=1.0, rope_high=4.0,
                 rope_orig=8192)

SHARD_HEADER_BYTES = 1024
SHARD_FORMATS = {20240520: (1, "<u2"), 20240801: (7, "<u4")}


def head_dim(c):
    return c["dim"] // c["n_heads"]


def num_params(c):
    """Parameters as model/config.c counts them."""
    C, V, F, L = c["dim"], c["vocab"], c["ffn_dim"], c["n_layers"]
    n = V * C
    if c["family"] == "gpt2":
        n += c["max_seq_len"] * C
        layer = (2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C
                 + (F * C + F) + (C * F + C))
        n += L * layer + 2 * C
    else:
        D = head_dim(c)
        layer = (C + C * c["n_heads"] * D + 2 * C * c["n_kv_heads"] * D
                 + c["n_heads"] * D * C + C + 3 * C * F)
        n += L * layer + C
    if not c["tie"]:
        n += V * C
    return n


def flops_per_token(c, seq_len):
    """Training FLOPs per token, as tr_model_flops_per_token counts them."""
    n = float(num_params(c))
    if not c["tie"]:
        n -= float(c["vocab"] * c["dim"])
    if c["family"] == "gpt2":
        n -= float(c["max_seq_len"] * c["dim"])
    return 6.0 * n + 12.0 * c["n_layers"] * c["n_heads"] * head_dim(c) * seq_len


def _has_model(name, word):
    n, low, w = len(name), name.lower(), word.lower()
    i = low.find(w)
    while i >= 0:
        after = low[i + len(w)] if i + len(w) < n else ""
        before = low[i - 1] if i > 0 else ""
        if not after.isdigit() and not before.isalnum():
            return True
        i = low.find(w, i + 1)
    return False


_PEAKS = [("GB200", None, 2.5e15), ("GB300", None, 2.5e15),
          ("B200", None, 2.25e15), ("B300", None, 2.25e15),
          ("H100", "NVL", 835e12), ("H100", "PCIe", 756e12),
          ("H100", None, 989e12), ("H200", None, 989e12),
          ("H20", None, 148e12), ("A100", None, 312e12),
          ("L40S", None, 362e12), ("MI300X", None, 1307.4e12),
          ("MI325X", None, 1307.4e12), ("MI355X", None, 2.5e15)]


def peak_bf16(name):
    """Dense bf16 FLOP/s of a device name (trainer/metrics.c's table), or 0."""
    if not name or name.lower() == "cpu":
        return 0.0
    for word, also, peak in _PEAKS:
        if not _has_model(name, word):
            continue
        if also and also.lower() not in name.lower():
            continue
        return peak
    return 0.0


def median(xs):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else 0.5 * (xs[m - 1] + xs[m])


def open_shard(path):
    """The tokens of an llm.c shard as a read-only memmap."""
    import numpy as np
    hdr = np.fromfile(path, dtype="<i4", count=256)
    if hdr.size < 256:
        raise ValueError(f"{path}: truncated header")
    magic, version, ntok = int(hdr[0]), int(hdr[1]), int(hdr[2])
    if magic not in SHARD_FORMATS:
        raise ValueError(f"{path}: bad magic {magic}")
    want, dtype = SHARD_FORMATS[magic]
    if version != want:
        raise ValueError(f"{path}: bad version {version} for magic {magic}")
    return np.memmap(path, dtype=np.dtype(dtype), mode="r",
                     offset=SHARD_HEADER_BYTES, shape=(ntok,))


class Batches:
    """Consecutive (x, y) windows of B*T+1 tokens, wrapping at the end. With
    world ranks, each step reads a global batch of world*B sequences and
    rank r takes sequences r*B .. r*B+B-1 of it (as trainrun's loader)."""

    def __init__(self, path, B, T, device, rank=0, world=1):
        import torch
        self.torch = torch
        self.tok = open_shard(path)
        self.B, self.T, self.device = B, T, torch.device(device)
        self.rank, self.world = rank, world
        self.n = B * T + 1
        self.span = world * B * T + 1  # the global batch and its last target
        if self.tok.shape[0] < self.span:
            raise ValueError(f"{path}: {self.tok.shape[0]} tokens, a batch "
                             f"needs {self.span}")
        self.pos = 0

    def next(self):
        import numpy as np
        torch = self.torch
        if self.pos + self.span > self.tok.shape[0]:
            self.pos = 0
        first = self.pos + self.rank * self.B * self.T
        buf = torch.from_numpy(
            np.asarray(self.tok[first:first + self.n], dtype=np.int64))
        self.pos += self.world * self.B * self.T
        if self.device.type == "cuda":
            buf = buf.pin_memory().to(self.device, non_blocking=True)
        x = buf[:-1].view(self.B, self.T)
        y = buf[1:].view(self.B, self.T)
        return x, y


def emit(obj):
    print(json.dumps(obj), flush=True)


def common_args(p, default_B, default_T, default_steps):
    p.add_argument("--data", required=True, help="llm.c shard to read")
    p.add_argument("-B", type=int, default=default_B, help="batch size")
    p.add_argument("-T", type=int, default=default_T, help="sequence length")
    p.add_argument("--steps", type=int, default=default_steps)
    p.add_argument("--skip", type=int, default=None,
                   help="warm-up steps left out of the median (STEPS/5, "
                        "at least 3)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the model")
    p.add_argument("--compile-mode", default=None,
                   help="torch.compile mode (default: its default)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true",
                   help="a tiny model of the same family (CPU tests)")
    p.add_argument("--sdpa-backend", default="auto",
                   choices=["auto", "flash", "cudnn", "efficient", "math"],
                   help="restrict F.scaled_dot_product_attention to one "
                        "backend")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--seed", type=int, default=1234)


def train(model, cfg, flops_cfg, args, program, dist=None):
    """Train model for args.steps steps and print one JSON line per step and
    a summary. cfg is the model's shape, flops_cfg the shape whose FLOPs
    count (the unpadded vocabulary).

    dist, for data-parallel runs (llama_fsdp2.py), is a dict: rank, world,
    device (this rank's torch.device), sharded (the model is wrapped by
    fully_shard: its mixed-precision policy casts, so no autocast; the
    caller already compiled what args.compile asks for) and any extra keys
    for the first line. Every rank trains; rank 0 prints. The loss printed
    is the mean over the ranks; tps and MFU are per GPU (B*T per step)."""
    import torch
    import torch.nn.functional as F  # noqa: F401  (the models use it)

    dist = dist or {}
    rank, world = dist.get("rank", 0), dist.get("world", 1)
    sharded = dist.get("sharded", False)
    dev = dist.get("device") or torch.device(args.device)
    out = emit if rank == 0 else (lambda obj: None)
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1},
              {"params": no_decay, "weight_decay": 0.0}]
    try:
        opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95),
                                eps=1e-8, fused=True)
        fused = True
    except (RuntimeError, ValueError):
        opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95),
                                eps=1e-8)
        fused = False
    step_model = model
    if args.compile and not sharded:
        kw = {"mode": args.compile_mode} if args.compile_mode else {}
        step_model = torch.compile(model, **kw)

    ctx = _sdpa_context(args.sdpa_backend)
    batches = Batches(args.data, args.B, args.T, dev, rank, world)
    skip = args.skip if args.skip is not None else max(3, args.steps // 5)
    ntok = args.B * args.T
    gpu = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    fpt = flops_per_token(flops_cfg, args.T)
    peak = peak_bf16(gpu)
    head = {"program": program, "torch": torch.__version__, "device": gpu,
            "params": sum(p.numel() for p in params),  # DTensor: global
            "params_trainrun_formula": num_params(flops_cfg),
            "vocab": cfg["vocab"], "B": args.B, "T": args.T,
            "fused_adamw": fused, "compile": bool(args.compile),
            "sdpa_backend": args.sdpa_backend}
    if world > 1 or sharded:
        head.update(world_size=world, global_B=world * args.B)
        head.update({k: v for k, v in dist.items()
                     if k not in ("rank", "world", "device", "sharded")})
    out(head)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    dts = []
    last = time.perf_counter()
    amp = (contextlib.nullcontext() if sharded else
           torch.autocast(device_type=dev.type, dtype=torch.bfloat16))
    with ctx:
        for step in range(1, args.steps + 1):
            x, y = batches.next()
            with amp:
                loss = step_model(x, y)
            loss.backward()
            norm = _clip_grad_norm(torch, params, 1.0, sharded)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if world > 1:
                lt = loss.detach().float().clone()
                torch.distributed.all_reduce(lt)  # SUM: gloo has no AVG
                lv = lt.item() / world
            else:
                lv = loss.item()  # one host sync a step, as trainrun, llm.c
            now = time.perf_counter()
            dt, last = now - last, now
            if step > skip:
                dts.append(dt)
            out({"step": step, "loss": lv, "grad_norm": float(norm),
                  "dt_ms": dt * 1e3, "tps": ntok / dt})
            if not math.isfinite(lv):
                print(f"{program}: loss is {lv} at step {step}",
                      file=sys.stderr)
                return 1
    mdt = median(dts)
    tps = ntok / mdt if dts else float("nan")
    mem = (torch.cuda.max_memory_allocated(dev) / 2**30
           if dev.type == "cuda" else float("nan"))
    summ = {"summary": program, "steps_timed": len(dts), "skip": skip,
            "median_step_ms": mdt * 1e3, "median_tps": tps,
            "flops_per_token": fpt, "formula": FLOPS_FORMULA,
            "peak_flops": peak,
            "mfu": 100.0 * tps * fpt / peak if peak > 0 else None,
            "max_mem_gib": mem if math.isfinite(mem) else None}
    if world > 1 or sharded:
        summ.update(world_size=world, median_tps_all_gpus=tps * world)
    out(summ)
    return 0


def _clip_grad_norm(torch, params, max_norm, sharded):
    """Clip the gradients to a global norm of max_norm and return the norm
    before clipping as a tensor. Sharded gradients (DTensor) are clipped the
    way torchtitan does: the total norm's partial sums are reduced over the
    ranks (full_tensor) before the scale is applied."""
    if not sharded:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, 2.0)
    if hasattr(total, "full_tensor"):
        total = total.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total


def _sdpa_context(backend):
    import contextlib
    if backend == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel({"flash": SDPBackend.FLASH_ATTENTION,
                        "cudnn": SDPBackend.CUDNN_ATTENTION,
                        "efficient": SDPBackend.EFFICIENT_ATTENTION,
                        "math": SDPBackend.MATH}[backend])


def seed_all(seed):
    import numpy as np
    import torch
    torch.manual_seed(seed)
    np.random.seed(seed)
