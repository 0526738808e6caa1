#!/usr/bin/env python3
"""tests/interop/store_interop.py: trainrun's TCPStore against PyTorch's.

Run where `import torch` works (the GPU machines have torch 2.11; a CPU
build is enough). Everything listens on 127.0.0.1 only.

    python3 tests/interop/store_interop.py --build BUILD_DIR

BUILD_DIR holds `trainrun` and `tests/interop/store_drive` (make check
builds the latter). Parts, each printed as PASS/FAIL:

  wire     the same raw request bytes sent to PyTorch's libuv server and to
           `trainrun store`; every reply (or silence, or close) must match,
           except the few differences trainrun makes on purpose (listed in
           DELIBERATE below, shown but not failed)
  pyclient PyTorch's TCPStore(is_master=False) drives our server through
           every command (set/get/add/compare_set/check/wait with timeout/
           delete_key/num_keys/append/multi_get/multi_set/queues/
           PrefixStore), and the keys it writes are read back raw
  cclient  our C client (store_drive) drives PyTorch's server through every
           call; PyTorch's client then reads what it wrote
  gloo     4 processes init_process_group("gloo") rendezvous on our server
           (TORCHELASTIC_USE_AGENT_STORE=True) and all_reduce

Exit status 0 when every part passed.
"""
import argparse
import datetime
import os
import socket
import struct
import subprocess
import sys
import time

MAGIC = 0x3C85F7CE


def key(k):
    k = k.encode() if isinstance(k, str) else k
    return struct.pack("<Q", len(k)) + k


def u64(v):
    return struct.pack("<Q", v)


def q(cmd, *fields):
    return bytes([cmd]) + b"".join(fields)


VALIDATE = q(0, struct.pack("<I", MAGIC))


def ping(n):
    return q(13, struct.pack("<I", n))


def keys(cmd, *ks):
    return q(cmd, u64(len(ks)), *[key(k) for k in ks])


# Differences trainrun makes on purpose: step name -> why.
DELIBERATE = {
    "cas-absent-nonempty wakes waiter":
        "PyTorch wakes WAITs on a COMPARE_SET that stores nothing; "
        "trainrun wakes them only when the key exists",
    "ping before validate":
        "PyTorch ignores a first request that is not VALIDATE and later "
        "parses it anyway; trainrun closes the client",
    "bad magic":
        "PyTorch closes a wrong VALIDATE magic only when more bytes come; "
        "trainrun closes at once",
    "second wait while pending":
        "PyTorch merges a second WAIT into the first; trainrun closes a "
        "client that breaks the one-request-in-flight rule",
    "second wait: after set wa": "follows from the line above",
    "second wait: after set wb": "follows from the line above",
}


class Conn:
    def __init__(self, port, validate=True):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if validate:
            self.s.sendall(VALIDATE)

    def read(self, wait=0.15):
        """Everything that arrives within `wait` s: bytes, b'' or 'EOF'."""
        out = b""
        self.s.settimeout(wait)
        try:
            while True:
                b = self.s.recv(65536)
                if not b:
                    return out + b"<EOF>"
                out += b
        except socket.timeout:
            return out
        except (ConnectionResetError, BrokenPipeError):
            return out + b"<EOF>"

    def send(self, data):
        try:
            self.s.sendall(data)
        except (ConnectionResetError, BrokenPipeError):
            pass


def wire_script(port):
    """The exchange: a list of (step, reply) for a server on port."""
    out = []
    c = Conn(port)

    def t(name, conn, data=None, wait=0.15):
        if data:
            conn.send(data)
        out.append((name, conn.read(wait)))

    t("ping", c, ping(0x01020304))
    t("set (no reply)", c, q(1, key("/foo"), key("bar")))
    t("wait present", c, keys(6, "/foo"))
    t("get", c, q(3, key("/foo")))
    t("get missing", c, q(3, key("/missing")))
    t("qpush", c, q(14, key("/q"), key("aa")))
    t("qpush 2", c, q(14, key("/q"), key("bbb")))
    t("qlen", c, q(16, key("/q")))
    t("qpop", c, q(15, key("/q")))
    t("qpop 2", c, q(15, key("/q")))
    t("qpop empty", c, q(15, key("/q")))
    t("qpop never pushed", c, q(15, key("/nq")))
    t("qlen never pushed", c, q(16, key("/nq")))
    t("qpush 3", c, q(14, key("/q"), key("c")))
    t("numkeys (queues not counted)", c, q(7))
    t("check nonempty queue", c, keys(5, "/q"))
    t("delete queue name", c, q(8, key("/q")))
    t("qlen after delete", c, q(16, key("/q")))
    t("cancel without wait", c, q(12))
    t("cas absent, empty expected", c, q(2, key("/cas"), key(""), key("new")))
    t("cas absent, expected given", c, q(2, key("/cas2"), key("exp"), key("n")))
    t("cas mismatch", c, q(2, key("/cas"), key("zzz"), key("other")))
    t("cas match", c, q(2, key("/cas"), key("new"), key("other")))
    t("numkeys", c, q(7))
    t("add", c, q(4, key("/ctr"), struct.pack("<q", 5)))
    t("get counter", c, q(3, key("/ctr")))
    t("add negative", c, q(4, key("/ctr"), struct.pack("<q", -7)))
    t("get counter 2", c, q(3, key("/ctr")))
    t("add init/ raw", c, q(4, key("init/"), struct.pack("<q", 1)))
    t("append new", c, q(9, key("/ap"), key("x")))
    t("append", c, q(9, key("/ap"), key("yz")))
    t("multi_get", c, keys(10, "/ap", "/ctr", "init/"))
    t("multi_get with missing", c, keys(10, "/ap", "/nope"))
    t("multi_set", c, q(11, u64(2), key("/m1"), key("v1"), key("/m2"), key("")))
    t("get empty value", c, q(3, key("/m2")))
    t("check 0 keys", c, keys(5))
    t("wait 0 keys", c, keys(6))
    t("check missing", c, keys(5, "/m1", "/absent"))
    t("delete", c, q(8, key("/m1")))
    t("delete again", c, q(8, key("/m1")))
    t("set stoll text", c, q(1, key("/nn2"), key(" 12abc")))
    t("add on stoll text", c, q(4, key("/nn2"), struct.pack("<q", 1)))
    # pipelined: several requests in one segment
    t("pipelined", c, ping(7) + q(7) + keys(5, "/foo") + q(3, key("/foo")))
    # split: one request a byte at a time
    req = q(2, key("/split"), key(""), key("sv"))
    for i in range(len(req) - 1):
        c.send(req[i:i + 1])
        time.sleep(0.002)
    t("split byte by byte", c, req[-1:])

    # WAIT released by each writer
    for name, data in [
        ("set", q(1, key("/w1"), key("v"))),
        ("add", q(4, key("/w2"), struct.pack("<q", 1))),
        ("append", q(9, key("/w3"), key("v"))),
        ("multi_set", q(11, u64(1), key("/w4"), key("v"))),
        ("compare_set", q(2, key("/w5"), key(""), key("v"))),
        ("queue_push", q(14, key("/w6"), key("v"))),
    ]:
        k = "/w" + str(1 + ["set", "add", "append", "multi_set",
                            "compare_set", "queue_push"].index(name))
        w = Conn(port)
        t("wait on %s target" % name, w, keys(6, k))
        t("%s by writer" % name, c, data)
        t("waiter after %s" % name, w)
        w.s.close()

    w = Conn(port)
    t("wait /x", w, keys(6, "/x"))
    t("cas-absent-nonempty", c, q(2, key("/x"), key("exp"), key("new")))
    t("cas-absent-nonempty wakes waiter", w)
    w.s.close()

    w1, w2 = Conn(port), Conn(port)
    t("w1 wait queue", w1, keys(6, "/q2"))
    t("w2 wait queue", w2, keys(6, "/q2"))
    t("push wakes one", c, q(14, key("/q2"), key("i")))
    t("w1 after push", w1)
    t("w2 after push", w2)
    t("push again", c, q(14, key("/q2"), key("j")))
    t("w1 after push 2", w1)
    t("w2 after push 2", w2)

    w = Conn(port)
    t("wait c", w, keys(6, "/wc"))
    t("cancel pending", w, q(12))
    t("set wc", c, q(1, key("/wc"), key("1")))
    t("after cancel, set sends nothing", w)
    t("multi-key wait with a present key and a queue", w,
      keys(6, "/wc", "/q2x", "/foo"))
    t("push q2x", c, q(14, key("/q2x"), key("i")))
    t("multi-key waiter released", w)

    v = Conn(port)
    t("validate twice", v, VALIDATE)
    v = Conn(port, validate=False)
    t("ping before validate", v, ping(7))
    v = Conn(port, validate=False)
    t("bad magic", v, q(0, struct.pack("<I", 1234)))
    v = Conn(port)
    t("set non-number", v, q(1, key("/nn"), key("abc")))
    t("add on non-number closes", v, q(4, key("/nn"), struct.pack("<q", 1)))
    v = Conn(port)
    t("unknown command closes", v, b"\x63")
    v = Conn(port)
    t("key of 9000 bytes closes", v, q(3, key(b"a" * 9000)))
    v = Conn(port)
    t("wait a", v, keys(6, "/wa"))
    t("second wait while pending", v, keys(6, "/wb"))
    t("set wa", c, q(1, key("/wa"), key("1")))
    t("second wait: after set wa", v)
    t("set wb", c, q(1, key("/wb"), key("1")))
    t("second wait: after set wb", v)
    t("first client still served", c, ping(99) + q(7))
    return out


def part_wire(py_port, tr_port):
    a = wire_script(py_port)
    b = wire_script(tr_port)
    bad = 0
    for (name, ra), (_, rb) in zip(a, b):
        if ra == rb:
            print("  same     %-48s %s" % (name, ra.hex(" ")[:60]))
        elif name in DELIBERATE:
            print("  differs  %-48s pytorch %s / trainrun %s  (on purpose: %s)"
                  % (name, ra.hex(" ")[:40], rb.hex(" ")[:40],
                     DELIBERATE[name]))
        else:
            print("  MISMATCH %-48s pytorch %s / trainrun %s"
                  % (name, ra.hex(" ")[:60], rb.hex(" ")[:60]))
            bad += 1
    print("  %d steps, %d unexpected differences" % (len(a), bad))
    return bad == 0


def part_pyclient(torch, dist, tr_port):
    td = datetime.timedelta
    s = dist.TCPStore("127.0.0.1", tr_port, None, False, timeout=td(seconds=10))
    s.set("foo", "bar")
    assert s.get("foo") == b"bar"
    assert s.add("ctr", 5) == 5 and s.add("ctr", -2) == 3
    assert s.get("ctr") == b"3"
    assert s.compare_set("cas", "", "v1") == b"v1"
    assert s.compare_set("cas", "v1", "v2") == b"v2"
    assert s.compare_set("cas", "zz", "v3") == b"v2"
    assert s.check(["foo", "ctr"]) and not s.check(["foo", "nope"])
    s.wait(["foo", "ctr"])
    t0 = time.time()
    try:
        s.wait(["nope"], td(milliseconds=300))
        raise AssertionError("wait did not time out")
    except Exception as e:  # DistStoreError
        assert "timeout" in str(e).lower() or "Timeout" in str(e), e
    assert time.time() - t0 < 5
    assert s.add("ctr", 1) == 4  # the CANCEL_WAIT kept the stream in sync
    s.append("ap", "x")
    s.append("ap", "yz")
    assert s.get("ap") == b"xyz"
    s.multi_set(["m1", "m2"], ["a", "b"])
    assert s.multi_get(["m1", "m2", "foo"]) == [b"a", b"b", b"bar"]
    n = s.num_keys()
    assert s.delete_key("m1") and not s.delete_key("m1")
    assert s.num_keys() == n - 1
    if hasattr(s, "queue_push"):
        s.queue_push("q", "one")
        s.queue_push("q", b"two")
        assert s.queue_len("q") == 2
        assert s.queue_pop("q") == b"one"
        assert s.queue_pop("q", block=False) == b"two"
        assert s.queue_len("q") == 0
    c2 = s.clone() if hasattr(s, "clone") else s
    assert c2.get("foo") == b"bar"
    # the PrefixStore layering init_process_group uses, as seen on the wire
    p = dist.PrefixStore("0/", dist.PrefixStore("default_pg", s))
    p.set("k", "pk")
    raw = Conn(tr_port)
    raw.send(q(3, key("/default_pg/0//k")))
    got = raw.read(0.5)
    assert got == u64(2) + b"pk", got
    # a client with world_size adds init/ raw
    s2 = dist.TCPStore("127.0.0.1", tr_port, 2, False, timeout=td(seconds=10))
    raw.send(q(3, key("init/")))
    assert raw.read(0.5) == u64(1) + b"1"
    del s2
    return True


def part_cclient(dist, drive, py_port):
    r = subprocess.run([drive, "127.0.0.1", str(py_port)],
                       capture_output=True, text=True, timeout=120)
    for line in r.stdout.splitlines():
        print("   ", line)
    if r.returncode != 0:
        print(r.stderr)
        return False
    td = datetime.timedelta
    s = dist.TCPStore("127.0.0.1", py_port, None, False, timeout=td(seconds=10))
    assert s.get("c/str") == b"written by C"
    assert s.get("c/ctr") == b"42"
    assert s.get("c/prefix/k") == b"pv"
    if hasattr(s, "queue_pop"):
        assert s.queue_pop("c/q", block=False) == b"from C"
    return True


GLOO_WORKER = r"""
import os, sys, datetime, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="env://",
                        timeout=datetime.timedelta(seconds=60))
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
g = [torch.zeros(1) for _ in range(dist.get_world_size())]
dist.all_gather(g, torch.tensor([float(dist.get_rank())]))
dist.barrier()
ok = t.item() == 10.0 and [x.item() for x in g] == [0.0, 1.0, 2.0, 3.0]
print("rank", dist.get_rank(), "all_reduce", t.item(), "ok" if ok else "BAD")
dist.destroy_process_group()
sys.exit(0 if ok else 1)
"""


def part_gloo(tr_port):
    procs = []
    for r in range(4):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(tr_port),
                   RANK=str(r), WORLD_SIZE="4", LOCAL_RANK=str(r),
                   TORCHELASTIC_USE_AGENT_STORE="True")
        procs.append(subprocess.Popen([sys.executable, "-c", GLOO_WORKER],
                                      env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    ok = True
    for p in procs:
        out, _ = p.communicate(timeout=180)
        lines = [l for l in out.splitlines() if l.startswith("rank")]
        print("   ", lines[-1] if lines else out[-500:])
        ok = ok and p.returncode == 0
    return ok


def start_trainrun(exe):
    p = subprocess.Popen([exe, "store", "--port", "0", "--host", "127.0.0.1"],
                         stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    return p, int(line.split()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=".", help="build directory")
    ap.add_argument("--parts", default="wire,pyclient,cclient,gloo")
    a = ap.parse_args()
    import torch
    import torch.distributed as dist
    print("torch", torch.__version__)
    exe = os.path.join(a.build, "trainrun")
    drive = os.path.join(a.build, "tests", "interop", "store_drive")
    results = {}
    for part in a.parts.split(","):
        tr, tr_port = start_trainrun(exe)
        py = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=30))
        print("== %s  (pytorch server port %d, trainrun server port %d)"
              % (part, py.port, tr_port))
        try:
            if part == "wire":
                ok = part_wire(py.port, tr_port)
            elif part == "pyclient":
                ok = part_pyclient(torch, dist, tr_port)
            elif part == "cclient":
                ok = part_cclient(dist, drive, py.port)
            elif part == "gloo":
                ok = part_gloo(tr_port)
            else:
                raise SystemExit("unknown part " + part)
        except Exception as e:  # report and go on with the other parts
            import traceback
            traceback.print_exc()
            ok = False
        finally:
            tr.terminate()
            tr.wait(timeout=10)
            del py
        results[part] = ok
        print("%s %s" % ("PASS" if ok else "FAIL", part))
    passed = sum(1 for v in results.values() if v)
    print("%d passed, %d failed" % (passed, len(results) - passed))
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
