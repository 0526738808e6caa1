/* core/crc32c.c: CRC-32C (Castagnoli), with SSE 4.2's crc32 instruction
 * when the CPU has it, else a table (trainrun/crc32c.h). Checkpoints
 * checksum their chunks with it; TensorBoard's TFRecord framing masks it. */
#include "config.h"

#include <stdint.h>
#include <string.h>

#include "trainrun/crc32c.h"

/* ---- CRC-32C: reflected polynomial 0x82f63b78; SSE 4.2 or a table ---- */

static uint32_t crc_table[256];
static int crc_ready;

static void crc_init(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    crc_table[i] = c;
  }
  __atomic_store_n(&crc_ready, 1, __ATOMIC_RELEASE);
}

#if defined(__x86_64__) && defined(__GNUC__)
/* SSE 4.2's crc32 instruction computes CRC-32C: 8 bytes per instruction,
 * some 20x the table (checkpoints checksum gigabytes). */
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc,
                                                         const uint8_t* p,
                                                         size_t n) {
  uint64_t c = ~crc;
  for (; n > 0 && ((uintptr_t)p & 7) != 0; n--)
    c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    c = __builtin_ia32_crc32di(c, v);
  }
  for (; n > 0; n--) c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
  return ~(uint32_t)c;
}
#endif

uint32_t tr_crc32c(uint32_t crc, const void* data, size_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (__builtin_cpu_supports("sse4.2")) return crc_hw(crc, data, n);
#endif
  if (!__atomic_load_n(&crc_ready, __ATOMIC_ACQUIRE)) crc_init();
  const uint8_t* p = data;
  crc = ~crc;
  for (size_t i = 0; i < n; i++)
    crc = crc_table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t tr_crc32c_mask(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}
