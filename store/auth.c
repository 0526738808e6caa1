/* store/auth.c: the store token proof -- SHA-256 (FIPS 180-4), HMAC
 * (RFC 2104), random nonces and a constant-time compare.
 *
 * Protocol, after VALIDATE (and PING), only when the client has a token:
 *   client: 0x80                           (AUTH_HELLO)
 *   server: 0x00 + 32-byte server nonce Sn  (0x01 alone: no token required)
 *   client: 0x81 + 32-byte client nonce Cn + HMAC(token, "c" Sn Cn)
 *   server: 0x00 + HMAC(token, "s" Sn Cn)   (0x01 and a close: wrong token)
 * where HMAC is HMAC-SHA256 over the label "trainrun-store-auth-v1 " then
 * the side letter and both nonces. The token never crosses the wire, a
 * recorded exchange cannot be replayed (fresh Sn), and the client checks
 * that the server knows the token too.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include "store/internal.h"
#include "trainrun/error.h"

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1,
    0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3,
    0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
    0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147,
    0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
    0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
    0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
    0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static uint32_t ror(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void compress(uint32_t h[8], const uint8_t b[64]) {
  uint32_t w[64];
  for (int i = 0; i < 16; i++)
    w[i] = (uint32_t)b[4 * i] << 24 | (uint32_t)b[4 * i + 1] << 16 |
           (uint32_t)b[4 * i + 2] << 8 | b[4 * i + 3];
  for (int i = 16; i < 64; i++) {
    uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h[0], bb = h[1], c = h[2], d = h[3], e = h[4], f = h[5],
           g = h[6], hh = h[7];
  for (int i = 0; i < 64; i++) {
    uint32_t S1 = ror(e, 6) ^ ror(e, 11) ^ ror(e, 25);
    uint32_t ch = (e & f) ^ (~e & g);
    uint32_t t1 = hh + S1 + ch + K[i] + w[i];
    uint32_t S0 = ror(a, 2) ^ ror(a, 13) ^ ror(a, 22);
    uint32_t maj = (a & bb) ^ (a & c) ^ (bb & c);
    uint32_t t2 = S0 + maj;
    hh = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = bb;
    bb = a;
    a = t1 + t2;
  }
  h[0] += a;
  h[1] += bb;
  h[2] += c;
  h[3] += d;
  h[4] += e;
  h[5] += f;
  h[6] += g;
  h[7] += hh;
}

void tr__sha256_init(tr__sha256_t* s) {
  static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372,
                                 0xa54ff53a, 0x510e527f, 0x9b05688c,
                                 0x1f83d9ab, 0x5be0cd19};
  memcpy(s->h, iv, sizeof iv);
  s->nbytes = 0;
  s->fill = 0;
}

void tr__sha256_update(tr__sha256_t* s, const void* p, size_t n) {
  const uint8_t* b = p;
  s->nbytes += n;
  while (n > 0) {
    size_t take = 64 - s->fill;
    if (take > n) take = n;
    memcpy(s->block + s->fill, b, take);
    s->fill += take;
    b += take;
    n -= take;
    if (s->fill == 64) {
      compress(s->h, s->block);
      s->fill = 0;
    }
  }
}

void tr__sha256_final(tr__sha256_t* s, uint8_t out[32]) {
  uint64_t bits = s->nbytes * 8;
  uint8_t pad = 0x80;
  tr__sha256_update(s, &pad, 1);
  pad = 0;
  while (s->fill != 56) tr__sha256_update(s, &pad, 1);
  uint8_t len[8];
  for (int i = 0; i < 8; i++) len[i] = (uint8_t)(bits >> (56 - 8 * i));
  tr__sha256_update(s, len, 8);
  for (int i = 0; i < 8; i++) {
    out[4 * i] = (uint8_t)(s->h[i] >> 24);
    out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
    out[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
    out[4 * i + 3] = (uint8_t)s->h[i];
  }
}

void tr__hmac_sha256(const void* key, size_t klen, const void* msg, size_t mlen,
                     uint8_t out[32]) {
  uint8_t k[64] = {0};
  tr__sha256_t s;
  if (klen > 64) {
    tr__sha256_init(&s);
    tr__sha256_update(&s, key, klen);
    tr__sha256_final(&s, k);
  } else if (klen) {
    memcpy(k, key, klen);
  }
  uint8_t pad[64];
  for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x36;
  uint8_t inner[32];
  tr__sha256_init(&s);
  tr__sha256_update(&s, pad, 64);
  tr__sha256_update(&s, msg, mlen);
  tr__sha256_final(&s, inner);
  for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x5c;
  tr__sha256_init(&s);
  tr__sha256_update(&s, pad, 64);
  tr__sha256_update(&s, inner, 32);
  tr__sha256_final(&s, out);
  memset(k, 0, sizeof k);
}

void tr__store_auth_mac(const void* token, size_t tlen, char side,
                        const uint8_t snonce[TR__AUTH_NONCE],
                        const uint8_t cnonce[TR__AUTH_NONCE],
                        uint8_t mac[TR__AUTH_MAC]) {
  static const char label[] = "trainrun-store-auth-v1 ";
  uint8_t msg[sizeof label - 1 + 1 + 2 * TR__AUTH_NONCE];
  size_t n = 0;
  memcpy(msg, label, sizeof label - 1);
  n += sizeof label - 1;
  msg[n++] = (uint8_t)side;
  memcpy(msg + n, snonce, TR__AUTH_NONCE);
  n += TR__AUTH_NONCE;
  memcpy(msg + n, cnonce, TR__AUTH_NONCE);
  n += TR__AUTH_NONCE;
  tr__hmac_sha256(token, tlen, msg, n, mac);
}

int tr__store_random(void* buf, size_t n) {
  uint8_t* p = buf;
  while (n > 0) {
    ssize_t r = getrandom(p, n, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      return TR_EIO;
    }
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

int tr__store_ct_equal(const uint8_t* a, const uint8_t* b, size_t n) {
  volatile uint8_t d = 0;
  for (size_t i = 0; i < n; i++) d |= a[i] ^ b[i];
  return d == 0;
}
