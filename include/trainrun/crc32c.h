/* trainrun/crc32c.h: CRC-32C (Castagnoli, reflected polynomial 0x82f63b78),
 * the checksum of checkpoint chunks and of TensorBoard's TFRecord frames.
 *
 * tr_crc32c(0, "123456789", 9) = 0xe3069283; tr_crc32c(tr_crc32c(0, a, n),
 * b, m) is the CRC of a followed by b, so data can be checksummed in pieces.
 * Uses SSE 4.2's crc32 instruction when the CPU has it (some 20x a table).
 */
#ifndef TRAINRUN_CRC32C_H
#define TRAINRUN_CRC32C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* CRC-32C of data continuing from crc (0 to start). Thread-safe. */
uint32_t tr_crc32c(uint32_t crc, const void* data, size_t n);
/* TFRecord's mask: ((crc >> 15) | (crc << 17)) + 0xa282ead8. */
uint32_t tr_crc32c_mask(uint32_t crc);

#ifdef __cplusplus
}
#endif

#endif /* TRAINRUN_CRC32C_H */
