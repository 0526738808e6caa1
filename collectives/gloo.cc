// collectives/gloo.cc: the Gloo backend -- the only C++ in the tree, a shim
// between the C process-group engine and Debian's libgloo (0.5, TCP
// transport). Rendezvous goes through our store (TrStore implements
// gloo::rendezvous::Store over tr_store_prefix_*); the TCP device binds the
// address that routes to the store (or TRAINRUN_GLOO_SOCKET_IFNAME).
//
// Runs on the group's communication thread (queue.c). Collectives use
// Gloo's algorithms with our own element-wise reduction (reduce.c), so every
// dtype and reduce op works; bf16/f16 sums go through float32. Gloo has no
// reduce-scatter of its own in this version that takes a reduction
// function, so reduce_scatter is a ring over unbound buffers. Send/recv are
// posted and left pending; progress() waits on them and is interrupted by
// abortWait*() when new work is queued. Aborting a context (watchdog) makes
// every pair raise, which unblocks whatever waits on it here and, through
// the closed sockets, on the peers.
#include "config.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include <gloo/allgather.h>                 // allgather
#include <gloo/allreduce.h>                 // allreduce with a reduce function
#include <gloo/alltoall.h>                  // alltoall
#include <gloo/alltoallv.h>                 // alltoallv (uneven splits)
#include <gloo/barrier.h>                   // barrier
#include <gloo/broadcast.h>                 // broadcast
#include <gloo/reduce.h>                    // reduce to a root
#include <gloo/rendezvous/context.h>        // connectFullMesh
#include <gloo/rendezvous/store.h>          // the Store interface we implement
#include <gloo/transport/tcp/device.h>      // TCP transport
#include <gloo/transport/unbound_buffer.h>  // send/recv, the ring

#include "core/clock.h"
#include "collectives/internal.h"
#include "trainrun/error.h"
#include "trainrun/log.h"
#include "trainrun/param.h"

namespace {

using gloo::transport::UnboundBuffer;
using ms = std::chrono::milliseconds;

// Slot prefixes of our own transfers (Gloo's algorithms use small ones in
// the top byte; these never collide with them).
constexpr uint64_t kP2PSlot = 0xEEull << 56;
constexpr uint64_t kRingSlot = 0xEDull << 56;

// gloo::rendezvous::Store over a PrefixStore view; keys go under "gloo/".
// Its waits (get waits for the key too) give up, with the reason, once the
// job's failure report exists, the group broke or its queue is stopping
// (tr__pg_store_wait): a peer that died before the first collective does
// not keep the set-up, and so the exit of the survivors, waiting.
class TrStore : public gloo::rendezvous::Store {
 public:
  TrStore(tr__pg_backend_t* be, tr_store_client_t* sc, tr_store_prefix_t* sp)
      : be_(be), sc_(sc), sp_(sp) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    std::string k = "gloo/" + key;
    int rc = tr_store_prefix_set(sp_, k.c_str(), data.data(), data.size());
    if (rc < 0) throw std::runtime_error(err("set", key, rc));
  }

  std::vector<char> get(const std::string& key) override {
    wait_for({key}, tr_pg_timeout(be_->pg));
    std::string k = "gloo/" + key;
    void* v = nullptr;
    size_t n = 0;
    int rc = tr_store_prefix_get(sp_, k.c_str(), &v, &n);
    if (rc < 0) throw std::runtime_error(err("get", key, rc));
    std::vector<char> out(static_cast<char*>(v), static_cast<char*>(v) + n);
    free(v);
    return out;
  }

  void wait(const std::vector<std::string>& keys) override {
    wait_for(keys, tr_pg_timeout(be_->pg));
  }

  void wait(const std::vector<std::string>& keys, const ms& timeout) override {
    wait_for(keys, timeout.count() > 0 ? static_cast<int64_t>(timeout.count())
                                       : tr_pg_timeout(be_->pg));
  }

 private:
  void wait_for(const std::vector<std::string>& keys, int64_t timeout_ms) {
    std::vector<std::string> full;
    std::vector<const char*> ptrs;
    for (const auto& k : keys) full.push_back("gloo/" + k);
    for (const auto& k : full) ptrs.push_back(k.c_str());
    char why[512] = "";
    int rc = tr__pg_store_wait(be_->pg, &be_->stop, sc_, sp_, ptrs.data(),
                               ptrs.size(), timeout_ms, why, sizeof why);
    if (rc < 0)
      throw std::runtime_error(std::string("waiting for '") +
                               (keys.empty() ? "" : keys[0]) + "': " + why);
  }
  static std::string err(const char* what, const std::string& key, int rc) {
    return std::string("store ") + what + " '" + key + "': " + tr_strerror(rc);
  }
  tr__pg_backend_t* be_;
  tr_store_client_t* sc_;
  tr_store_prefix_t* sp_;
};

// One pending send or receive.
struct Pending {
  tr_pg_work_t* w;
  int op;
  bool send;
  std::unique_ptr<UnboundBuffer> buf;
};

// Scratch memory kept between ops (fresh pages cost a fault each).
class Scratch {
 public:
  char* get(size_t bytes) {
    if (bytes > cap_) {
      buf_.reset(new char[bytes]);
      cap_ = bytes;
    }
    return buf_.get();
  }
  // Give big buffers back after the op.
  void trim() {
    if (cap_ > (size_t{256} << 20)) {
      buf_.reset();
      cap_ = 0;
    }
  }

 private:
  std::unique_ptr<char[]> buf_;
  size_t cap_ = 0;
};

struct Impl {
  std::shared_ptr<gloo::rendezvous::Context> ctx;
  Scratch scratch[3];  // comm thread only
  std::mutex mu;       // ctx for abort; waiting; woken
  UnboundBuffer* waiting = nullptr;
  bool waiting_send = false;
  bool woken = false;
  std::deque<Pending> pending;  // comm thread only
  uint32_t tag = 0;             // comm thread only
};

Impl* impl_of(tr__pg_backend_t* be) { return static_cast<Impl*>(be->impl); }

// TCP devices are shared by every context on one address (each owns an
// event-loop thread).
std::mutex g_dev_mu;
std::map<std::string, std::shared_ptr<gloo::transport::Device>> g_devs;

// The local address that routes to host:port ("[v6]:port" too).
int route_address(const char* peer, std::string* out) {
  std::string s(peer);
  std::string host, port;
  if (!s.empty() && s[0] == '[') {
    size_t e = s.find(']');
    if (e == std::string::npos || e + 2 > s.size()) return TR_EINVAL;
    host = s.substr(1, e - 1);
    port = s.substr(e + 2);
  } else {
    size_t c = s.rfind(':');
    if (c == std::string::npos) return TR_EINVAL;
    host = s.substr(0, c);
    port = s.substr(c + 1);
  }
  struct addrinfo hints;
  memset(&hints, 0, sizeof hints);
  hints.ai_socktype = SOCK_DGRAM;
  struct addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0 || !res)
    return TR_ENOTFOUND;
  int rc = TR_ENETUNREACH;
  for (struct addrinfo* ai = res; ai; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_DGRAM, 0);
    if (fd < 0) continue;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<struct sockaddr*>(&ss), &sl) == 0) {
      char buf[INET6_ADDRSTRLEN];
      const void* a =
          ss.ss_family == AF_INET6
              ? static_cast<const void*>(
                    &reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr)
              : static_cast<const void*>(
                    &reinterpret_cast<sockaddr_in*>(&ss)->sin_addr);
      if (inet_ntop(ss.ss_family, a, buf, sizeof buf)) {
        *out = buf;
        rc = 0;
      }
    }
    close(fd);
    if (rc == 0) break;
  }
  freeaddrinfo(res);
  return rc;
}

std::shared_ptr<gloo::transport::Device> device_for(tr__pg_world_t* wd) {
  gloo::transport::tcp::attr attr;
  const char* ifname = tr_param_str(TR_PARAM_GLOO_SOCKET_IFNAME);
  std::string key;
  if (wd->gloo_host) {
    attr.hostname = wd->gloo_host;
    key = "host:" + attr.hostname;
  } else if (ifname[0]) {
    attr.iface = ifname;
    key = "iface:" + attr.iface;
  } else {
    std::string a = "127.0.0.1";
    if (wd->store) {
      int rc = route_address(tr_store_client_peer(wd->store), &a);
      if (rc < 0)
        TR_LOG_WARN(COLL, "no route to the store at %s (%s): gloo binds %s",
                    tr_store_client_peer(wd->store), tr_strerror(rc),
                    a.c_str());
    }
    attr.hostname = a;
    key = "host:" + a;
  }
  std::lock_guard<std::mutex> lock(g_dev_mu);
  auto it = g_devs.find(key);
  if (it != g_devs.end()) return it->second;
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  g_devs[key] = dev;
  return dev;
}

// Milliseconds left until w's deadline, plus the grace that lets the
// watchdog report the timeout first.
ms left(const tr_pg_work_t* w) {
  int64_t l = (w->deadline_ns - tr__now_ns()) / 1000000 + TR__PG_GRACE_MS;
  return ms(l < 1 ? 1 : l);
}

template <typename O>
void set_output(O& o, void* p, size_t n, size_t esz) {
  switch (esz) {
    case 1:
      o.template setOutput<uint8_t>(static_cast<uint8_t*>(p), n);
      break;
    case 2:
      o.template setOutput<uint16_t>(static_cast<uint16_t*>(p), n);
      break;
    case 4:
      o.template setOutput<uint32_t>(static_cast<uint32_t*>(p), n);
      break;
    default:
      o.template setOutput<uint64_t>(static_cast<uint64_t*>(p), n);
      break;
  }
}

gloo::AllreduceOptions::Func reducer(tr_dtype_t dt, tr_pg_reduce_op_t op) {
  return [dt, op](void* c, const void* a, const void* b, size_t n) {
    tr__reduce(dt, op, c, a, b, n);
  };
}

void all_reduce(Impl* im, tr_pg_t* pg, tr_pg_work_t* w, tr__pg_op_t* op) {
  size_t n = static_cast<size_t>(tr_tensor_numel(&op->out));
  tr_dtype_t dt = op->out.dtype;
  void* p = tr_tensor_data(&op->out);
  if (n == 0) return;
  float* f = nullptr;
  if (tr__reduce_in_f32(dt, op->rop)) {
    f = reinterpret_cast<float*>(im->scratch[0].get(n * sizeof(float)));
    tr__to_f32(dt, p, f, n);
  }
  if (pg->size > 1) {
    gloo::AllreduceOptions o(im->ctx);
    if (f) {
      o.setOutput<float>(f, n);
      o.setReduceFunction(reducer(TR_F32, op->rop));
    } else {
      set_output(o, p, n, tr_dtype_size(dt));
      o.setReduceFunction(reducer(dt, op->rop));
    }
    o.setTag(im->tag++);
    o.setTimeout(left(w));
    gloo::allreduce(o);
  }
  if (f) {
    if (op->rop == TR_PG_AVG) tr__divide(TR_F32, f, n, pg->size);
    tr__from_f32(dt, f, p, n);
  } else if (op->rop == TR_PG_AVG) {
    tr__divide(dt, p, n, pg->size);
  }
}

void all_gather(Impl* im, tr_pg_t* pg, tr_pg_work_t* w, tr__pg_op_t* op) {
  size_t bytes = tr_tensor_nbytes(&op->in);
  if (bytes == 0) return;
  if (pg->size == 1) {
    memcpy(tr_tensor_data(&op->out), tr_tensor_data(&op->in), bytes);
    return;
  }
  gloo::AllgatherOptions o(im->ctx);
  o.setInput<uint8_t>(static_cast<uint8_t*>(tr_tensor_data(&op->in)), bytes);
  o.setOutput<uint8_t>(static_cast<uint8_t*>(tr_tensor_data(&op->out)),
                       bytes * static_cast<size_t>(pg->size));
  o.setTag(im->tag++);
  o.setTimeout(left(w));
  gloo::allgather(o);
}

// Ring reduce-scatter: at step s rank r sends its partial of chunk
// (r - s - 1) to r + 1 and adds its own piece of chunk (r - s - 2) to the
// partial received from r - 1; after size - 1 steps it holds chunk r.
void reduce_scatter(Impl* im, tr_pg_t* pg, tr_pg_work_t* w, tr__pg_op_t* op) {
  size_t c = static_cast<size_t>(tr_tensor_numel(&op->out));
  tr_dtype_t dt = op->out.dtype;
  uint32_t tag = im->tag++;
  if (c == 0) return;
  int n = pg->size, r = pg->rank;
  bool f32 = tr__reduce_in_f32(dt, op->rop) != 0;
  tr_dtype_t at = f32 ? TR_F32 : dt;
  size_t aes = tr_dtype_size(at), bytes = c * aes;
  const char* in = static_cast<const char*>(tr_tensor_data(&op->in));
  if (f32) {
    size_t total = c * static_cast<size_t>(n);
    float* inf =
        reinterpret_cast<float*>(im->scratch[2].get(total * sizeof(float)));
    tr__to_f32(dt, in, inf, total);
    in = reinterpret_cast<const char*>(inf);
  }
  auto chunk = [&](int i) { return in + static_cast<size_t>(i) * bytes; };
  char* acc = im->scratch[0].get(bytes);
  char* tmp = im->scratch[1].get(bytes);
  memcpy(acc, chunk((r - 1 + n) % n), bytes);
  if (n > 1) {
    int right = (r + 1) % n, leftr = (r - 1 + n) % n;
    auto sbuf = im->ctx->createUnboundBuffer(acc, bytes);
    auto rbuf = im->ctx->createUnboundBuffer(tmp, bytes);
    for (int s = 0; s < n - 1; s++) {
      uint64_t slot = kRingSlot | (static_cast<uint64_t>(tag) << 20) |
                      static_cast<uint64_t>(s);
      rbuf->recv(leftr, slot);
      sbuf->send(right, slot);
      rbuf->waitRecv(left(w));
      sbuf->waitSend(left(w));
      int idx = ((r - s - 2) % n + 2 * n) % n;
      tr__reduce(at, op->rop, acc, tmp, chunk(idx), c);
    }
  }
  if (op->rop == TR_PG_AVG) tr__divide(at, acc, c, n);
  if (f32)
    tr__from_f32(dt, reinterpret_cast<const float*>(acc),
                 tr_tensor_data(&op->out), c);
  else
    memcpy(tr_tensor_data(&op->out), acc, bytes);
}

void broadcast(Impl* im, tr_pg_t* pg, tr_pg_work_t* w, tr__pg_op_t* op) {
  size_t bytes = tr_tensor_nbytes(&op->out);
  if (bytes == 0 || pg->size == 1) return;
  gloo::BroadcastOptions o(im->ctx);
  o.setOutput<uint8_t>(static_cast<uint8_t*>(tr_tensor_data(&op->out)), bytes);
  o.setRoot(op->peer);
  o.setTag(im->tag++);
  o.setTimeout(left(w));
  gloo::broadcast(o);
}

void reduce(Impl* im, tr_pg_t* pg, tr_pg_work_t* w, tr__pg_op_t* op) {
  size_t n = static_cast<size_t>(tr_tensor_numel(&op->out));
  tr_dtype_t dt = op->out.dtype;
  if (n == 0) return;
  bool root = pg->rank == op->peer;
  bool f32 = tr__reduce_in_f32(dt, op->rop) != 0;
  tr_dtype_t at = f32 ? TR_F32 : dt;
  size_t aes = tr_dtype_size(at);
  void* p = tr_tensor_data(&op->out);
  // Non-roots reduce from a copy: their tensor stays as it was.
  void* buf = p;
  if (f32 || !root) {
    buf = im->scratch[0].get(n * aes);
    if (f32)
      tr__to_f32(dt, p, static_cast<float*>(buf), n);
    else
      memcpy(buf, p, n * aes);
  }
  if (pg->size > 1) {
    gloo::ReduceOptions o(im->ctx);
    set_output(o, buf, n, aes);
    o.setRoot(op->peer);
    o.setReduceFunction(reducer(at, op->rop));
    o.setTag(im->tag++);
    o.setTimeout(left(w));
    gloo::reduce(o);
  }
  if (!root) return;
  if (op->rop == TR_PG_AVG) tr__divide(at, buf, n, pg->size);
  if (f32) tr__from_f32(dt, reinterpret_cast<const float*>(buf), p, n);
}

void all_to_all(Impl* im, tr_pg_t* pg, tr_pg_work_t* w, tr__pg_op_t* op) {
  size_t esz = tr_dtype_size(op->in.dtype);
  uint8_t* in = static_cast<uint8_t*>(tr_tensor_data(&op->in));
  uint8_t* out = static_cast<uint8_t*>(tr_tensor_data(&op->out));
  if (pg->size == 1) {
    memcpy(out, in, tr_tensor_nbytes(&op->in));
    return;
  }
  if (!op->in_counts) {
    size_t bytes = tr_tensor_nbytes(&op->in);
    if (bytes == 0) return;
    gloo::AlltoallOptions o(im->ctx);
    o.setInput<uint8_t>(in, bytes);
    o.setOutput<uint8_t>(out, bytes);
    o.setTag(im->tag++);
    o.setTimeout(left(w));
    gloo::alltoall(o);
    return;
  }
  std::vector<int64_t> ib(static_cast<size_t>(pg->size)),
      ob(static_cast<size_t>(pg->size));
  for (int i = 0; i < pg->size; i++) {
    ib[static_cast<size_t>(i)] = op->in_counts[i] * static_cast<int64_t>(esz);
    ob[static_cast<size_t>(i)] = op->out_counts[i] * static_cast<int64_t>(esz);
  }
  gloo::AlltoallvOptions o(im->ctx);
  o.setInput<uint8_t>(in, ib);
  o.setOutput<uint8_t>(out, ob);
  o.setTag(im->tag++);
  o.setTimeout(left(w));
  gloo::alltoallv(o);
}

void barrier(Impl* im, tr_pg_t* pg, tr_pg_work_t* w) {
  if (pg->size == 1) return;
  gloo::BarrierOptions o(im->ctx);
  o.setTag(im->tag++);
  o.setTimeout(left(w));
  gloo::barrier(o);
}

// Post a send or receive; it completes in progress().
void post_p2p(Impl* im, tr_pg_work_t* w, int i) {
  tr__pg_op_t* op = &w->ops[i];
  bool send = op->type == TR_PG_OP_SEND;
  tr_tensor_t* t = send ? &op->in : &op->out;
  Pending p;
  p.w = w;
  p.op = i;
  p.send = send;
  p.buf = im->ctx->createUnboundBuffer(tr_tensor_data(t), tr_tensor_nbytes(t));
  uint64_t slot = kP2PSlot | static_cast<uint32_t>(op->tag);
  if (send)
    p.buf->send(op->peer, slot);
  else
    p.buf->recv(op->peer, slot);
  im->pending.push_back(std::move(p));
}

void drop_pending(Impl* im, tr_pg_work_t* w) {
  for (auto it = im->pending.begin(); it != im->pending.end();)
    it = it->w == w ? im->pending.erase(it) : it + 1;
}

int ops_left(Impl* im, tr_pg_work_t* w) {
  int n = 0;
  for (const auto& p : im->pending) n += p.w == w;
  return n;
}

int run_op(Impl* im, tr_pg_t* pg, tr_pg_work_t* w, int i) {
  tr__pg_op_t* op = &w->ops[i];
  switch (op->type) {
    case TR_PG_OP_ALL_REDUCE:
      all_reduce(im, pg, w, op);
      return 0;
    case TR_PG_OP_ALL_GATHER:
      all_gather(im, pg, w, op);
      return 0;
    case TR_PG_OP_REDUCE_SCATTER:
      reduce_scatter(im, pg, w, op);
      return 0;
    case TR_PG_OP_BROADCAST:
      broadcast(im, pg, w, op);
      return 0;
    case TR_PG_OP_REDUCE:
      reduce(im, pg, w, op);
      return 0;
    case TR_PG_OP_ALL_TO_ALL:
      all_to_all(im, pg, w, op);
      return 0;
    case TR_PG_OP_BARRIER:
      barrier(im, pg, w);
      return 0;
    case TR_PG_OP_SEND:
    case TR_PG_OP_RECV:
      post_p2p(im, w, i);
      return 1;
    default:
      return TR_EINVAL;
  }
}

}  // namespace

extern "C" {

static int gloo_create(tr__pg_backend_t* be, char* err, size_t errlen) {
  tr_pg_t* pg = be->pg;
  tr__pg_world_t* wd = pg->world;
  Impl* im = new (std::nothrow) Impl;
  if (!im) return TR_ENOMEM;
  int64_t timeout = tr_pg_timeout(pg);
  tr_store_client_t* sc = nullptr;
  tr_store_prefix_t sp;
  int rc = tr__pg_store_open(pg, &sc, &sp);
  if (rc < 0) {
    snprintf(err, errlen, "gloo rendezvous: cannot connect to the store: %s",
             tr_strerror(rc));
    delete im;
    return rc;
  }
  try {
    auto dev = device_for(wd);
    im->ctx = std::make_shared<gloo::rendezvous::Context>(pg->rank, pg->size);
    im->ctx->setTimeout(ms(timeout));
    TrStore store(be, sc, &sp);
    im->ctx->connectFullMesh(store, dev);
  } catch (const std::exception& e) {
    snprintf(err, errlen, "gloo rendezvous: %s", e.what());
    tr__pg_store_close(sc, &sp);
    delete im;
    return TR_EGLOO;
  }
  tr__pg_store_close(sc, &sp);
  __atomic_store_n(&be->impl, static_cast<void*>(im), __ATOMIC_RELEASE);
  return 0;
}

static int gloo_start(tr__pg_backend_t* be, tr_pg_work_t* w, char* err,
                      size_t errlen) {
  Impl* im = impl_of(be);
  int pending = 0;
  try {
    for (int i = 0; i < w->n_ops; i++) {
      int rc = run_op(im, be->pg, w, i);
      if (rc < 0) {
        drop_pending(im, w);
        snprintf(err, errlen, "unknown op %d",
                 static_cast<int>(w->ops[i].type));
        return rc;
      }
      pending |= rc;
    }
  } catch (const std::exception& e) {
    drop_pending(im, w);
    for (auto& sc : im->scratch) sc.trim();
    snprintf(err, errlen, "%s", e.what());
    return TR_EGLOO;
  }
  for (auto& sc : im->scratch) sc.trim();
  return pending ? 1 : 0;
}

static void gloo_progress(tr__pg_backend_t* be, int64_t timeout_ms) {
  (void)timeout_ms;  // gloo's waits cannot poll: waiting is interrupted
  Impl* im = impl_of(be);
  Pending* p;
  {
    std::lock_guard<std::mutex> lock(im->mu);
    if (im->woken) {
      im->woken = false;
      return;
    }
    if (im->pending.empty()) return;
    p = &im->pending.front();
    im->waiting = p->buf.get();
    im->waiting_send = p->send;
  }
  tr_pg_work_t* w = p->w;
  bool ok = false;
  std::string failure;
  try {
    ok = p->send ? p->buf->waitSend(left(w)) : p->buf->waitRecv(left(w));
  } catch (const std::exception& e) {
    failure = e.what();
  }
  {
    std::lock_guard<std::mutex> lock(im->mu);
    im->waiting = nullptr;
    im->woken = false;
  }
  if (!failure.empty()) {
    drop_pending(im, w);
    tr__work_finish(w, TR_EGLOO, "failed: %s", failure.c_str());
    tr__work_retire(w);
    __atomic_sub_fetch(&be->npending, 1, __ATOMIC_RELAXED);
    return;
  }
  if (!ok) return;  // woken: new work is queued
  im->pending.pop_front();
  if (ops_left(im, w) == 0) {
    tr__work_finish(w, 0, NULL);
    tr__work_retire(w);
    __atomic_sub_fetch(&be->npending, 1, __ATOMIC_RELAXED);
  }
}

static void gloo_wake(tr__pg_backend_t* be) {
  Impl* im = static_cast<Impl*>(__atomic_load_n(&be->impl, __ATOMIC_ACQUIRE));
  if (!im) return;
  std::lock_guard<std::mutex> lock(im->mu);
  im->woken = true;
  if (im->waiting) {
    if (im->waiting_send)
      im->waiting->abortWaitSend();
    else
      im->waiting->abortWaitRecv();
  }
}

// Make every pair of the context raise: a receive that waits 0 ms times out,
// and Gloo answers a timeout by signalling every pair of the context (public
// API only; the pairs close their sockets, so peers see it too).
static void gloo_abort(tr__pg_backend_t* be) {
  Impl* im = static_cast<Impl*>(__atomic_load_n(&be->impl, __ATOMIC_ACQUIRE));
  if (!im) return;
  std::lock_guard<std::mutex> lock(im->mu);
  if (!im->ctx) return;
  char dummy = 0;
  try {
    auto buf = im->ctx->createUnboundBuffer(&dummy, 1);
    buf->waitRecv(nullptr, ms(0));
  } catch (const std::exception&) {
  }
}

static void gloo_destroy(tr__pg_backend_t* be) {
  Impl* im = impl_of(be);
  if (!im) return;
  while (!im->pending.empty()) {
    tr_pg_work_t* w = im->pending.front().w;
    drop_pending(im, w);
    tr__work_finish(w, TR_EABORTED, "aborted: the group was freed");
    tr__work_retire(w);
  }
  {
    std::lock_guard<std::mutex> lock(im->mu);
    im->ctx.reset();
  }
  delete im;
  be->impl = nullptr;
}

const tr__pg_backend_vt_t tr__pg_gloo_vt = {
    TR_PG_BACKEND_GLOO, "gloo",    1,          gloo_create, gloo_start,
    gloo_progress,      gloo_wake, gloo_abort, nullptr,     nullptr,
    gloo_destroy,       nullptr,
};

}  // extern "C"
