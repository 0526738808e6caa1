/* checkpoint/internal.h: helpers shared by the checkpoint module's files
 * (not public): durable small files, paths, clocks, dtype names. */
#ifndef CHECKPOINT_INTERNAL_H
#define CHECKPOINT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "core/internal.h" /* mkdir -p, atomic writes, clock */
#include "trainrun/checkpoint.h"
#include "trainrun/errmsg.h"

/* Magic and header size of a data file. */
#define TR__CKPT_MAGIC "TRCKPT01"
#define TR__CKPT_HEADER 64
#define TR__CKPT_ALIGN 64

/* Read a whole (small) file; *out is NUL-terminated, free()d by the
 * caller. */
int tr__ckpt_read_file(const char* path, char** out, size_t* n,
                       tr_errmsg_t* err);
/* fsync a folder (best effort: EINVAL is not an error). */
int tr__ckpt_fsync_dir(const char* dir);
/* malloc'd "a/b". */
char* tr__ckpt_join(const char* a, const char* b);

/* Element count of a box. */
int64_t tr__ckpt_volume(int ndim, const int64_t* sizes);

#endif /* CHECKPOINT_INTERNAL_H */
