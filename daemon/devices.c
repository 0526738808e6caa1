/* daemon/devices.c: the GPUs of this node without initialising CUDA (the
 * NVIDIA driver's /proc/driver/nvidia/gpus lists them by PCI bus id), and
 * the CPUs near each, for worker affinity: hwloc's topology when configure
 * found hwloc, else the kernel's /sys/bus/pci/devices/ID/local_cpulist. */
#include "core/buf.h" /* TR_GROW */
#include "config.h"

#include <ctype.h>
#include <dirent.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef HAVE_HWLOC
#include <hwloc.h>
#include <hwloc/glibc-sched.h>
#endif

#include "daemon/internal.h"
#include "trainrun/error.h"
#include "trainrun/log.h"
#include "trainrun/param.h"

#define NVIDIA_GPUS "/proc/driver/nvidia/gpus"

static int cmp_str(const void* a, const void* b) {
  return strcmp(*(char* const*)a, *(char* const*)b);
}

void tr__gpu_ids_free(char** ids, int n) {
  if (!ids) return;
  for (int i = 0; i < n; i++) free(ids[i]);
  free(ids);
}

int tr__gpu_pci_ids(char*** ids, int* n) {
  *ids = NULL;
  *n = 0;
  DIR* dir = opendir(NVIDIA_GPUS);
  if (!dir) return 0; /* no driver: no GPU */
  char** v = NULL;
  size_t cap = 0;
  int k = 0, rc = 0;
  struct dirent* e;
  while ((e = readdir(dir))) {
    if (e->d_name[0] == '.') continue;
    if (TR_GROW(v, (size_t)k + 1, cap) < 0) {
      rc = TR_ENOMEM;
      break;
    }
    if (!(v[k] = strdup(e->d_name))) {
      rc = TR_ENOMEM;
      break;
    }
    /* the driver names them in lower case; bus ids compare as text */
    for (char* c = v[k]; *c; c++) *c = (char)tolower((unsigned char)*c);
    k++;
  }
  closedir(dir);
  if (rc < 0) {
    tr__gpu_ids_free(v, k);
    return rc;
  }
  if (k > 1) qsort(v, (size_t)k, sizeof *v, cmp_str);
  *ids = v;
  *n = k;
  return 0;
}

/* Entries of CUDA_VISIBLE_DEVICES as CUDA reads them: up to the first
 * invalid one ("-1" hides every device). */
static int visible_count(const char* s) {
  int n = 0;
  while (*s) {
    size_t len = strcspn(s, ",");
    if (len == 0 || s[0] == '-') break;
    n++;
    s += len;
    if (*s == ',') s++;
  }
  return n;
}

int tr_daemon_gpu_count(void) {
  if (tr_param_is_set(TR_PARAM_CUDA_VISIBLE_DEVICES))
    return visible_count(tr_param_str(TR_PARAM_CUDA_VISIBLE_DEVICES));
  char** ids;
  int n;
  if (tr__gpu_pci_ids(&ids, &n) < 0) return 0;
  tr__gpu_ids_free(ids, n);
  return n;
}

int tr__cpulist_parse(const char* s, cpu_set_t* set) {
  CPU_ZERO(set);
  const char* p = s;
  int any = 0;
  while (*p && *p != '\n') {
    char* end;
    long a = strtol(p, &end, 10), b = a;
    if (end == p || a < 0) return TR_EINVAL;
    p = end;
    if (*p == '-') {
      b = strtol(p + 1, &end, 10);
      if (end == p + 1 || b < a) return TR_EINVAL;
      p = end;
    }
    for (long c = a; c <= b && c < CPU_SETSIZE; c++) CPU_SET((int)c, set);
    any = 1;
    if (*p == ',')
      p++;
    else if (*p && *p != '\n')
      return TR_EINVAL;
  }
  return any ? 0 : TR_EINVAL;
}

/* The physical GPU (index into the sorted PCI ids) behind CUDA ordinal i:
 * CUDA_VISIBLE_DEVICES' i-th entry when it is a number; -1 when it names a
 * device by UUID or MIG instance. */
static int physical_index(int ordinal) {
  if (!tr_param_is_set(TR_PARAM_CUDA_VISIBLE_DEVICES)) return ordinal;
  const char* s = tr_param_str(TR_PARAM_CUDA_VISIBLE_DEVICES);
  for (int i = 0; *s; i++) {
    size_t len = strcspn(s, ",");
    if (i == ordinal) {
      char* end;
      long v = strtol(s, &end, 10);
      if (end != s + len || end == s || v < 0) return -1;
      return (int)v;
    }
    s += len;
    if (*s == ',') s++;
  }
  return -1;
}

#ifdef HAVE_HWLOC
/* One topology for every GPU of a spawn (loading it reads sysfs). */
typedef struct {
  hwloc_topology_t topo;
  int loaded;
} topo_t;

static int topo_load(topo_t* t) {
  if (hwloc_topology_init(&t->topo) < 0) return 0;
  hwloc_topology_set_type_filter(t->topo, HWLOC_OBJ_PCI_DEVICE,
                                 HWLOC_TYPE_FILTER_KEEP_ALL);
  hwloc_topology_set_type_filter(t->topo, HWLOC_OBJ_BRIDGE,
                                 HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (hwloc_topology_load(t->topo) < 0) {
    hwloc_topology_destroy(t->topo);
    return 0;
  }
  return t->loaded = 1;
}

static void topo_release(topo_t* t) {
  if (t->loaded) hwloc_topology_destroy(t->topo);
}

static int near_cpus(topo_t* t, const char* busid, cpu_set_t* set) {
  unsigned dom, bus, dev, fn;
  if (!t->loaded || sscanf(busid, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) != 4)
    return 0;
  hwloc_obj_t pci = hwloc_get_pcidev_by_busid(t->topo, dom, bus, dev, fn);
  hwloc_obj_t anc = pci ? hwloc_get_non_io_ancestor_obj(t->topo, pci) : NULL;
  if (!anc || !anc->cpuset ||
      hwloc_cpuset_to_glibc_sched_affinity(t->topo, anc->cpuset, set,
                                           sizeof *set) != 0)
    return 0;
  return CPU_COUNT(set) > 0;
}
#else
typedef struct {
  int loaded;
} topo_t;

static int topo_load(topo_t* t) { return t->loaded = 1; }
static void topo_release(topo_t* t) { (void)t; }

static int near_cpus(topo_t* t, const char* busid, cpu_set_t* set) {
  (void)t;
  char path[256], line[4096];
  snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/local_cpulist", busid);
  FILE* f = fopen(path, "r");
  if (!f) return 0;
  int ok = fgets(line, sizeof line, f) != NULL;
  fclose(f);
  return ok && tr__cpulist_parse(line, set) == 0 && CPU_COUNT(set) > 0;
}
#endif

int tr__gpu_cpusets(const int* ordinals, int n, cpu_set_t* sets, int* found) {
  for (int i = 0; i < n; i++) found[i] = 0;
  char** ids;
  int nids;
  TR_CHECK(tr__gpu_pci_ids(&ids, &nids));
  if (nids == 0) return 0;
  cpu_set_t mine;
  if (sched_getaffinity(0, sizeof mine, &mine) != 0) {
    tr__gpu_ids_free(ids, nids);
    return 0;
  }
  topo_t topo = {0};
  topo_load(&topo);
  for (int i = 0; i < n; i++) {
    int phys = physical_index(ordinals[i]);
    cpu_set_t near;
    if (phys < 0 || phys >= nids || !near_cpus(&topo, ids[phys], &near)) {
      TR_LOG_DEBUG(DAEMON, "no CPU locality known for CUDA device %d",
                   ordinals[i]);
      continue;
    }
    CPU_AND(&sets[i], &near, &mine); /* stay inside what we were given */
    found[i] = CPU_COUNT(&sets[i]) > 0;
  }
  topo_release(&topo);
  tr__gpu_ids_free(ids, nids);
  return 0;
}
