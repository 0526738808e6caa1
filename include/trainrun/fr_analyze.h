/* trainrun/fr_analyze.h: the flight-recorder analyzer behind `trainrun fr
 * analyze` — reads a folder of per-rank dumps and says which rank diverged.
 *
 * It reads trainrun's dumps and PyTorch's: pickle (what PyTorch's
 * FlightRecorder writes and `torchfrtrace` loads) and the JSON twin, dump
 * versions "2.2" to "2.10" (fields a version lacks are treated as unknown:
 * pg_status, timeout_ms, is_p2p, thread_id/thread_name, comm_lib_version or
 * its older name nccl_version; JSON's 0 for "not discovered" reads as none).
 *
 * What it does, in order:
 *   1. load: one dump per rank; the rank is the number at the end of the
 *      file name (after the prefix, without a ".json"/".pkl" suffix). A
 *      pickle and its JSON twin for the same rank count once (the pickle).
 *   2. group: process groups from each rank's pg_config, keyed by name and
 *      member set (split_group can reuse names), as torchfrtrace does.
 *   3. align and match: per group, collectives by collective_seq_id (a
 *      coalesced run sharing one id is one call), send/recv by (src, dst) in
 *      order. A rank whose ring no longer holds a sequence number (evicted)
 *      is "unknown", not missing; a rank that never reached it is missing.
 *   4. check what torchfrtrace checks (Op.match): op type, input/output
 *      sizes (with all_to_all/scatter/gather exceptions and the
 *      all_reduce/all_gather/reduce_scatter size rules), dtype sets, state;
 *      plus sends without a recv and recvs without a send.
 *   5. blame: the ranks that disagree with the majority, the least advanced
 *      ranks for a state mismatch, the missing ranks; and write a verdict, a
 *      paragraph naming the culprit rank, op, sequence number and process
 *      group, since when the others wait, and the culprit's last completed op.
 *
 * Usage:
 *
 *     tr_fra_opts_t o;
 *     tr_fra_opts_init(&o);
 *     tr_fra_t* a = NULL;
 *     tr_errmsg_t err;
 *     int rc = tr_fra_load_dir(&a, "outputs/comm_traces", &o, &err);
 *     if (rc < 0) { fprintf(stderr, "trainrun: %s\n", err.message); ... }
 *     tr_fra_analyze(a);
 *     tr_fra_print_report(a, stdout);       // findings, then the verdict
 *     tr_fra_free(a);
 */
#ifndef TRAINRUN_FR_ANALYZE_H
#define TRAINRUN_FR_ANALYZE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "trainrun/errmsg.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The options, named after torchfrtrace's. */
typedef struct {
  const char* prefix;         /* -p: file-name prefix; NULL: inferred */
  int allow_incomplete_ranks; /* analyze even when a member's dump is
                                 missing (or unreadable: then skipped) */
  int mismatch_cap;           /* findings reported per group (default 10) */
  const int* selected_ranks;  /* -j table: only these ranks (NULL: all) */
  size_t n_selected_ranks;
  const char* const* pg_filters; /* -j table: only entries of groups whose
                                    name or desc is listed (NULL: all) */
  size_t n_pg_filters;
  int verbose; /* -j table and report: sizes, dtypes, times in each cell */
} tr_fra_opts_t;

/* Defaults: everything 0/NULL, mismatch_cap 10. */
void tr_fra_opts_init(tr_fra_opts_t* o);

/* Loaded dumps and, after tr_fra_analyze(), the findings. Opaque. */
typedef struct tr_fra tr_fra_t;

/* Kinds of finding, torchfrtrace's error classes first. */
typedef enum {
  TR_FRA_NOT_JOINED = 1,    /* ranks never entered a collective the others
                                entered ("Not all ranks joining") */
  TR_FRA_TYPE_MISMATCH,     /* COLLECTIVE_TYPE_MISMATCH */
  TR_FRA_SIZE_MISMATCH,     /* SIZE_OR_SYNTAX_MISMATCH */
  TR_FRA_DTYPE_MISMATCH,    /* COLLECTIVE_DTYPE_MISMATCH */
  TR_FRA_STATE_MISMATCH,    /* COLLECTIVE_STATE_MISMATCH: some ranks did
                                not complete what others completed */
  TR_FRA_ALLTOALL_MISMATCH, /* total input numel != total output numel */
  TR_FRA_SEND_NO_RECV,      /* a send whose peer never posted the recv */
  TR_FRA_RECV_NO_SEND,      /* a recv whose peer never posted the send */
  TR_FRA_P2P_SIZE_MISMATCH, /* matched send/recv of different sizes */
  TR_FRA_ALL_WAITING,       /* every member entered it, none completed */
  TR_FRA_MISSING_DUMP       /* a member rank left no dump */
} tr_fra_kind_t;

/* One finding; strings live as long as the tr_fra_t. */
typedef struct {
  tr_fra_kind_t kind;
  const char* kind_name; /* "NOT_JOINED", "SIZE_OR_SYNTAX_MISMATCH", ... */
  const char* pg_name;   /* process group name ("0"), desc ("default_pg") */
  const char* pg_desc;
  const int* pg_ranks; /* the group's global ranks, sorted */
  size_t pg_size;
  int64_t seq;                /* collective_seq_id (p2p: the sender's or
                              receiver's p2p_seq_id); -1 when none */
  int64_t record_id;          /* of the reference entry; -1 when none */
  const char* op;             /* "all_reduce", "send", ... ("" when none) */
  const char* profiling_name; /* "nccl:all_reduce" */
  const int* culprits;        /* the ranks blamed, sorted */
  size_t n_culprits;
  const int* missing; /* members without the op (NOT_JOINED) */
  size_t n_missing;
  const char* detail; /* one line: what differs, e.g. "rank 2 input
                              sizes [[8]] where the others have [[4]]" */
  int64_t since_ns;   /* when the others entered it (0: unknown) */
} tr_fra_finding_t;

/* Load every dump in dir (recursively, as torchfrtrace's os.walk). Fails
 * with TR_EFORMAT/TR_EPARSE and a message naming the file and byte offset
 * for a dump it cannot read (unless opts->allow_incomplete_ranks: then the
 * file is skipped with a warning on stderr), TR_ENOENT when dir holds no
 * dump, TR_EINVAL when the prefix cannot be inferred. *out is owned by the
 * caller (tr_fra_free). opts is copied (its arrays are referenced: keep them
 * alive while *out lives). */
int tr_fra_load_dir(tr_fra_t** out, const char* dir, const tr_fra_opts_t* opts,
                    tr_errmsg_t* err);

/* Group, align and match; fills the findings and the verdict. Returns the
 * number of findings (>= 0), or TR_ENOTFOUND with a message in err when a
 * member rank's dump is missing and allow_incomplete_ranks is off
 * (torchfrtrace's "Missing dump files"; the verdict still names the ranks),
 * or TR_ENOMEM (then no findings and an empty verdict). Never aborts: the
 * daemon runs it after an automatic dump.
 */
int tr_fra_analyze(tr_fra_t* a, tr_errmsg_t* err);

/* The findings, in the order they are reported (by group, then sequence). */
size_t tr_fra_n_findings(const tr_fra_t* a);
const tr_fra_finding_t* tr_fra_finding(const tr_fra_t* a, size_t i);

/* The index of the finding the verdict is about (the earliest in time);
 * -1 when none. */
int tr_fra_primary(const tr_fra_t* a);

/* The verdict paragraph (no trailing newline); owned by a. */
const char* tr_fra_verdict(const tr_fra_t* a);

/* Print the findings as torchfrtrace reports them, then a summary and the
 * verdict. 0, or TR_ENOMEM (nothing printed). */
int tr_fra_print_report(const tr_fra_t* a, FILE* out);

/* torchfrtrace -j: one column per rank (opts->selected_ranks), one row per
 * entry, entries of other groups blank (opts->pg_filters), after aligning
 * the rings by record_id as torchfrtrace does. Works before or without
 * tr_fra_analyze(). 0, or TR_ENOMEM (the table may be cut short). */
int tr_fra_print_entries(const tr_fra_t* a, FILE* out);

/* Everything as one JSON object (new reference): version, ranks, dumps,
 * missing_dumps, groups, findings, primary, verdict. NULL when out of
 * memory. */
json_t* tr_fra_to_json(const tr_fra_t* a);

/* tr_fra_to_json(), indented, and a newline. 0, or TR_ENOMEM (nothing
 * printed). */
int tr_fra_print_json(const tr_fra_t* a, FILE* out);

/* Ranks with a dump, sorted (owned by a); *n gets their count. */
const int* tr_fra_ranks(const tr_fra_t* a, size_t* n);

/* Number of entries loaded over all ranks. */
size_t tr_fra_n_entries(const tr_fra_t* a);

void tr_fra_free(tr_fra_t* a);

/* Decode a pickle (protocols 2-5, the opcodes Python's pickle and
 * PyTorch's c10 pickler write for plain data: dicts, lists, tuples,
 * strings, ints, floats, bools, None, memo) into JSON values: tuples become
 * arrays, int dict keys become decimal strings. GLOBAL/REDUCE are refused
 * except torch.jit._pickle's build_intlist/build_doublelist/build_boollist,
 * which only wrap a list. Errors: TR_EFORMAT with "NAME: ... at byte offset
 * N" in err (name is the file name used in the message). *out is a new
 * reference. Safe on any input (bounded memory, no recursion on input). */
int tr_fra_unpickle(const void* buf, size_t len, const char* name, json_t** out,
                    tr_errmsg_t* err);

#ifdef __cplusplus
}
#endif
#endif /* TRAINRUN_FR_ANALYZE_H */
