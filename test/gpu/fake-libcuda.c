// A stand-in for libcuda.so.1 that runs the cuda backend's logic on a machine with no GPU.
// It is strict where the real driver is lenient, so that the tests catch what would only show
// on hardware as a wrong byte or a crash:
// - copies are queued and run only when something waits for them (an event or stream sync),
//   so a staging buffer reused before its copy finished shows up as corrupt data;
// - every call that needs a context fails without one current on the calling thread, and
//   device pointers must belong to the current context's device;
// - async copies must read pinned memory (cuMemHostAlloc or a registered range);
// - freeing or unregistering memory that a queued copy still reads aborts the process;
// - "device memory" is a shared-memory file, so another process can open an IPC handle;
// - virtual memory (cuMemCreate and friends) is a memfd per allocation, mapped at reserved
//   address ranges that stay inaccessible until cuMemSetAccess; it is exported as a dup of that
//   memfd, so a descriptor passed to another process (or adopted in this one) maps the same bytes.
//   Address ranges must be reserved before mapping, unmapped before freeing, and sizes are whole
//   2 MiB granules, as the real driver demands.
// At exit, with FAKE_CUDA_REPORT set, it prints what is still allocated (a leak check), including
// VMM allocations, reservations, mappings and descriptors of fake VMM memory still open.
// Build: cc -shared -fPIC -O2 -o DIR/libcuda.so.1 fake-libcuda.c -lpthread
// Environment: FAKE_CUDA_DEVICES (default 2), FAKE_CUDA_MEM_MB per device (default 1024),
// FAKE_CUDA_FAULT_DEVICE: waiting on an event of that device's copies runs them, then reports
// CUDA_ERROR_ILLEGAL_ADDRESS, as an asynchronous fault of a copy would.
// FAKE_CUDA_FAIL_MEMSET: every cuMemsetD*Async returns CUDA_ERROR_INVALID_VALUE.
// FAKE_CUDA_VMM_FAIL=NAME:N: the Nth call (from 1) of VMM entry point NAME (cuMemCreate,
// cuMemAddressReserve, cuMemMap, cuMemSetAccess, cuMemExportToShareableHandle,
// cuMemImportFromShareableHandle) returns CUDA_ERROR_OUT_OF_MEMORY, so tests fail one midway.
// FAKE_CUDA_NO_VMM, FAKE_CUDA_NO_FD_HANDLES: the device attributes say VMM, or POSIX descriptor
// export, is unsupported. FAKE_CUDA_NO_READ_ONLY: cuMemSetAccess refuses read-only access.
// FAKE_CUDA_KERNELS: cuModuleLoadData loads any image as the GPU digest kernels
// (native/gpu/xxh3_pieces.cu), which the fake then runs on the CPU with the xxHash library as soon
// as it is launched, after the work its stream waits for (cuStreamWaitEvent) and nothing else: a
// kernel that does not wait for its window's copies hashes 0xEE bytes. In the copying kernel
// (WEIGHTD_COPY_KERNEL) a job with a destination copies its bytes there first, as the real
// one does while it hashes them. A job outside device memory of the stream's device aborts.
// FAKE_CUDA_KERNELS=hash-only: the image has no copying kernel (one built before it existed);
// FAKE_CUDA_KERNELS=other-layout: it has neither (one built for another job layout).
// Without it, cuModuleLoadData fails (CUDA_ERROR_NO_BINARY_FOR_GPU), as for a kernel built for
// another GPU.
// FAKE_CUDA_ACCESS_LOG=PATH: each cuMemSetAccess that succeeds appends "PID INODE FLAGS".
// FAKE_CUDA_COPY_LOG=PATH: each queued host-to-device copy appends its bytes (rows times row
// bytes) to PATH as a decimal line, so a test sees how a fill cut its work into copies.
// FAKE_CUDA_INIT_GATE, FAKE_CUDA_DTOH_GATE, FAKE_CUDA_RETAIN_GATE, FAKE_CUDA_IPC_CLOSE_GATE: a
// FIFO that cuInit (or each cuMemcpyDtoH, cuDevicePrimaryCtxRetain or cuIpcCloseMemHandle) waits
// on until one byte is written to it, so a test holds a call in flight for as long as it likes.
// FAKE_CUDA_RETAIN_LOG=PATH: each cuDevicePrimaryCtxRetain that succeeds appends its device, so a
// test sees when a context was made (none before a restart's READY, say).
// FAKE_CUDA_QUERY_LOG=PATH: each cuDeviceGetUuid_v2 appends its device.
// FAKE_CUDA_MODULE_LOG=PATH: each cuModuleLoadData that succeeds appends "DEVICE GENERATION" (the
// how-manyth time that device's primary context was made), so a test sees which context loaded
// the digest kernels, and how often.
// Device memory starts as 0xEE bytes, never zeros, and memsets are queued like copies, so bytes
// that must be zero are zero only if a memset ran for them.
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <dirent.h>
#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
enum {
  OK = 0, E_INVALID_VALUE = 1, E_OOM = 2, E_NOT_INIT = 3, E_NO_DEVICE = 100, E_INVALID_DEVICE = 101,
  E_INVALID_CONTEXT = 201, E_ALREADY_REGISTERED = 712, E_NOT_REGISTERED = 713, E_NOT_READY = 600,
  E_ILLEGAL_ADDRESS = 700, E_NO_BINARY_FOR_GPU = 209, E_NOT_FOUND = 500, E_INVALID_HANDLE = 400,
};
#define MAX_DEV 8
#define MAX_OPS 4096

// generation: how many times the device's primary context was made, so each context has an id of
// its own (cuCtxGetId); modules: those loaded in it, which its end unloads, as the driver's does.
struct ctx { int device; int refs; unsigned generation; int modules; };
static struct ctx contexts[MAX_DEV];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static __thread struct ctx* ctxStack[16];
static __thread int ctxDepth;
static int initialised;

// device: for host memory, the device of the context it was pinned in; portable: pinned for
// every context (CU_MEMHOSTALLOC_PORTABLE / CU_MEMHOSTREGISTER_PORTABLE, both 0x01).
// vmm: for a mapping of virtual memory, its allocation's index + 1 (0 for everything else).
struct alloc { char* base; size_t bytes; int device; int kind; char name[64]; int live; int imported; int portable; int vmm; };
// K_MAPPED: VMM memory mapped but not yet made accessible (cuMemSetAccess makes it K_DEVICE).
enum { K_DEVICE = 1, K_PINNED = 2, K_REGISTERED = 3, K_MAPPED = 4 };
static struct alloc allocs[4096];
static int nallocs;
static size_t usedBytes[MAX_DEV];

// A copy, or a memset when src is NULL: `elt` bytes of `value`, repeated over width bytes; or
// (kind) a wait for another stream's work up to waitSeq, or the digest kernel over `count` jobs.
enum { OP_COPY = 0, OP_WAIT = 1, OP_KERNEL = 2 };
struct stream;
struct op {
  char* dst; const char* src; size_t width, height, spitch, dpitch; unsigned long seq; int done; unsigned value; int elt;
  int kind; struct stream* waitStream; unsigned long waitSeq; const char* jobs; unsigned count;
  int copying;  // OP_KERNEL: the copying kernel's launch (a job's dst is written)
};
struct stream { struct op ops[MAX_OPS]; int nops; unsigned long seq; int live; int device; };
struct event { struct stream* stream; unsigned long seq; int live; };
static int liveStreams, liveEvents, liveModules;
// native/gpu_digest_job.h's GpuDigestJob and GpuDigestRanges.
struct digestJob { unsigned long long src, bytes, slot, dst; };
struct digestRanges { unsigned first[32], count[32], n; };

static int devices(void) { const char* e = getenv("FAKE_CUDA_DEVICES"); return e ? atoi(e) : 2; }
static size_t memPerDevice(void) { const char* e = getenv("FAKE_CUDA_MEM_MB"); return (size_t)(e ? atoll(e) : 1024) << 20; }
static struct ctx* current(void) { return ctxDepth ? ctxStack[ctxDepth - 1] : NULL; }

static struct alloc* findAlloc(const void* p, size_t n, int kind) {
  for (int i = 0; i < nallocs; ++i) {
    struct alloc* a = &allocs[i];
    if (a->live && (kind == 0 || a->kind == kind) && (const char*)p >= a->base && (const char*)p + n <= a->base + a->bytes) return a;
  }
  return NULL;
}

static void die(const char* what) { fprintf(stderr, "fake-libcuda: %s\n", what); abort(); }

// A synchronous copy from pageable host memory returns once the driver has staged its bytes,
// before its DMA lands (the CUDA documentation's "synchronous" copies): here the bytes land when
// the legacy default stream is next waited for (cuStreamSynchronize of it, cuCtxSynchronize, a
// synchronous device-to-host copy, a free), so code that reads them on a non-blocking stream
// without that wait reads the old bytes, as it may on a GPU.
#define MAX_LEGACY_COPIES 64
static struct { char* dst; char* bytes; size_t n; } legacyCopies[MAX_LEGACY_COPIES];
static int nLegacyCopies;
static void landLegacyCopies(void) {  // under lock
  for (int i = 0; i < nLegacyCopies; ++i) {
    memcpy(legacyCopies[i].dst, legacyCopies[i].bytes, legacyCopies[i].n);  // a read-only mapping faults here, as a write through it does on a GPU
    free(legacyCopies[i].bytes);
  }
  nLegacyCopies = 0;
}

// Aborts if a queued (not yet run) copy reads or writes [p, p + n).
static struct stream* streams[256];
static int nstreams;
static void checkNotQueued(const char* p, size_t n, const char* what) {
  for (int s = 0; s < nstreams; ++s) {
    struct stream* st = streams[s];
    if (!st->live) continue;
    for (int i = 0; i < st->nops; ++i) {
      struct op* o = &st->ops[i];
      if (o->done) continue;
      size_t srcSpan = (o->height - 1) * o->spitch + o->width, dstSpan = (o->height - 1) * o->dpitch + o->width;
      if ((o->src && o->src < p + n && o->src + srcSpan > p) || (o->dst < p + n && o->dst + dstSpan > p)) die(what);
    }
  }
}

static void runDigestKernel(struct stream* st, const struct op* o) {
  for (unsigned j = 0; j < o->count; ++j) {
    const struct digestJob* job = (const struct digestJob*)o->jobs + j;
    struct alloc* a = findAlloc((const void*)(uintptr_t)job->src, job->bytes, K_DEVICE);
    if (!a || a->device != st->device) die("digest kernel job outside the stream's device memory");
    if (!findAlloc(o->dst + 16 * job->slot, 16, K_DEVICE)) die("digest kernel output outside device memory");
    // A copying job (a pull's) in the copying kernel: it writes the bytes it hashes there, from
    // 8-byte aligned addresses (the real kernel's word loads and stores fault otherwise). The
    // hashing kernel does not read dst.
    if (o->copying && job->dst) {
      struct alloc* d = findAlloc((const void*)(uintptr_t)job->dst, job->bytes, K_DEVICE);
      if (!d || d->device != st->device) die("digest kernel copy outside the stream's device memory");
      if (job->src % 8 || job->dst % 8) die("digest kernel copy from or to an address not 8-byte aligned");
      memmove((void*)(uintptr_t)job->dst, (const void*)(uintptr_t)job->src, job->bytes);
    }
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits((const void*)(uintptr_t)job->src, job->bytes));
    memcpy(o->dst + 16 * job->slot, c.digest, 16);
  }
}

static void runUpTo(struct stream* st, unsigned long seq) {
  for (int i = 0; i < st->nops; ++i) {
    struct op* o = &st->ops[i];
    if (o->done || o->seq > seq) continue;
    if (o->kind == OP_WAIT) {
      runUpTo(o->waitStream, o->waitSeq);
    } else if (o->kind == OP_KERNEL) {
      runDigestKernel(st, o);
    } else if (o->src) {
      for (size_t r = 0; r < o->height; ++r) memcpy(o->dst + r * o->dpitch, o->src + r * o->spitch, o->width);
    } else {
      for (size_t i = 0; i < o->width; i += (size_t)o->elt) memcpy(o->dst + i, &o->value, (size_t)o->elt);
    }
    o->done = 1;
  }
  int k = 0;
  for (int i = 0; i < st->nops; ++i) if (!st->ops[i].done) st->ops[k++] = st->ops[i];
  st->nops = k;
}

#define NEED_CTX() do { if (!initialised) return E_NOT_INIT; if (!current()) return E_INVALID_CONTEXT; } while (0)

// Blocks until a byte is written to the FIFO the variable names (nothing when it is unset).
static void waitAtGate(const char* variable) {
  const char* path = getenv(variable);
  if (!path) return;
  int fd = open(path, O_RDONLY);
  char byte;
  if (fd < 0 || read(fd, &byte, 1) != 1) abort();
  close(fd);
}

CUresult cuInit(unsigned flags) {
  (void)flags;
  waitAtGate("FAKE_CUDA_INIT_GATE");
  if (devices() == 0) return E_NO_DEVICE;
  initialised = 1;
  return OK;
}
CUresult cuDriverGetVersion(int* v) { *v = 13000; return OK; }
CUresult cuGetErrorName(CUresult r, const char** s) {
  switch (r) {
    case OK: *s = "CUDA_SUCCESS"; break;
    case E_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; break;
    case E_OOM: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case E_INVALID_CONTEXT: *s = "CUDA_ERROR_INVALID_CONTEXT"; break;
    case E_ALREADY_REGISTERED: *s = "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"; break;
    case E_ILLEGAL_ADDRESS: *s = "CUDA_ERROR_ILLEGAL_ADDRESS"; break;
    case E_INVALID_HANDLE: *s = "CUDA_ERROR_INVALID_HANDLE"; break;
    default: *s = "CUDA_ERROR_UNKNOWN"; return E_INVALID_VALUE;
  }
  return OK;
}
CUresult cuGetErrorString(CUresult r, const char** s) {
  const char* name;
  cuGetErrorName(r, &name);
  *s = r == E_OOM ? "out of memory" : r == E_INVALID_CONTEXT ? "invalid device context" : "fake error";
  return OK;
}
CUresult cuDeviceGetCount(int* n) { if (!initialised) return E_NOT_INIT; *n = devices(); return OK; }
CUresult cuDeviceGet(CUdevice* d, int i) { if (i < 0 || i >= devices()) return E_INVALID_DEVICE; *d = i; return OK; }
CUresult cuDeviceGetName(char* name, int len, CUdevice d) { snprintf(name, len, "Fake GPU %d", d); return OK; }
static void appendToLog(const char* var, const char* line);
// FAKE_CUDA_QUERY_LOG: each UUID asked appends its device, so a test sees how often the devices
// were described.
CUresult cuDeviceGetUuid_v2(unsigned char* uuid, CUdevice d) {
  for (int i = 0; i < 16; ++i) uuid[i] = (unsigned char)(0x10 * d + i);
  char line[32];
  snprintf(line, sizeof line, "%d\n", d);
  appendToLog("FAKE_CUDA_QUERY_LOG", line);
  return OK;
}
CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice d) { (void)d; *bytes = memPerDevice(); return OK; }

// Appends `line` to the file the environment variable `var` names, if it names one.
static void appendToLog(const char* var, const char* line) {
  const char* path = getenv(var);
  if (!path) return;
  int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) die("cannot open a FAKE_CUDA_*_LOG file");
  size_t n = strlen(line);
  if (write(fd, line, n) != (ssize_t)n) die("cannot write a FAKE_CUDA_*_LOG file");
  close(fd);
}

// FAKE_CUDA_RETAIN_LOG: called once a retain is done, so a line is a context that exists.
static void logRetain(CUdevice d) {
  char line[32];
  snprintf(line, sizeof line, "%d\n", d);
  appendToLog("FAKE_CUDA_RETAIN_LOG", line);
}

// FAKE_CUDA_MADE_LOG=PATH: each retain that makes its device's primary context (none held it:
// the real driver creates the context then, ~100 ms, and destroys it on the last release) appends
// "pid device", so a test sees a context made again and again where a holder went missing.
static void logMade(CUdevice d) {
  char line[48];
  snprintf(line, sizeof line, "%d %d\n", (int)getpid(), d);
  appendToLog("FAKE_CUDA_MADE_LOG", line);
}

CUresult cuDevicePrimaryCtxRetain(struct ctx** c, CUdevice d) {
  if (!initialised) return E_NOT_INIT;
  if (d < 0 || d >= devices()) return E_INVALID_DEVICE;
  waitAtGate("FAKE_CUDA_RETAIN_GATE");
  pthread_mutex_lock(&lock);
  if (contexts[d].refs == 0) {
    logMade(d);
    contexts[d].generation++;
  }
  contexts[d].device = d;
  contexts[d].refs++;
  *c = &contexts[d];
  logRetain(d);
  pthread_mutex_unlock(&lock);
  return OK;
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
  pthread_mutex_lock(&lock);
  if (contexts[d].refs <= 0) die("primary context released more often than retained");
  // The last release ends the context and every module loaded in it.
  if (--contexts[d].refs == 0) {
    liveModules -= contexts[d].modules;
    contexts[d].modules = 0;
  }
  pthread_mutex_unlock(&lock);
  return OK;
}
CUresult cuCtxPushCurrent_v2(struct ctx* c) {
  if (!c || c->refs <= 0) return E_INVALID_CONTEXT;
  if (ctxDepth == 16) die("context stack overflow (a push without a pop)");
  ctxStack[ctxDepth++] = c;
  return OK;
}
CUresult cuCtxPopCurrent_v2(struct ctx** c) {
  if (!ctxDepth) return E_INVALID_CONTEXT;
  struct ctx* top = ctxStack[--ctxDepth];
  if (c) *c = top;
  return OK;
}
CUresult cuCtxGetCurrent(struct ctx** c) {
  if (!initialised) return E_NOT_INIT;
  *c = ctxDepth ? ctxStack[ctxDepth - 1] : NULL;
  return OK;
}
// Unique for the process's life: a context made again gets another.
CUresult cuCtxGetId(struct ctx* c, unsigned long long* id) {
  if (!c || c->refs <= 0) return E_INVALID_CONTEXT;
  *id = ((unsigned long long)c->generation << 8) | (unsigned)c->device;
  return OK;
}

CUresult cuMemGetInfo_v2(size_t* freeBytes, size_t* total) {
  NEED_CTX();
  *total = memPerDevice();
  *freeBytes = *total - usedBytes[current()->device];
  return OK;
}

// A per-process nonce in device allocations' shared-memory names: a process killed before it freed
// leaves its names in /dev/shm, and a later process given the same pid (pids wrap at pid_max)
// must not collide with them (O_EXCL: the suite failed so once, 94 such names on the VM).
static unsigned nameNonce(void) {
  static unsigned nonce;
  if (nonce == 0) {
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, &nonce, sizeof nonce) != (ssize_t)sizeof nonce) die("/dev/urandom");
    close(fd);
    if (nonce == 0) nonce = 1;
  }
  return nonce;
}

static struct alloc* newAlloc(void) {
  if (nallocs == 4096) die("too many allocations");
  struct alloc* a = &allocs[nallocs++];
  memset(a, 0, sizeof *a);
  a->live = 1;
  return a;
}

CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t bytes) {
  NEED_CTX();
  pthread_mutex_lock(&lock);
  int d = current()->device;
  if (bytes == 0 || usedBytes[d] + bytes > memPerDevice()) { pthread_mutex_unlock(&lock); return E_OOM; }
  struct alloc* a = newAlloc();
  snprintf(a->name, sizeof a->name, "/fakecuda-%d-%08x-%d", (int)getpid(), nameNonce(), nallocs);
  int fd = shm_open(a->name, O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0) die("shm_open");
  a->base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (a->base == MAP_FAILED) die("mmap");
  memset(a->base, 0xEE, bytes);  // never zero: a missed copy must not look like a right one
  a->bytes = bytes;
  a->device = d;
  a->kind = K_DEVICE;
  usedBytes[d] += bytes;
  *p = (CUdeviceptr)(uintptr_t)a->base;
  pthread_mutex_unlock(&lock);
  return OK;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
  NEED_CTX();
  pthread_mutex_lock(&lock);
  landLegacyCopies();
  struct alloc* a = findAlloc((void*)(uintptr_t)p, 1, K_DEVICE);
  if (!a || a->base != (char*)(uintptr_t)p || a->imported || a->vmm) { pthread_mutex_unlock(&lock); return E_INVALID_VALUE; }
  checkNotQueued(a->base, a->bytes, "device memory freed while a queued copy writes it");
  munmap(a->base, a->bytes);
  shm_unlink(a->name);
  usedBytes[a->device] -= a->bytes;
  a->live = 0;
  pthread_mutex_unlock(&lock);
  return OK;
}
CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size, CUdeviceptr p) {
  NEED_CTX();
  struct alloc* a = findAlloc((void*)(uintptr_t)p, 1, K_DEVICE);
  if (!a) return E_INVALID_VALUE;
  *base = (CUdeviceptr)(uintptr_t)a->base;
  *size = a->bytes;
  return OK;
}
CUresult cuMemHostAlloc(void** p, size_t bytes, unsigned flags) {
  (void)flags;
  NEED_CTX();
  pthread_mutex_lock(&lock);
  struct alloc* a = newAlloc();
  a->base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  a->bytes = bytes;
  a->kind = K_PINNED;
  a->device = current()->device;
  a->portable = flags & 0x01;
  *p = a->base;
  pthread_mutex_unlock(&lock);
  return OK;
}
CUresult cuMemFreeHost(void* p) {
  NEED_CTX();
  pthread_mutex_lock(&lock);
  struct alloc* a = findAlloc(p, 1, K_PINNED);
  if (!a || a->base != p) { pthread_mutex_unlock(&lock); return E_INVALID_VALUE; }
  checkNotQueued(a->base, a->bytes, "pinned buffer freed while a queued copy reads it");
  munmap(a->base, a->bytes);
  a->live = 0;
  pthread_mutex_unlock(&lock);
  return OK;
}
CUresult cuMemHostRegister_v2(void* p, size_t bytes, unsigned flags) {
  NEED_CTX();
  if (!(flags & 0x08)) return E_INVALID_VALUE;  // a PROT_READ mapping needs CU_MEMHOSTREGISTER_READ_ONLY
  pthread_mutex_lock(&lock);
  for (int i = 0; i < nallocs; ++i) {
    struct alloc* a = &allocs[i];
    if (a->live && a->kind == K_REGISTERED && a->base < (char*)p + bytes && a->base + a->bytes > (char*)p) {
      pthread_mutex_unlock(&lock);
      return E_ALREADY_REGISTERED;
    }
  }
  struct alloc* a = newAlloc();
  a->base = p;
  a->bytes = bytes;
  a->kind = K_REGISTERED;
  a->device = current()->device;
  a->portable = flags & 0x01;
  // Pinning faults every page in; a window past the end of its file would SIGBUS here.
  volatile char sum = 0;
  for (size_t i = 0; i < bytes; i += 4096) sum += ((volatile char*)p)[i];
  pthread_mutex_unlock(&lock);
  return OK;
}
CUresult cuMemHostUnregister(void* p) {
  NEED_CTX();
  pthread_mutex_lock(&lock);
  struct alloc* a = findAlloc(p, 1, K_REGISTERED);
  if (!a || a->base != p) { pthread_mutex_unlock(&lock); return E_NOT_REGISTERED; }
  checkNotQueued(a->base, a->bytes, "host range unregistered while a queued copy reads it");
  a->live = 0;
  pthread_mutex_unlock(&lock);
  return OK;
}

CUresult cuStreamCreate(struct stream** s, unsigned flags) {
  (void)flags;
  NEED_CTX();
  pthread_mutex_lock(&lock);
  struct stream* st = calloc(1, sizeof *st);
  st->live = 1;
  st->device = current()->device;
  int slot = 0;
  while (slot < nstreams && streams[slot]->live) slot++;  // reuse a destroyed stream's place
  if (slot == 256) die("more than 256 live streams");
  if (slot < nstreams) free(streams[slot]);
  else nstreams++;
  streams[slot] = st;
  liveStreams++;
  *s = st;
  pthread_mutex_unlock(&lock);
  return OK;
}
CUresult cuStreamSynchronize(struct stream* s) {
  NEED_CTX();
  // The legacy default stream (0, CU_STREAM_LEGACY): its synchronous copies land.
  if ((uintptr_t)s <= 1) {
    pthread_mutex_lock(&lock);
    landLegacyCopies();
    pthread_mutex_unlock(&lock);
    return OK;
  }
  pthread_mutex_lock(&lock);
  runUpTo(s, s->seq);
  pthread_mutex_unlock(&lock);
  return OK;
}
// Every queued operation of the current context's device is done (the engine's "between steps").
CUresult cuCtxSynchronize(void) {
  NEED_CTX();
  pthread_mutex_lock(&lock);
  landLegacyCopies();
  for (int i = 0; i < nstreams; ++i) {
    struct stream* st = streams[i];
    if (st->live && st->device == current()->device) runUpTo(st, st->seq);
  }
  pthread_mutex_unlock(&lock);
  return OK;
}
CUresult cuStreamDestroy_v2(struct stream* s) {
  NEED_CTX();
  pthread_mutex_lock(&lock);
  runUpTo(s, s->seq);  // the real driver finishes queued work before releasing the stream
  s->live = 0;
  liveStreams--;
  pthread_mutex_unlock(&lock);
  return OK;
}
CUresult cuEventCreate(struct event** e, unsigned flags) {
  (void)flags;
  NEED_CTX();
  pthread_mutex_lock(&lock);
  *e = calloc(1, sizeof **e);
  (*e)->live = 1;
  liveEvents++;
  pthread_mutex_unlock(&lock);
  return OK;
}
CUresult cuEventRecord(struct event* e, struct stream* s) {
  NEED_CTX();
  pthread_mutex_lock(&lock);
  e->stream = s;
  e->seq = s->seq;
  pthread_mutex_unlock(&lock);
  return OK;
}
// Kernels: only the GPU digest kernels, with FAKE_CUDA_KERNELS (see the top of this file); with
// FAKE_CUDA_KERNELS=hash-only the image has no copying kernel, as one built before it existed.
// native/gpu_digest_job.h's WEIGHTD_HASH_KERNEL and WEIGHTD_COPY_KERNEL.
static const char kDigestKernel[] = "weightd_xxh3_pieces_j32";
static const char kCopyingKernel[] = "weightd_xxh3_copy_pieces_j32";
// A module belongs to the context current at its load, and ends with it (or its unload); its
// functions name it, so a kernel launched after its context ended (or in another context) is
// refused, as the driver refuses a handle it no longer knows. Never freed: a stale handle stays
// recognisable.
struct function { const char* name; struct module* module; };
struct module { struct ctx* ctx; unsigned generation; int unloaded; struct function hash, copy; };
static int moduleAlive(const struct module* m) { return m && !m->unloaded && m->ctx->refs > 0 && m->ctx->generation == m->generation; }
CUresult cuModuleLoadData(struct module** module, const void* image) {
  NEED_CTX();
  if (!image) return E_INVALID_VALUE;
  if (!getenv("FAKE_CUDA_KERNELS")) return E_NO_BINARY_FOR_GPU;
  pthread_mutex_lock(&lock);
  struct module* m = calloc(1, sizeof *m);
  m->ctx = current();
  m->generation = m->ctx->generation;
  m->hash = (struct function){kDigestKernel, m};
  m->copy = (struct function){kCopyingKernel, m};
  m->ctx->modules++;
  liveModules++;
  *module = m;
  char line[48];
  snprintf(line, sizeof line, "%d %u\n", m->ctx->device, m->generation);
  appendToLog("FAKE_CUDA_MODULE_LOG", line);
  pthread_mutex_unlock(&lock);
  return OK;
}
CUresult cuModuleUnload(struct module* module) {
  NEED_CTX();
  pthread_mutex_lock(&lock);
  CUresult r = OK;
  if (!moduleAlive(module)) r = E_INVALID_HANDLE;
  else {
    module->unloaded = 1;
    module->ctx->modules--;
    liveModules--;
  }
  pthread_mutex_unlock(&lock);
  return r;
}
CUresult cuModuleGetFunction(struct function** fn, struct module* module, const char* name) {
  NEED_CTX();
  if (!module) return E_INVALID_VALUE;
  pthread_mutex_lock(&lock);
  int alive = moduleAlive(module);
  pthread_mutex_unlock(&lock);
  if (!alive) return E_INVALID_HANDLE;
  if (strcmp(getenv("FAKE_CUDA_KERNELS"), "other-layout") == 0) return E_NOT_FOUND;
  if (strcmp(name, kDigestKernel) == 0) *fn = &module->hash;
  else if (strcmp(name, kCopyingKernel) == 0 && strcmp(getenv("FAKE_CUDA_KERNELS"), "hash-only") != 0) *fn = &module->copy;
  else return E_NOT_FOUND;
  return OK;
}
// The kernel's parameters (jobs, ranges, digests) as xxh3_pieces.cu declares them; a launch must
// give each job of its ranges a warp (blocks of 4 warps). Queued as one op per range.
CUresult cuLaunchKernel(struct function* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shared,
                        struct stream* s, void** params, void** extra) {
  NEED_CTX();
  if (!f || !params || extra || gy != 1 || gz != 1 || bx != 128 || by != 1 || bz != 1 || shared) return E_INVALID_VALUE;
  CUdeviceptr jobs = *(CUdeviceptr*)params[0], out = *(CUdeviceptr*)params[2];
  const struct digestRanges* ranges = (const struct digestRanges*)params[1];
  unsigned long long warps = 0;
  if (ranges->n == 0 || ranges->n > 32) return E_INVALID_VALUE;
  for (unsigned i = 0; i < ranges->n; ++i) warps += ranges->count[i];
  if ((unsigned long long)gx * 4 < warps) return E_INVALID_VALUE;
  pthread_mutex_lock(&lock);
  CUresult r = moduleAlive(f->module) && f->module->ctx == current() ? OK : E_INVALID_HANDLE;
  for (unsigned i = 0; i < ranges->n && r == OK; ++i) {
    const char* first = (const char*)(uintptr_t)jobs + (size_t)ranges->first[i] * sizeof(struct digestJob);
    struct alloc* j = findAlloc(first, (size_t)ranges->count[i] * sizeof(struct digestJob), K_DEVICE);
    if (!j || j->device != current()->device || s->device != current()->device) r = E_INVALID_VALUE;
    else if (s->nops == MAX_OPS) die("too many queued operations on one stream");
    else s->ops[s->nops++] = (struct op){(char*)(uintptr_t)out, NULL, 0, 1, 0, 0, ++s->seq, 0, 0, 0, OP_KERNEL, NULL, 0, first, ranges->count[i], f->name == kCopyingKernel};
  }
  // At once, as far as its stream lets it: after what the stream waits for, and not after copies
  // it was not told to wait for.
  if (r == OK) runUpTo(s, s->seq);
  pthread_mutex_unlock(&lock);
  return r;
}
CUresult cuStreamWaitEvent(struct stream* s, struct event* e, unsigned flags) {
  NEED_CTX();
  if (flags || !e->live) return E_INVALID_VALUE;
  pthread_mutex_lock(&lock);
  CUresult r = OK;
  if (s->nops == MAX_OPS) die("too many queued operations on one stream");
  else if (e->stream) s->ops[s->nops++] = (struct op){NULL, NULL, 0, 1, 0, 0, ++s->seq, 0, 0, 0, OP_WAIT, e->stream, e->seq, NULL, 0};
  pthread_mutex_unlock(&lock);
  return r;
}
static int faultDevice(void) { const char* e = getenv("FAKE_CUDA_FAULT_DEVICE"); return e ? atoi(e) : -1; }
CUresult cuEventSynchronize(struct event* e) {
  NEED_CTX();
  pthread_mutex_lock(&lock);
  int faulted = e->stream && e->stream->device == faultDevice();
  if (e->stream) runUpTo(e->stream, e->seq);
  pthread_mutex_unlock(&lock);
  return faulted ? E_ILLEGAL_ADDRESS : OK;
}
CUresult cuEventDestroy_v2(struct event* e) {
  pthread_mutex_lock(&lock);
  e->live = 0;
  liveEvents--;
  pthread_mutex_unlock(&lock);
  return OK;
}

// Queues a copy after checking that the source is pinned and the destination is device memory
// of the current context's device.
// FAKE_CUDA_COPY_LOG: called with the lock held, so lines never interleave.
static void logCopy(size_t bytes) {
  const char* path = getenv("FAKE_CUDA_COPY_LOG");
  if (!path) return;
  int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) die("cannot open FAKE_CUDA_COPY_LOG");
  char line[32];
  int n = snprintf(line, sizeof line, "%zu\n", bytes);
  if (write(fd, line, (size_t)n) != n) die("cannot write FAKE_CUDA_COPY_LOG");
  close(fd);
}
static CUresult queue(struct stream* s, char* dst, const char* src, size_t width, size_t height, size_t spitch, size_t dpitch) {
  NEED_CTX();
  pthread_mutex_lock(&lock);
  size_t srcSpan = (height - 1) * spitch + width, dstSpan = (height - 1) * dpitch + width;
  struct alloc* d = findAlloc(dst, dstSpan, K_DEVICE);
  CUresult r = OK;
  struct alloc* h = findAlloc(src, srcSpan, K_PINNED);
  if (!h) h = findAlloc(src, srcSpan, K_REGISTERED);
  if (!d || d->device != current()->device || s->device != current()->device) r = E_INVALID_VALUE;
  else if (!h) die("async copy from pageable (unpinned) host memory");
  // The real driver treats such memory as pageable in other contexts: a slow, synchronous copy.
  else if (!h->portable && h->device != current()->device) die("async copy from host memory pinned for another context, not PORTABLE");
  else if (s->nops == MAX_OPS) die("too many queued copies on one stream");
  else s->ops[s->nops++] = (struct op){dst, src, width, height, spitch, dpitch, ++s->seq, 0, 0, 0};
  if (r == OK) logCopy(width * height);
  pthread_mutex_unlock(&lock);
  return r;
}
// Queues a memset of `count` elements of `elt` bytes; the destination must be device memory of
// the current context's device, aligned to the element, like the real driver's.
static CUresult queueMemset(struct stream* s, CUdeviceptr dstPtr, unsigned value, size_t count, int elt) {
  NEED_CTX();
  if (getenv("FAKE_CUDA_FAIL_MEMSET")) return E_INVALID_VALUE;
  char* dst = (char*)(uintptr_t)dstPtr;
  size_t bytes = count * (size_t)elt;
  if (dstPtr % (CUdeviceptr)elt != 0 || count == 0) return E_INVALID_VALUE;
  pthread_mutex_lock(&lock);
  struct alloc* d = findAlloc(dst, bytes, K_DEVICE);
  CUresult r = OK;
  if (!d || d->device != current()->device || s->device != current()->device) r = E_INVALID_VALUE;
  else if (s->nops == MAX_OPS) die("too many queued operations on one stream");
  else s->ops[s->nops++] = (struct op){dst, NULL, bytes, 1, bytes, bytes, ++s->seq, 0, value, elt};
  pthread_mutex_unlock(&lock);
  return r;
}
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, struct stream* s) { return queueMemset(s, dst, value, n, 1); }
CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned value, size_t n, struct stream* s) { return queueMemset(s, dst, value, n, 4); }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, struct stream* s) {
  return queue(s, (char*)(uintptr_t)dst, src, n, 1, n, n);
}
typedef struct {
  size_t srcXInBytes, srcY; int srcMemoryType; const void* srcHost; CUdeviceptr srcDevice; void* srcArray; size_t srcPitch;
  size_t dstXInBytes, dstY; int dstMemoryType; void* dstHost; CUdeviceptr dstDevice; void* dstArray; size_t dstPitch;
  size_t WidthInBytes, Height;
} Memcpy2D;
CUresult cuMemcpy2DAsync_v2(const Memcpy2D* c, struct stream* s) {
  if (c->srcMemoryType != 1 || c->dstMemoryType != 2 || c->srcXInBytes || c->srcY || c->dstXInBytes || c->dstY ||
      c->srcPitch < c->WidthInBytes || c->dstPitch < c->WidthInBytes || c->Height == 0)
    return E_INVALID_VALUE;
  return queue(s, (char*)(uintptr_t)c->dstDevice, c->srcHost, c->WidthInBytes, c->Height, c->srcPitch, c->dstPitch);
}
// Device to device (a writer's staging copies, docs/weight-updates.md): both ends device memory
// of the stream's device, queued like every other copy. A read-only destination faults when it runs.
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, struct stream* s) {
  NEED_CTX();
  pthread_mutex_lock(&lock);
  struct alloc* d = findAlloc((void*)(uintptr_t)dst, n, K_DEVICE);
  struct alloc* from = findAlloc((void*)(uintptr_t)src, n, K_DEVICE);
  CUresult r = OK;
  if (n == 0 || !d || !from || d->device != current()->device || from->device != current()->device || s->device != current()->device) r = E_INVALID_VALUE;
  else if (s->nops == MAX_OPS) die("too many queued copies on one stream");
  else s->ops[s->nops++] = (struct op){(char*)(uintptr_t)dst, (const char*)(uintptr_t)src, n, 1, n, n, ++s->seq, 0, 0, 0};
  pthread_mutex_unlock(&lock);
  return r;
}
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
  NEED_CTX();
  pthread_mutex_lock(&lock);
  struct alloc* a = findAlloc((void*)(uintptr_t)dst, n, K_DEVICE);
  if (!a || a->device != current()->device) { pthread_mutex_unlock(&lock); return E_INVALID_VALUE; }
  if (nLegacyCopies == MAX_LEGACY_COPIES) landLegacyCopies();
  char* staged = malloc(n ? n : 1);
  if (!staged) die("out of memory staging a copy");
  memcpy(staged, src, n);
  legacyCopies[nLegacyCopies].dst = (char*)(uintptr_t)dst;
  legacyCopies[nLegacyCopies].bytes = staged;
  legacyCopies[nLegacyCopies++].n = n;
  pthread_mutex_unlock(&lock);
  return OK;
}
CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
  waitAtGate("FAKE_CUDA_DTOH_GATE");
  NEED_CTX();
  pthread_mutex_lock(&lock);
  landLegacyCopies();
  pthread_mutex_unlock(&lock);
  struct alloc* a = findAlloc((void*)(uintptr_t)src, n, K_DEVICE);
  if (!a || a->device != current()->device) return E_INVALID_VALUE;
  memcpy(dst, (void*)(uintptr_t)src, n);
  return OK;
}

struct handle { char magic[8]; int pid; int device; size_t bytes; char name[40]; };
CUresult cuIpcGetMemHandle(char* out, CUdeviceptr p) {
  NEED_CTX();
  struct alloc* a = findAlloc((void*)(uintptr_t)p, 1, K_DEVICE);
  if (!a || a->base != (char*)(uintptr_t)p || a->vmm) return E_INVALID_VALUE;  // VMM memory has no legacy IPC handle
  struct handle h;
  memset(&h, 0, sizeof h);
  memcpy(h.magic, "FAKEIPC", 8);
  h.pid = getpid();
  h.device = a->device;
  h.bytes = a->bytes;
  snprintf(h.name, sizeof h.name, "%.39s", a->name);
  memset(out, 0, 64);
  memcpy(out, &h, sizeof h);
  return OK;
}
typedef struct { char reserved[64]; } IpcHandle;
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* p, IpcHandle raw, unsigned flags) {
  (void)flags;
  NEED_CTX();
  struct handle h;
  memcpy(&h, raw.reserved, sizeof h);
  if (memcmp(h.magic, "FAKEIPC", 8) != 0) return E_INVALID_VALUE;
  if (h.pid == getpid()) return E_INVALID_CONTEXT;  // the real driver refuses a process's own handles too
  pthread_mutex_lock(&lock);
  // Like the real driver: the same handle opened again in a context is the same mapping, counted.
  for (int i = 0; i < nallocs; ++i) {
    if (allocs[i].live && allocs[i].imported && strcmp(allocs[i].name, h.name) == 0) {
      allocs[i].imported++;
      *p = (CUdeviceptr)(uintptr_t)allocs[i].base;
      pthread_mutex_unlock(&lock);
      return OK;
    }
  }
  int fd = shm_open(h.name, O_RDWR, 0);
  if (fd < 0) { pthread_mutex_unlock(&lock); return E_INVALID_VALUE; }
  struct alloc* a = newAlloc();
  snprintf(a->name, sizeof a->name, "%s", h.name);
  a->base = mmap(NULL, h.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  a->bytes = h.bytes;
  a->device = current()->device;
  a->kind = K_DEVICE;
  a->imported = 1;
  *p = (CUdeviceptr)(uintptr_t)a->base;
  pthread_mutex_unlock(&lock);
  return OK;
}
CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
  NEED_CTX();
  waitAtGate("FAKE_CUDA_IPC_CLOSE_GATE");
  pthread_mutex_lock(&lock);
  struct alloc* a = findAlloc((void*)(uintptr_t)p, 1, K_DEVICE);
  if (!a || !a->imported) { pthread_mutex_unlock(&lock); return E_INVALID_VALUE; }
  if (--a->imported == 0) {
    // A writer's memory a commit pulls from (docs/weight-updates.md) is closed only once the copies
    // that read it ran: closing it under a queued copy is a read of unmapped memory on a real GPU.
    checkNotQueued(a->base, a->bytes, "an IPC mapping closed while a queued copy reads it");
    munmap(a->base, a->bytes);
    a->live = 0;
  }
  pthread_mutex_unlock(&lock);
  return OK;
}


// ---- Virtual memory management. Handles are indexes + 1 into vmms; each allocation is a memfd,
// alive while its handle or a mapping of it is (the kernel keeps the memfd itself alive while any
// process holds a descriptor of it, as the real driver keeps memory an exported descriptor names).
#define GRANULE (2ull << 20)
enum { A_VMM = 102, A_POSIX_FD = 103 };
struct vmm { int live; int handle; int mappings; int memfd; size_t bytes; int device; int imported; int exportable; };
static struct vmm vmms[1024];
static int nvmms;
struct reservation { int live; char* base; size_t bytes; };
static struct reservation reservations[1024];
static int nreservations;
typedef struct { int type; int requestedHandleTypes; struct { int type; int id; } location; void* win32; unsigned char flags[8]; } AllocProp;
typedef struct { struct { int type; int id; } location; int flags; } AccessDesc;

// FAKE_CUDA_VMM_FAIL=NAME:N: whether this call of `name` is the one to fail.
static int failHere(const char* name) {
  static int counts[8];
  static const char* names[] = {"cuMemCreate", "cuMemAddressReserve", "cuMemMap", "cuMemSetAccess", "cuMemExportToShareableHandle", "cuMemImportFromShareableHandle"};
  const char* spec = getenv("FAKE_CUDA_VMM_FAIL");
  for (int i = 0; i < 6; ++i) {
    if (strcmp(names[i], name) != 0) continue;
    int n = ++counts[i];
    size_t len = strlen(name);
    return spec && strncmp(spec, name, len) == 0 && spec[len] == ':' && atoi(spec + len + 1) == n;
  }
  return 0;
}

CUresult cuDeviceGetAttribute(int* value, int attribute, CUdevice d) {
  if (!initialised) return E_NOT_INIT;
  if (d < 0 || d >= devices()) return E_INVALID_DEVICE;
  if (attribute == A_VMM) *value = !getenv("FAKE_CUDA_NO_VMM");
  else if (attribute == A_POSIX_FD) *value = !getenv("FAKE_CUDA_NO_VMM") && !getenv("FAKE_CUDA_NO_FD_HANDLES");
  else return E_INVALID_VALUE;  // weightd asks for no other attribute
  return OK;
}

static int goodProp(const AllocProp* p) {
  return p && p->type == 1 && p->location.type == 1 && p->location.id >= 0 && p->location.id < devices();
}

CUresult cuMemGetAllocationGranularity(size_t* g, const AllocProp* prop, int option) {
  NEED_CTX();
  if (!goodProp(prop) || (option != 0 && option != 1)) return E_INVALID_VALUE;
  *g = GRANULE;
  return OK;
}

static struct vmm* vmmOf(unsigned long long handle) {
  if (handle == 0 || handle > (unsigned long long)nvmms) return NULL;
  struct vmm* v = &vmms[handle - 1];
  return v->live && v->handle ? v : NULL;
}

static struct vmm* newVmm(void) {
  if (nvmms == 1024) die("too many VMM allocations");
  struct vmm* v = &vmms[nvmms++];
  memset(v, 0, sizeof *v);
  v->live = v->handle = 1;
  return v;
}

// The allocation goes once neither its handle nor any mapping holds it.
static void vmmMaybeFree(struct vmm* v) {
  if (v->handle || v->mappings) return;
  close(v->memfd);
  if (!v->imported) usedBytes[v->device] -= v->bytes;
  v->live = 0;
}

CUresult cuMemCreate(unsigned long long* handle, size_t bytes, const AllocProp* prop, unsigned long long flags) {
  NEED_CTX();
  if (!goodProp(prop) || flags != 0 || bytes == 0 || bytes % GRANULE) return E_INVALID_VALUE;
  if (prop->requestedHandleTypes & ~1) return E_INVALID_VALUE;  // only POSIX descriptors exist here
  if (getenv("FAKE_CUDA_NO_VMM")) return E_INVALID_VALUE;
  pthread_mutex_lock(&lock);
  int d = prop->location.id;
  if (failHere("cuMemCreate") || usedBytes[d] + bytes > memPerDevice()) { pthread_mutex_unlock(&lock); return E_OOM; }
  struct vmm* v = newVmm();
  char name[64];
  snprintf(name, sizeof name, "fakecuda-vmm-d%d-%d", d, (int)getpid());
  v->memfd = memfd_create(name, MFD_CLOEXEC);
  if (v->memfd < 0 || ftruncate(v->memfd, (off_t)bytes) != 0) die("memfd_create");
  char* p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, v->memfd, 0);
  if (p == MAP_FAILED) die("mmap");
  memset(p, 0xEE, bytes);  // never zero, like cuMemAlloc's
  munmap(p, bytes);
  v->bytes = bytes;
  v->device = d;
  v->exportable = prop->requestedHandleTypes & 1;
  usedBytes[d] += bytes;
  *handle = (unsigned long long)(v - vmms) + 1;
  pthread_mutex_unlock(&lock);
  return OK;
}

CUresult cuMemRelease(unsigned long long handle) {
  NEED_CTX();
  pthread_mutex_lock(&lock);
  struct vmm* v = vmmOf(handle);
  if (!v) { pthread_mutex_unlock(&lock); return E_INVALID_VALUE; }
  v->handle = 0;
  vmmMaybeFree(v);
  pthread_mutex_unlock(&lock);
  return OK;
}

CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t bytes, size_t alignment, CUdeviceptr addr, unsigned long long flags) {
  NEED_CTX();
  if (bytes == 0 || bytes % GRANULE || addr != 0 || flags != 0 || (alignment && alignment % GRANULE)) return E_INVALID_VALUE;
  pthread_mutex_lock(&lock);
  if (failHere("cuMemAddressReserve")) { pthread_mutex_unlock(&lock); return E_OOM; }
  if (nreservations == 1024) die("too many reservations");
  size_t align = alignment ? alignment : GRANULE;
  char* raw = mmap(NULL, bytes + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) die("mmap reservation");
  char* base = (char*)(((uintptr_t)raw + align - 1) / align * align);
  if (base > raw) munmap(raw, (size_t)(base - raw));
  if (base + bytes < raw + bytes + align) munmap(base + bytes, (size_t)(raw + bytes + align - (base + bytes)));
  reservations[nreservations++] = (struct reservation){1, base, bytes};
  *ptr = (CUdeviceptr)(uintptr_t)base;
  pthread_mutex_unlock(&lock);
  return OK;
}

static struct alloc* mappingIn(const char* p, size_t n) {
  for (int i = 0; i < nallocs; ++i) {
    struct alloc* a = &allocs[i];
    if (a->live && a->vmm && a->base < p + n && a->base + a->bytes > p) return a;
  }
  return NULL;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t bytes) {
  NEED_CTX();
  pthread_mutex_lock(&lock);
  char* p = (char*)(uintptr_t)ptr;
  for (int i = 0; i < nreservations; ++i) {
    struct reservation* r = &reservations[i];
    if (!r->live || r->base != p || r->bytes != bytes) continue;
    if (mappingIn(p, bytes)) { pthread_mutex_unlock(&lock); return E_INVALID_VALUE; }  // unmap first
    munmap(p, bytes);
    r->live = 0;
    pthread_mutex_unlock(&lock);
    return OK;
  }
  pthread_mutex_unlock(&lock);
  return E_INVALID_VALUE;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t bytes, size_t offset, unsigned long long handle, unsigned long long flags) {
  NEED_CTX();
  pthread_mutex_lock(&lock);
  char* p = (char*)(uintptr_t)ptr;
  struct vmm* v = vmmOf(handle);
  int inReservation = 0;
  for (int i = 0; i < nreservations; ++i) {
    struct reservation* r = &reservations[i];
    if (r->live && p >= r->base && p + bytes <= r->base + r->bytes) inReservation = 1;
  }
  CUresult rc = OK;
  if (failHere("cuMemMap")) rc = E_OOM;
  else if (!v || !inReservation || flags != 0 || bytes == 0 || bytes % GRANULE || offset % GRANULE || offset + bytes > v->bytes || mappingIn(p, bytes)) rc = E_INVALID_VALUE;
  if (rc != OK) { pthread_mutex_unlock(&lock); return rc; }
  if (mmap(p, bytes, PROT_NONE, MAP_SHARED | MAP_FIXED, v->memfd, (off_t)offset) == MAP_FAILED) die("mmap mapping");
  struct alloc* a = newAlloc();
  a->base = p;
  a->bytes = bytes;
  a->device = v->device;
  a->kind = K_MAPPED;
  a->vmm = (int)(v - vmms) + 1;
  v->mappings++;
  pthread_mutex_unlock(&lock);
  return OK;
}

// FAKE_CUDA_ACCESS_LOG=PATH: each access granted to a mapping appends "PID INODE FLAGS" (the
// allocation's memfd inode, the same in every process that maps it; flags 1 read, 3 read-write),
// so a test sees which process could write which allocation. Called with the lock held.
static void logAccess(const struct vmm* v, int flags) {
  const char* path = getenv("FAKE_CUDA_ACCESS_LOG");
  if (!path) return;
  struct stat st;
  if (fstat(v->memfd, &st) != 0) die("fstat of a VMM memfd");
  int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) die("cannot open FAKE_CUDA_ACCESS_LOG");
  char line[64];
  int n = snprintf(line, sizeof line, "%d %lu %d\n", (int)getpid(), (unsigned long)st.st_ino, flags);
  if (write(fd, line, (size_t)n) != n) die("cannot write FAKE_CUDA_ACCESS_LOG");
  close(fd);
}

// The mapping that starts exactly at p, if any. Called with the lock held.
static struct alloc* mappingAt(const char* p) {
  for (int i = 0; i < nallocs; ++i) {
    struct alloc* a = &allocs[i];
    if (a->live && a->vmm && a->base == p) return a;
  }
  return NULL;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t bytes, const AccessDesc* desc, size_t count) {
  NEED_CTX();
  pthread_mutex_lock(&lock);
  char* p = (char*)(uintptr_t)ptr;
  CUresult rc = OK;
  if (failHere("cuMemSetAccess")) rc = E_OOM;
  // A fully mapped range (the driver's rule): whole mappings, one after another with no hole,
  // all on the GPU the access is for, read-write (flags 3), or read-only (flags 1: a write
  // through it faults) unless FAKE_CUDA_NO_READ_ONLY plays a driver that refuses that.
  else if (bytes == 0 || count != 1 || desc[0].location.type != 1 || (desc[0].flags != 3 && (desc[0].flags != 1 || getenv("FAKE_CUDA_NO_READ_ONLY")))) rc = E_INVALID_VALUE;
  else {
    for (char* at = p; at < p + bytes;) {
      struct alloc* a = mappingAt(at);
      if (!a || a->base + a->bytes > p + bytes || desc[0].location.id != a->device) { rc = E_INVALID_VALUE; break; }
      at += a->bytes;
    }
  }
  if (rc == OK) {
    for (char* at = p; at < p + bytes;) {
      struct alloc* a = mappingAt(at);
      if (mprotect(a->base, a->bytes, desc[0].flags == 1 ? PROT_READ : PROT_READ | PROT_WRITE) != 0) die("mprotect");
      a->kind = K_DEVICE;
      logAccess(&vmms[a->vmm - 1], desc[0].flags);
      at += a->bytes;
    }
  }
  pthread_mutex_unlock(&lock);
  return rc;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t bytes) {
  NEED_CTX();
  pthread_mutex_lock(&lock);
  struct alloc* a = mappingIn((char*)(uintptr_t)ptr, bytes);
  if (!a || a->base != (char*)(uintptr_t)ptr || a->bytes != bytes) { pthread_mutex_unlock(&lock); return E_INVALID_VALUE; }
  checkNotQueued(a->base, a->bytes, "VMM memory unmapped while a queued copy writes it");
  // Back to reserved, inaccessible address space.
  if (mmap(a->base, a->bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) == MAP_FAILED) die("mmap unmap");
  a->live = 0;
  struct vmm* v = &vmms[a->vmm - 1];
  v->mappings--;
  vmmMaybeFree(v);
  pthread_mutex_unlock(&lock);
  return OK;
}

CUresult cuMemExportToShareableHandle(void* out, unsigned long long handle, int type, unsigned long long flags) {
  NEED_CTX();
  pthread_mutex_lock(&lock);
  struct vmm* v = vmmOf(handle);
  CUresult rc = OK;
  if (failHere("cuMemExportToShareableHandle")) rc = E_OOM;
  else if (!v || type != 1 || flags != 0 || !v->exportable) rc = E_INVALID_VALUE;
  if (rc == OK) {
    int fd = fcntl(v->memfd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) die("dup");
    *(int*)out = fd;
  }
  pthread_mutex_unlock(&lock);
  return rc;
}

// The device a descriptor of fake VMM memory belongs to, or -1 for any other descriptor.
static int fakeVmmDevice(int fd) {
  char path[64], target[128];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(path, target, sizeof target - 1);
  if (n <= 0) return -1;
  target[n] = 0;
  int d;
  return sscanf(target, "/memfd:fakecuda-vmm-d%d-", &d) == 1 ? d : -1;
}

CUresult cuMemImportFromShareableHandle(unsigned long long* handle, void* osHandle, int type) {
  NEED_CTX();
  int fd = (int)(intptr_t)osHandle;
  pthread_mutex_lock(&lock);
  int d = fakeVmmDevice(fd);
  struct stat st;
  CUresult rc = OK;
  if (failHere("cuMemImportFromShareableHandle")) rc = E_OOM;
  else if (type != 1 || d < 0 || fstat(fd, &st) != 0) rc = E_INVALID_VALUE;
  if (rc != OK) { pthread_mutex_unlock(&lock); return rc; }
  struct vmm* v = newVmm();
  v->memfd = fcntl(fd, F_DUPFD_CLOEXEC, 0);  // the driver's own reference: the caller may close fd
  v->bytes = (size_t)st.st_size;
  v->device = d;
  v->imported = 1;
  v->exportable = 1;
  *handle = (unsigned long long)(v - vmms) + 1;
  pthread_mutex_unlock(&lock);
  return OK;
}

// Descriptors of fake VMM memory this process still has open, besides the fake's own.
static int openVmmFds(void) {
  int n = 0;
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  for (struct dirent* e; (e = readdir(dir));) {
    int fd = atoi(e->d_name);
    if (e->d_name[0] != '.' && fd != dirfd(dir) && fakeVmmDevice(fd) >= 0) n++;
  }
  closedir(dir);
  for (int i = 0; i < nvmms; ++i) n -= vmms[i].live;
  return n;
}

// The driver frees a process's memory when it exits; here its device allocations' names go, so
// that what a process did not free does not stay in /dev/shm for ever (a process killed outright
// still leaves them; nameNonce keeps them from colliding).
__attribute__((destructor)) static void unlinkOwnAtExit(void) {
  for (int i = 0; i < nallocs; ++i)
    if (allocs[i].live && allocs[i].kind == K_DEVICE && !allocs[i].imported && !allocs[i].vmm && allocs[i].name[0]) shm_unlink(allocs[i].name);
}

__attribute__((destructor)) static void report(void) {
  if (!getenv("FAKE_CUDA_REPORT")) return;
  int device = 0, pinned = 0, registered = 0, imported = 0, ctx = 0, mappings = 0, vmm = 0, reserved = 0;
  for (int i = 0; i < nallocs; ++i) {
    if (!allocs[i].live) continue;
    if (allocs[i].vmm) mappings++;
    else if (allocs[i].kind == K_DEVICE && allocs[i].imported) imported++;
    else if (allocs[i].kind == K_DEVICE) device++;
    else if (allocs[i].kind == K_PINNED) pinned++;
    else registered++;
  }
  for (int d = 0; d < MAX_DEV; ++d) ctx += contexts[d].refs;
  for (int i = 0; i < nvmms; ++i) vmm += vmms[i].live;
  for (int i = 0; i < nreservations; ++i) reserved += reservations[i].live;
  fprintf(stderr,
          "FAKE_CUDA_LEAKS {\"device\":%d,\"pinned\":%d,\"registered\":%d,\"imported\":%d,\"streams\":%d,\"events\":%d,\"contextRefs\":%d,"
          "\"vmm\":%d,\"reservations\":%d,\"mappings\":%d,\"vmmFds\":%d,\"modules\":%d}\n",
          device, pinned, registered, imported, liveStreams, liveEvents, ctx, vmm, reserved, mappings, openVmmFds(), liveModules);
}
