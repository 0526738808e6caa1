#!/usr/bin/env python3
"""tests/parity/parity.py: trainrun against PyTorch + transformers, in fp32.

For each case (GPT-2 debugmodel; Llama-3 debugmodel; a Llama-3 with
grouped-query attention and tied embeddings), this script

  1. has trainrun initialise the model and export it (tr_parity init:
     model.safetensors with Hugging Face names and layouts + config.json);
  2. loads that directory with transformers (GPT2LMHeadModel /
     LlamaForCausalLM, eager attention, fp32) and checks that every tensor
     arrived bit for bit and that no parameter is missing or left over;
  3. perturbs the 1-D tensors (norm weights, biases: ones and zeros after
     init) so they take part in the comparison, and saves the weights
     back (a file written by safetensors' own writer: trainrun's importer
     reads it);
  4. writes a batch of random tokens and targets (some targets -100, the
     ignore index) and has trainrun run one forward and backward on it
     (tr_parity grad: the mean loss and every gradient, HF names);
  5. runs the same batch through the transformers model: logits, mean
     cross-entropy over the targets with ignore_index=-100, backward;
  6. compares: the loss by |ours - torch| / |torch| (limit 1e-4), each
     gradient tensor by max|ours - torch| / max|torch| over the tensor
     (limit 1e-3); the norm-relative error ||ours - torch|| / ||torch|| is
     printed beside it.

It prints one table row per case (-v: one per tensor as well) and exits 1
when any check fails. Run it by hand where torch, transformers and
safetensors are installed (it is not part of `make check`):

    make tests/parity/tr_parity      # in the build folder (also `make check`)
    python3 ../tests/parity/parity.py --tr-parity tests/parity/tr_parity
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

LOSS_TOL = 1e-4
GRAD_TOL = 1e-3
IGNORE_INDEX = -100

CASES = [
    # name, tr_parity init flags
    ("gpt2-debugmodel", ["--model", "gpt2", "--flavor", "debugmodel"]),
    ("llama3-debugmodel", ["--model", "llama3", "--flavor", "debugmodel"]),
    ("llama3-gqa-tied", ["--model", "llama3", "--flavor", "debugmodel",
                         "--n-kv-heads", "4", "--n-layers", "2",
                         "--tie", "1"]),
]


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)
    if r.returncode != 0:
        raise RuntimeError("%s exited %d: %s" % (" ".join(cmd), r.returncode,
                                                 r.stderr.strip()))


def rel_errors(a, b):
    """max|a-b| / max|b| and ||a-b|| / ||b|| (0 when both are all zero)."""
    d = (a.double() - b.double())
    bmax = b.double().abs().max().item()
    bnorm = b.double().norm().item()
    dmax = d.abs().max().item()
    dnorm = d.norm().item()
    max_rel = dmax / bmax if bmax > 0 else (0.0 if dmax == 0 else float("inf"))
    norm_rel = dnorm / bnorm if bnorm > 0 else (0.0 if dnorm == 0
                                                else float("inf"))
    return max_rel, norm_rel


def one_case(name, flags, tr_parity, work, args, torch, transformers,
             st_torch, safe_open):
    d = os.path.join(work, name)
    os.makedirs(d, exist_ok=True)
    problems = []

    # 1. trainrun exports its initialised model
    run([tr_parity, "init"] + flags + ["--seed", str(args.seed), "-o", d])

    # 2. transformers loads it; every tensor arrives unchanged
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        d, dtype=torch.float32, attn_implementation="eager",
        output_loading_info=True)
    cfg = model.config
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        left = [k for k in info.get(key, [])
                if not (tied and k == "lm_head.weight")]
        if left:
            problems.append("%s: %s" % (key, ", ".join(map(str, left))))
    params = dict(model.named_parameters())
    with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        meta = f.metadata()
        exported = set(f.keys())
        for k in exported:
            if k not in params:
                problems.append("exported '%s' is no parameter of %s"
                                % (k, type(model).__name__))
            elif not torch.equal(f.get_tensor(k), params[k].detach()):
                problems.append("'%s' differs after loading" % k)
    for k in params:
        if k not in exported:
            problems.append("parameter '%s' was not exported" % k)

    # 3. perturb the 1-D tensors; save what both sides will use
    g = torch.Generator().manual_seed(args.seed + 1)
    with torch.no_grad():
        for k, p in params.items():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    weights = os.path.join(d, "weights.safetensors")
    st_torch.save_file({k: p.detach().contiguous() for k, p in params.items()},
                       weights, metadata=meta)

    # 4. the batch, and trainrun's loss and gradients
    V = cfg.vocab_size
    B, T = args.batch, args.seq_len
    tokens = torch.randint(0, V, (B, T), generator=g, dtype=torch.int32)
    targets = torch.randint(0, V, (B, T), generator=g, dtype=torch.int32)
    targets[torch.rand((B, T), generator=g) < 0.1] = IGNORE_INDEX
    batch = os.path.join(d, "batch.safetensors")
    st_torch.save_file({"tokens": tokens, "targets": targets}, batch)
    grads_path = os.path.join(d, "grads.safetensors")
    run([tr_parity, "grad", weights, batch, grads_path])

    # 5. the same in transformers
    model.eval()  # no dropout (the exported configs have none anyway)
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=tokens.long()).logits
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, V).float(), targets.reshape(-1).long(),
        ignore_index=IGNORE_INDEX)
    loss.backward()

    # 6. compare
    rows = []
    with safe_open(grads_path, "pt") as f:
        gmeta = f.metadata()
        ours_loss = float(gmeta["loss"])
        n_valid = int(gmeta["n_valid"])
        want_valid = int((targets != IGNORE_INDEX).sum())
        if n_valid != want_valid:
            problems.append("trainrun scored %d targets, not %d"
                            % (n_valid, want_valid))
        names = set(f.keys())
        for k, p in params.items():
            if k not in names:
                problems.append("no gradient for '%s' from trainrun" % k)
                continue
            ours = f.get_tensor(k)
            if p.grad is None:
                problems.append("torch computed no gradient for '%s'" % k)
                continue
            if tuple(ours.shape) != tuple(p.grad.shape):
                problems.append("gradient '%s' is %s, torch's %s"
                                % (k, tuple(ours.shape), tuple(p.grad.shape)))
                continue
            mx, nr = rel_errors(ours, p.grad)
            rows.append((k, tuple(p.shape), mx, nr))
        for k in names - set(params):
            problems.append("trainrun has a gradient '%s' torch has not" % k)
    torch_loss = loss.item()
    loss_rel = abs(ours_loss - torch_loss) / abs(torch_loss)
    if loss_rel > LOSS_TOL:
        problems.append("loss: relative error %.3g > %g" % (loss_rel, LOSS_TOL))
    for k, shape, mx, nr in rows:
        if not mx <= GRAD_TOL:
            problems.append("grad '%s': max-relative error %.3g > %g"
                            % (k, mx, GRAD_TOL))
    return {"name": name, "loss_ours": ours_loss, "loss_torch": torch_loss,
            "loss_rel": loss_rel, "rows": rows, "problems": problems,
            "n_params": sum(p.numel() for p in params.values())}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tr-parity", default=os.environ.get("TR_PARITY"),
                    help="the tr_parity program (default: $TR_PARITY)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--keep", metavar="DIR",
                    help="work in DIR and keep the files")
    ap.add_argument("--case", action="append",
                    help="run only this case (repeatable): "
                    + ", ".join(c[0] for c in CASES))
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="print every tensor's errors")
    args = ap.parse_args()
    if not args.tr_parity or not os.access(args.tr_parity, os.X_OK):
        ap.error("give the tr_parity program (--tr-parity or $TR_PARITY); "
                 "`make tests/parity/tr_parity` builds it")
    try:
        import torch
        import transformers
        import safetensors.torch as st_torch
        from safetensors import safe_open
    except ImportError as e:
        print("parity: needs torch, transformers and safetensors: %s" % e,
              file=sys.stderr)
        return 77
    torch.manual_seed(args.seed)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    cases = [c for c in CASES if not args.case or c[0] in args.case]
    unknown = set(args.case or []) - {c[0] for c in CASES}
    if unknown:
        ap.error("unknown case: %s" % ", ".join(sorted(unknown)))

    print("trainrun vs torch %s / transformers %s, fp32, batch %dx%d"
          % (torch.__version__, transformers.__version__, args.batch,
             args.seq_len))
    print("loss: |ours-torch|/|torch| <= %g; grads, per tensor: "
          "max|ours-torch|/max|torch| <= %g" % (LOSS_TOL, GRAD_TOL))
    results = []
    with tempfile.TemporaryDirectory(prefix="trparity-") as tmp:
        work = args.keep or tmp
        for name, flags in cases:
            try:
                results.append(one_case(name, flags, args.tr_parity, work,
                                        args, torch, transformers, st_torch,
                                        safe_open))
            except Exception as e:  # a failed run is a failed case
                results.append({"name": name, "problems": [str(e)],
                                "rows": []})

    hdr = "%-18s %10s %12s %12s %10s %6s %10s %10s  %s" % (
        "case", "params", "loss ours", "loss torch", "loss rel", "grads",
        "max rel", "norm rel", "result")
    print()
    print(hdr)
    print("-" * len(hdr))
    failed = 0
    for r in results:
        ok = not r["problems"]
        failed += not ok
        if "loss_ours" not in r:
            print("%-18s %s  FAIL" % (r["name"], "-" * 60))
        else:
            worst = max(r["rows"], key=lambda x: x[2]) if r["rows"] else None
            worst_n = max((x[3] for x in r["rows"]), default=float("nan"))
            print("%-18s %10d %12.8f %12.8f %10.2e %6d %10.2e %10.2e  %s" % (
                r["name"], r["n_params"], r["loss_ours"], r["loss_torch"],
                r["loss_rel"], len(r["rows"]),
                worst[2] if worst else float("nan"), worst_n,
                "ok" if ok else "FAIL"))
            if worst:
                print("%-18s worst gradient: %s" % ("", worst[0]))
        if args.verbose:
            for k, shape, mx, nr in r["rows"]:
                print("    %-48s %-16s max rel %.2e  norm rel %.2e"
                      % (k, "x".join(map(str, shape)), mx, nr))
        for p in r["problems"]:
            print("    problem: %s" % p)
    print()
    print("parity: %d of %d cases passed" % (len(results) - failed,
                                              len(results)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
