/* core/internal.h: file-system helpers shared by the layers that write
 * files (checkpoint/, trainer/, flight_recorder/); not public. The clock is
 * core/clock.h, the growable buffer core/buf.h. */
#ifndef CORE_INTERNAL_H
#define CORE_INTERNAL_H

#include <stddef.h>
#include <stdio.h>

#include "core/buf.h"
#include "trainrun/errmsg.h"

/* mkdir -p; 0 or a negated errno (message names the folder). */
int tr__mkdir_p(const char* path, tr_errmsg_t* err);

/* An output file written under "<path>.tmp" and renamed into place by
 * tr__afile_commit (after fflush + fsync of the file and an fsync of its
 * folder), so readers never see a partial file. tr__afile_abort removes the
 * temporary file. */
typedef struct {
  FILE* f;
  char* path;
  char* tmp;
} tr__afile_t;

int tr__afile_open(tr__afile_t* af, const char* path, tr_errmsg_t* err);
int tr__afile_write(tr__afile_t* af, const void* buf, size_t n,
                    tr_errmsg_t* err);
int tr__afile_commit(tr__afile_t* af, tr_errmsg_t* err);
void tr__afile_abort(tr__afile_t* af);

/* The whole of buf as path, through the above: readers see the old file or
 * all of the new one. */
int tr__write_file(const char* path, const void* buf, size_t n,
                   tr_errmsg_t* err);

/* Append the whole file at path to b: 0, a negated errno (cannot open),
 * TR_EIO (read error) or TR_ENOMEM. */
int tr__read_file(const char* path, tr__buf_t* b);

/* fsync the folder holding path (best effort; 0 or a negated errno). */
int tr__fsync_parent(const char* path);

#endif /* CORE_INTERNAL_H */
