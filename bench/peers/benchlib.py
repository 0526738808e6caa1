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
  summarize.py needs neither): torch.compile in any mode (--compile-mode),
  with a host sync per step (the loss read, as trainrun and llm.c do) or
  without (--no-sync: CUDA events time the steps, the losses are read
  after the last step);
- what a loss-curve comparison with trainrun needs (tests/gpu/curve.sh):
  trainrun's shuffled sample order (trainer/data.c: tr_data_permute and
  tr_loader_window), its warmup-stable-decay learning rate (trainer/lr.c)
  and safetensors files (Hugging Face weights) read and written with numpy.
"""
import contextlib
import json
import math
import os
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

# Llama 3.1 8B as model/config.c flavor 8B builds it: untied output, RoPE
# scaling factor 8
LLAMA3_8B = dict(family="llama3", dim=4096, n_layers=32, n_heads=32,
                 n_kv_heads=8, ffn_dim=14336, vocab=128256, max_seq_len=131072,
                 tie=False, norm_eps=1e-5, rope_theta=500000.0,
                 rope_factor=8.0, rope_low=1.0, rope_high=4.0,
                 rope_orig=8192)
LLAMA3 = {"1B": LLAMA3_1B, "8B": LLAMA3_8B}


def llama_config(flavor, tiny=False):
    """A copy of Llama 3's flavor ("1B" or "8B"); tiny: the peers' CPU
    check size (dim 64, 2 layers, 4 heads, 2 key/value heads)."""
    cfg = dict(LLAMA3[flavor])
    if tiny:
        cfg.update(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=192)
    return cfg

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


_M64 = (1 << 64) - 1


def _mix64(x):
    """SplitMix64's finaliser on a uint64 (trainer/data.c mix64)."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def trainrun_permute(i, n, key):
    """tr_data_permute: a bijection of [0, n) keyed by a uint64 (a 4-round
    Feistel network over an even number of bits, cycle-walking back into
    range)."""
    if n <= 1 or i < 0 or i >= n:
        return i
    bits = 2
    while bits < 62 and (1 << bits) < n:
        bits += 2
    half = bits // 2
    mask = (1 << half) - 1
    x = i
    while True:
        l, r = x >> half, x & mask
        for rnd in range(4):
            f = _mix64(r ^ _mix64((key + rnd) & _M64)) & mask
            l, r = r, l ^ f
        x = (l << half) | r
        if x < n:
            return x


def trainrun_window(i, nsamples, T, seed, begin=0):
    """tr_loader_window of a shuffled loader: the first token of sample i
    (its epoch is i // nsamples; each epoch has its own permutation)."""
    epoch, k = divmod(i, nsamples)
    key = _mix64((seed & _M64) ^ _mix64(epoch))
    return begin + trainrun_permute(k, nsamples, key) * T


class Batches:
    """(x, y) batches of B sequences of T tokens from an llm.c shard.

    order "sequential" (the throughput benchmarks): consecutive windows of
    B*T+1 tokens, wrapping at the end. With world ranks, each step reads a
    global batch of world*B sequences and rank r takes sequences r*B ..
    r*B+B-1 of it.

    order "trainrun": exactly the samples trainrun's training loader feeds
    (trainer/data.c, no validation split): the shard is cut into
    nsamples = (tokens - 1) // T windows of T+1 tokens starting every T
    tokens, visited in a per-epoch permutation keyed by seed (trainrun's
    debug.seed); step s of rank r reads samples s*world*B + r*B + b."""

    def __init__(self, path, B, T, device, rank=0, world=1,
                 order="sequential", seed=0):
        import torch
        self.torch = torch
        self.tok = open_shard(path)
        self.B, self.T, self.device = B, T, torch.device(device)
        self.rank, self.world = rank, world
        self.order, self.seed = order, seed
        self.n = B * T + 1
        self.span = world * B * T + 1  # the global batch and its last target
        if order == "trainrun":
            self.nsamples = (self.tok.shape[0] - 1) // T
            if self.nsamples < 1:
                raise ValueError(f"{path}: {self.tok.shape[0]} tokens, fewer "
                                 f"than one sequence of {T + 1}")
        elif order != "sequential":
            raise ValueError(f"unknown data order {order!r}")
        elif self.tok.shape[0] < self.span:
            raise ValueError(f"{path}: {self.tok.shape[0]} tokens, a batch "
                             f"needs {self.span}")
        self.pos = 0

    def next(self):
        import numpy as np
        torch = self.torch
        if self.order == "trainrun":
            first = self.pos + self.rank * self.B
            rows = []
            for b in range(self.B):
                w = trainrun_window(first + b, self.nsamples, self.T,
                                    self.seed)
                rows.append(np.asarray(self.tok[w:w + self.T + 1],
                                       dtype=np.int64))
            self.pos += self.world * self.B
            buf = torch.from_numpy(np.stack(rows))
            if self.device.type == "cuda":
                buf = buf.pin_memory().to(self.device, non_blocking=True)
            return buf[:, :-1], buf[:, 1:]
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


class LrSchedule:
    """trainrun's [lr_scheduler] (trainer/lr.c, torchtitan's
    warmup-stable-decay): lr(step) for the 1-based optimizer step."""

    def __init__(self, lr, warmup_steps, total_steps, decay_ratio=None,
                 decay_type="linear", min_lr_factor=0.0):
        if total_steps < 1:
            raise ValueError(f"total_steps {total_steps} is below 1")
        if decay_type not in ("linear", "sqrt", "cosine"):
            raise ValueError(f"unknown decay_type {decay_type!r}")
        warmup = min(warmup_steps, total_steps)
        if decay_ratio is not None:
            decay = round(total_steps * decay_ratio)  # half to even
            decay = min(decay, total_steps - warmup)
        else:
            decay = total_steps - warmup
        self.lr, self.warmup, self.decay = lr, warmup, decay
        self.stable = total_steps + 1 - warmup - decay
        self.decay_type, self.min_lr_factor = decay_type, min_lr_factor

    def factor(self, step):
        k = max(step - 1, 0)  # LambdaLR's count: 0 for the first step
        if k < self.warmup:
            return (k + 1) / self.warmup
        ws = self.warmup + self.stable
        if k < ws or self.decay == 0:
            return 1.0
        p = min((k + 1 - ws) / self.decay, 1.0)
        if self.decay_type == "sqrt":
            g = 1 - math.sqrt(p)
        elif self.decay_type == "cosine":
            g = 0.5 * (1.0 + math.cos(math.pi * p))
        else:
            g = 1 - p
        return self.min_lr_factor + (1 - self.min_lr_factor) * g

    def __call__(self, step):
        return self.lr * self.factor(step)


# ---- safetensors (https://github.com/huggingface/safetensors: an 8-byte
# little-endian header length, a JSON header of name -> dtype, shape and
# byte offsets, then the data) ----

_ST_DTYPES = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I64": "<i8",
              "I32": "<i4", "U8": "u1"}


def st_write(path, tensors, metadata=None):
    """Write {name: numpy array} (float32 arrays as F32) to path, through a
    temporary name."""
    import numpy as np
    header, off, blobs = {}, 0, []
    rev = {np.dtype(v).str: k for k, v in _ST_DTYPES.items()}
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        code = rev.get(a.dtype.str)
        if code is None:
            raise ValueError(f"{name}: dtype {a.dtype} has no safetensors "
                             f"code here")
        b = a.tobytes()
        header[name] = {"dtype": code, "shape": list(a.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = dict(metadata or {"format": "pt"})
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def st_read(path):
    """{name: float32 or integer numpy array} of a safetensors file (BF16
    and F16 are widened to float32)."""
    import numpy as np
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: truncated safetensors header")
    n = int.from_bytes(raw[:8], "little")
    if 8 + n > len(raw):
        raise ValueError(f"{path}: header of {n} bytes past the end")
    header = json.loads(raw[8:8 + n])
    data = memoryview(raw)[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b0, b1 = e["data_offsets"]
        if not 0 <= b0 <= b1 <= len(data):
            raise ValueError(f"{path}: tensor {name!r} lies outside the data")
        chunk = data[b0:b1]
        if e["dtype"] == "BF16":
            a = (np.frombuffer(chunk, dtype="<u2").astype(np.uint32)
                 << 16).view(np.float32)
        elif e["dtype"] in _ST_DTYPES:
            a = np.frombuffer(chunk, dtype=_ST_DTYPES[e["dtype"]])
        else:
            raise ValueError(f"{path}: tensor {name!r} has dtype "
                             f"{e['dtype']}")
        if e["dtype"] in ("F16",):
            a = a.astype(np.float32)
        out[name] = a.reshape(e["shape"])
    return out


def emit(obj):
    print(json.dumps(obj), flush=True)


def compile_kwargs(torch, mode):
    """torch.compile's keyword arguments for mode (None: its default). A
    max-autotune mode benchmarks its GEMM candidates in a subprocess
    (inductor's autotune_in_subproc): in-process autotuning crashed GPT-2's
    compile with an illegal memory access on PyTorch 2.11 (H100), where a
    candidate that faults in a subprocess is dropped instead."""
    if mode and "autotune" in mode:
        import torch._inductor.config as inductor_config
        inductor_config.autotune_in_subproc = True
    return {"mode": mode} if mode else {}


def tunableop_enable(torch):
    """PyTorch's TunableOp (torch.cuda.tunable): each GEMM shape's cuBLAS
    and cuBLASLt candidates are timed at its first call and the fastest kept
    (what trainrun's TRAINRUN_GEMM_TUNE does for its own GEMMs). The results
    go to a fresh temporary folder of the process, so every run tunes
    from nothing, in its warm-up steps. Returns that folder."""
    import tempfile
    folder = tempfile.mkdtemp(prefix="tunableop-")
    tunable = torch.cuda.tunable
    tunable.set_filename(os.path.join(folder, "tunableop_results.csv"))
    tunable.enable(True)
    tunable.tuning_enable(True)
    return folder


def common_args(p, default_B, default_T, default_steps, data_required=True):
    p.add_argument("--data", required=data_required,
                   help="llm.c shard to read")
    p.add_argument("-B", type=int, default=default_B, help="batch size")
    p.add_argument("-T", type=int, default=default_T, help="sequence length")
    p.add_argument("--steps", type=int, default=default_steps)
    p.add_argument("--skip", type=int, default=None,
                   help="warm-up steps left out of the median (STEPS/5, "
                        "at least 3)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the model")
    p.add_argument("--compile-mode", default=None,
                   help="torch.compile mode (default: its default; "
                        "max-autotune, max-autotune-no-cudagraphs)")
    p.add_argument("--tunableop", action="store_true",
                   help="PyTorch's TunableOp: GEMM candidates timed at each "
                        "shape's first call, the fastest kept")
    p.add_argument("--no-sync", action="store_true",
                   help="no host sync per step: each step's end is a CUDA "
                        "event, the losses stay on the GPU, and the step "
                        "lines are printed after the last step")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true",
                   help="a tiny model of the same family (CPU tests)")
    p.add_argument("--sdpa-backend", default="auto",
                   choices=["auto", "flash", "cudnn", "efficient", "math"],
                   help="restrict F.scaled_dot_product_attention to one "
                        "backend")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--seed", type=int, default=1234)
    g = p.add_argument_group(
        "training semantics (defaults: the throughput benchmark's; "
        "tests/gpu/curve.sh sets them to trainrun's)")
    g.add_argument("--data-order", choices=["sequential", "trainrun"],
                   default="sequential",
                   help="consecutive windows, or trainrun's shuffled "
                        "samples (trainer/data.c)")
    g.add_argument("--data-seed", type=int, default=None,
                   help="trainrun's debug.seed for --data-order trainrun "
                        "(default: --seed)")
    g.add_argument("--lr-schedule", choices=["constant", "trainrun"],
                   default="constant",
                   help="constant --lr, or trainrun's [lr_scheduler] "
                        "warmup-stable-decay (trainer/lr.c)")
    g.add_argument("--warmup-steps", type=int, default=0)
    g.add_argument("--total-steps", type=int, default=None,
                   help="schedule length (default: --steps)")
    g.add_argument("--decay-ratio", type=float, default=None,
                   help="decay over this fraction of the steps (default: "
                        "every step after warmup)")
    g.add_argument("--decay-type", choices=["linear", "sqrt", "cosine"],
                   default="linear")
    g.add_argument("--min-lr-factor", type=float, default=0.0)
    g.add_argument("--beta1", type=float, default=0.9)
    g.add_argument("--beta2", type=float, default=0.95)
    g.add_argument("--eps", type=float, default=1e-8)
    g.add_argument("--weight-decay", type=float, default=0.1)
    g.add_argument("--decay-params", choices=["matrices", "all"],
                   default="matrices",
                   help="what --weight-decay applies to: parameters of 2 or "
                        "more dimensions (trainrun, llm.c, nanoGPT) or "
                        "every parameter (torchtitan's build_optimizers)")
    g.add_argument("--max-norm", type=float, default=1.0,
                   help="gradient clipping (0: none)")
    g.add_argument("--fused", choices=["auto", "yes", "no"], default="auto",
                   help="fused AdamW (auto: where torch has it; no: the "
                        "for-loop implementation)")
    g.add_argument("--precision", choices=["bf16", "fp32"], default="bf16",
                   help="bf16 autocast over fp32 weights, or fp32 throughout")


def train(model, cfg, flops_cfg, args, program, dist=None, prepare=None,
          head_extra=None):
    """Train model for args.steps steps and print one JSON line per step and
    a summary. cfg is the model's shape, flops_cfg the shape whose FLOPs
    count (the unpadded vocabulary).

    prepare, when given, is called with each step's (x, y) inside the timed
    step and returns (the model's arguments, a context manager the forward
    and backward run in): llama_torch.py's per-batch FlexAttention block
    mask, llama_cp.py's context_parallel (which shards x, y and the RoPE
    tables in place). head_extra: more keys for the first line.

    dist, for data-parallel runs (llama_fsdp2.py), is a dict: rank, world,
    device (this rank's torch.device), sharded (the model is wrapped by
    fully_shard: its mixed-precision policy casts, so no autocast; the
    caller already compiled what args.compile asks for) and any extra keys
    for the first line. Every rank trains; rank 0 prints. The loss printed
    is the mean over the ranks; tps and MFU are per GPU (B*T per step).
    Tensor-parallel runs (llama_tp.py) add: data_rank and data_world (the
    tp ranks of a replica read the same samples), token_share (the ranks
    sharing a replica's tokens: tps per GPU is B*T/token_share per step),
    dtensor_grads (clip as sharded), autocast (bf16 autocast although the
    model is distributed), compiled (the caller compiled the blocks) and
    loss_context (a context manager the forward and backward run in:
    loss_parallel).""" 
    import torch
    import torch.nn.functional as F  # noqa: F401  (the models use it)

    dist = dist or {}
    rank, world = dist.get("rank", 0), dist.get("world", 1)
    sharded = dist.get("sharded", False)
    drank = dist.get("data_rank", rank)
    dworld = dist.get("data_world", world)
    share = dist.get("token_share", 1)
    dgrads = sharded or dist.get("dtensor_grads", False)
    dev = dist.get("device") or torch.device(args.device)
    out = emit if rank == 0 else (lambda obj: None)
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1},
              {"params": no_decay, "weight_decay": 0.0}]
    wd = getattr(args, "weight_decay", 0.1)
    groups[0]["weight_decay"] = wd
    if getattr(args, "decay_params", "matrices") == "all":
        groups[1]["weight_decay"] = wd
    betas = (getattr(args, "beta1", 0.9), getattr(args, "beta2", 0.95))
    eps = getattr(args, "eps", 1e-8)
    want_fused = getattr(args, "fused", "auto")
    opt = None
    if dgrads and not sharded:  # a TP plan: DTensor and plain parameters
        return_opt = _split_adamw(torch, groups, args.lr, betas, eps)
        opt, want_fused = return_opt, "done"
    if want_fused not in ("no", "done"):
        try:
            opt = torch.optim.AdamW(groups, lr=args.lr, betas=betas,
                                    eps=eps, fused=True)
        except (RuntimeError, ValueError):
            if want_fused == "yes":
                raise
    fused = opt is not None
    if opt is None:  # --fused no: the for-loop implementation
        opt = torch.optim.AdamW(groups, lr=args.lr, betas=betas, eps=eps,
                                foreach=False if want_fused == "no" else None)
    max_norm = getattr(args, "max_norm", 1.0)
    sched = None
    if getattr(args, "lr_schedule", "constant") == "trainrun":
        sched = LrSchedule(args.lr, args.warmup_steps,
                           args.total_steps or args.steps, args.decay_ratio,
                           args.decay_type, args.min_lr_factor)
    order = getattr(args, "data_order", "sequential")
    dseed = getattr(args, "data_seed", None)
    dseed = args.seed if dseed is None else dseed
    precision = getattr(args, "precision", "bf16")
    step_model = model
    if args.compile and not sharded and not dist.get("compiled"):
        step_model = torch.compile(model,
                                   **compile_kwargs(torch, args.compile_mode))

    tunable = None
    if getattr(args, "tunableop", False):
        if dev.type != "cuda":
            raise SystemExit("--tunableop needs a CUDA device")
        tunable = tunableop_enable(torch)
    ctx = _sdpa_context(args.sdpa_backend)
    batches = Batches(args.data, args.B, args.T, dev, drank, dworld, order,
                      dseed)
    skip = args.skip if args.skip is not None else max(3, args.steps // 5)
    ntok = args.B * args.T / share
    gpu = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    fpt = flops_per_token(flops_cfg, args.T)
    peak = peak_bf16(gpu)
    head = {"program": program, "torch": torch.__version__, "device": gpu,
            "params": sum(p.numel() for p in params),  # DTensor: global
            "params_trainrun_formula": num_params(flops_cfg),
            "vocab": cfg["vocab"], "B": args.B, "T": args.T,
            "fused_adamw": fused, "compile": bool(args.compile),
            "sdpa_backend": args.sdpa_backend, "precision": precision,
            "data_order": order, "lr_schedule":
            "trainrun" if sched else "constant", "weight_decay": wd,
            "decay_params": getattr(args, "decay_params", "matrices"),
            "betas": list(betas), "eps": eps, "max_norm": max_norm}
    if world > 1 or sharded:
        head.update(world_size=world, global_B=dworld * args.B)
        head.update({k: v for k, v in dist.items()
                     if k not in ("rank", "world", "device", "sharded",
                                  "data_rank", "loss_context")})
    head.update(head_extra or {})
    nosync = bool(getattr(args, "no_sync", False))
    clock = _StepClock(torch, dev, args.steps, nosync)
    head["timing"] = clock.kind
    head["compile_mode"] = (args.compile_mode or "default") if args.compile \
        else None
    head["tunableop"] = tunable
    inductor_config = sys.modules.get("torch._inductor.config")
    if args.compile and inductor_config:
        head["autotune_in_subproc"] = inductor_config.autotune_in_subproc
    out(head)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    amp = (contextlib.nullcontext()
           if (sharded and not dist.get("autocast")) or precision == "fp32" else
           torch.autocast(device_type=dev.type, dtype=torch.bfloat16))
    lctx = dist.get("loss_context") or contextlib.nullcontext
    # --no-sync: each step's loss and norm copied into a device buffer (a
    # copy: CUDA graphs reuse their output memory), read after the loop
    kept = (torch.zeros((2, args.steps), device=dev, dtype=torch.float32)
            if nosync else None)
    lrs = []
    mark = (getattr(torch.compiler, "cudagraph_mark_step_begin", None)
            if args.compile and dev.type == "cuda" else None)
    with ctx:
        clock.start()
        for step in range(1, args.steps + 1):
            if mark:  # CUDA graph trees: a new training step begins
                mark()
            x, y = batches.next()
            inputs, pctx = (x, y), contextlib.nullcontext()
            if prepare:
                inputs, pctx = prepare(x, y)
            with pctx, lctx():
                with amp:
                    loss = step_model(*inputs)
                loss.backward()
            if hasattr(loss, "full_tensor"):  # a DTensor (loss_parallel)
                loss = loss.full_tensor()
            norm = _clip_grad_norm(torch, params, max_norm, dgrads)
            lr = sched(step) if sched else args.lr
            lrs.append(lr)
            if sched:
                for grp in opt.param_groups:
                    grp["lr"] = lr
            opt.step()
            opt.zero_grad(set_to_none=True)
            lt = loss.detach().float()
            if world > 1:
                lt = lt.clone()
                torch.distributed.all_reduce(lt)  # SUM: gloo has no AVG
                lt = lt / world
            if nosync:
                kept[0, step - 1].copy_(lt)
                kept[1, step - 1].copy_(norm.detach().float())
                clock.step()
                continue
            lv = lt.item()  # one host sync a step, as trainrun, llm.c
            dt = clock.step()
            out({"step": step, "loss": lv, "grad_norm": float(norm),
                 "lr": lr, "dt_ms": dt * 1e3, "tps": ntok / dt})
            if not math.isfinite(lv):
                print(f"{program}: loss is {lv} at step {step}",
                      file=sys.stderr)
                return 1
    dts = clock.times()  # one sync here (--no-sync)
    if nosync:
        vals = kept.cpu().tolist()
        for i, dt in enumerate(dts):
            out({"step": i + 1, "loss": vals[0][i], "grad_norm": vals[1][i],
                 "lr": lrs[i], "dt_ms": dt * 1e3, "tps": ntok / dt,
                 "timing": clock.kind})
        bad = [i + 1 for i, v in enumerate(vals[0]) if not math.isfinite(v)]
        if bad:
            print(f"{program}: loss is {vals[0][bad[0] - 1]} at step "
                  f"{bad[0]}", file=sys.stderr)
            return 1
    timed = dts[skip:]
    mdt = median(timed)
    tps = ntok / mdt if timed else float("nan")
    # the window: every timed step's tokens over their summed time
    window = ntok * len(timed) / sum(timed) if timed else float("nan")
    mem = (torch.cuda.max_memory_allocated(dev) / 2**30
           if dev.type == "cuda" else float("nan"))
    summ = {"summary": program, "steps_timed": len(timed), "skip": skip,
            "median_step_ms": mdt * 1e3, "median_tps": tps,
            "window_tps": window, "timing": clock.kind,
            "flops_per_token": fpt, "formula": FLOPS_FORMULA,
            "peak_flops": peak,
            "mfu": 100.0 * tps * fpt / peak if peak > 0 else None,
            "max_mem_gib": mem if math.isfinite(mem) else None}
    if world > 1 or sharded:
        summ.update(world_size=world, median_tps_all_gpus=tps * world)
        if share > 1:
            summ.update(token_share=share)
    if tunable:  # what TunableOp tuned: a build that offers cuBLAS's
        # default alone (no cuBLASLt candidates) has nothing to choose from
        try:  # (op, params, solution, ms) tuples in PyTorch 2.x
            res = list(torch.cuda.tunable.get_results())
            summ.update(tunableop_ops=len(res),
                        tunableop_not_default=sum(
                            1 for r in res if "Default" not in str(r[2])))
        except (AttributeError, IndexError, RuntimeError, TypeError) as e:
            summ.update(tunableop_results_error=str(e))
    out(summ)
    return 0


class _StepClock:
    """Each step's time. With a host sync per step (sync): the host clock
    between the ends of consecutive steps (the loss read waits for the
    GPU). Without (nosync) on a GPU: a CUDA event recorded after each
    step's work is queued, read once after the last step, so that the host
    runs ahead as far as CUDA lets it; on the CPU there is nothing to run
    ahead of, so the host clock."""

    def __init__(self, torch, dev, steps, nosync):
        self.events = None
        if nosync and dev.type == "cuda":
            self.events = [torch.cuda.Event(enable_timing=True)
                           for _ in range(steps + 1)]
            self.sync = lambda: torch.cuda.synchronize(dev)
        self.kind = ("cuda events" if self.events else
                     "host clock, no sync" if nosync else
                     "host clock, a sync per step")
        self.stamps = []

    def start(self):
        self.n = 0
        if self.events:
            self.events[0].record()
        else:
            self.stamps.append(time.perf_counter())

    def step(self):
        """Mark a step's end; its time in s when the host clock measures
        it, else None."""
        self.n += 1
        if self.events:
            self.events[self.n].record()
            return None
        self.stamps.append(time.perf_counter())
        return self.stamps[-1] - self.stamps[-2]

    def times(self):
        """Every step's time in s."""
        if self.events:
            self.sync()
            return [self.events[i].elapsed_time(self.events[i + 1]) / 1e3
                    for i in range(self.n)]
        return [b - a for a, b in zip(self.stamps, self.stamps[1:])]


class _Adams:
    """Fused AdamW over the DTensor parameters of a tensor-parallel plan and
    another over the plain ones (one fused step refuses the mix)."""

    def __init__(self, opts):
        self.opts = opts
        self.param_groups = [g for o in opts for g in o.param_groups]

    def step(self):
        for o in self.opts:
            o.step()

    def zero_grad(self, set_to_none=True):
        for o in self.opts:
            o.zero_grad(set_to_none=set_to_none)


def _split_adamw(torch, groups, lr, betas, eps):
    opts = []
    for want in (True, False):
        gs = [{"params": [p for p in g["params"]
                          if hasattr(p, "full_tensor") == want],
               "weight_decay": g["weight_decay"]} for g in groups]
        gs = [g for g in gs if g["params"]]
        if gs:
            opts.append(torch.optim.AdamW(gs, lr=lr, betas=betas, eps=eps,
                                          fused=True))
    return _Adams(opts)


def _clip_grad_norm(torch, params, max_norm, sharded):
    """Clip the gradients to a global norm of max_norm (max_norm <= 0: no
    clipping) and return the norm before clipping as a tensor. Sharded
    gradients (DTensor) are clipped the way torchtitan does: the total
    norm's partial sums are reduced over the ranks (full_tensor) before the
    scale is applied."""
    if not sharded and max_norm > 0:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    grads = [p.grad for p in params if p.grad is not None]
    # DTensor gradients (their norm reduced over the ranks) and plain ones
    # (replicated parameters a tensor-parallel plan leaves alone) apart
    dts = [g for g in grads if hasattr(g, "full_tensor")]
    plain = [g for g in grads if not hasattr(g, "full_tensor")]
    total = torch.zeros((), device=grads[0].device, dtype=torch.float32)
    if dts:
        n = torch.nn.utils.get_total_norm(dts, 2.0)
        n = n.full_tensor() if hasattr(n, "full_tensor") else n
        total = total + n.float() ** 2
    if plain:
        total = total + torch.nn.utils.get_total_norm(plain, 2.0).float() ** 2
    total = total.sqrt()
    if max_norm > 0 and dts and plain:  # a factor both kinds take
        coef = min(1.0, max_norm / (float(total) + 1e-6))
        if coef < 1.0:
            torch._foreach_mul_(dts, coef)
            torch._foreach_mul_(plain, coef)
    elif max_norm > 0:
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


def init_torchrun(program, device):
    """The rank set-up of a peer under torchrun: RANK, WORLD_SIZE and
    LOCAL_RANK, this rank's device (cuda:LOCAL_RANK, or the CPU), the
    default process group over NCCL (Gloo on the CPU). Returns (rank, world,
    device), or None after a message when torchrun's variables are
    missing."""
    import torch
    import torch.distributed as dist
    try:
        rank = int(os.environ["RANK"])
        world = int(os.environ["WORLD_SIZE"])
        local = int(os.environ["LOCAL_RANK"])
    except KeyError as e:
        print(f"{program}: {e.args[0]} is not set: run under torchrun "
              f"(or trainrun --exec)", file=sys.stderr)
        return None
    dev = torch.device(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", local)
        torch.cuda.set_device(dev)
        dist.init_process_group("nccl", device_id=dev)
    else:
        dist.init_process_group("gloo")
    return rank, world, dev


def seed_all(seed):
    import numpy as np
    import torch
    torch.manual_seed(seed)
    np.random.seed(seed)


def run_main(main):
    """A peer's entry point: main()'s status as the exit code, the output
    flushed, the default process group destroyed where torchrun made one,
    and the interpreter's teardown skipped (torch.compile's worker pools
    can hang it)."""
    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    os._exit(rc)
