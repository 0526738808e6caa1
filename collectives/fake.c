/* collectives/fake.c: the fake backend for dry runs. One process plays one
 * rank of an N-rank world: pg.c has already checked every op's shapes,
 * dtypes and peers against N and counted it, so an op here completes at
 * once without moving data (outputs keep their contents). `trainrun plan`
 * and config checks drive whole parallel layouts through it. */
#include "config.h"

#include "collectives/internal.h"

static int fake_create(tr__pg_backend_t* be, char* err, size_t errlen) {
  (void)be;
  (void)err;
  (void)errlen;
  return 0;
}

static int fake_start(tr__pg_backend_t* be, tr_pg_work_t* w, char* err,
                      size_t errlen) {
  (void)be;
  (void)w;
  (void)err;
  (void)errlen;
  return 0;
}

static void fake_destroy(tr__pg_backend_t* be) { (void)be; }

const tr__pg_backend_vt_t tr__pg_fake_vt = {
    .kind = TR_PG_BACKEND_FAKE,
    .name = "fake",
    .threaded = 0,
    .create = fake_create,
    .start = fake_start,
    .destroy = fake_destroy,
};
