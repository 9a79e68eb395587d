/* A CUPTI callback that records every CUDA driver call (thread, callback id, name, enter and
 * exit times on CLOCK_MONOTONIC), for benchmarks/driver_calls.py (issue 24). In C, not
 * Python: a driver call on one of IREE's threads must not wait for the Python caller's
 * lock, and the record costs well under a us.
 *
 * Two uses:
 * - loaded by driver_calls.py (ctypes), which subscribes `autosched_driver_callback` and
 *   reads `autosched_calls` while `autosched_recording` is set;
 * - preloaded into a program (LD_PRELOAD, e.g. iree-benchmark-module) with
 *   AUTOSCHED_CUPTI_LIB naming libcupti and AUTOSCHED_CUPTI_OUT a file: it subscribes
 *   itself at start, records everything, and writes one line a driver call at exit.
 *
 *     cc -shared -fPIC -O2 -o cupti_trace.so benchmarks/cupti_trace.c -ldl
 */
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define CAPACITY (1 << 20)
#define NAME_BYTES 40

typedef struct {
  int32_t thread;
  uint32_t cbid;
  const char* name;
  int64_t enter_ns;
  int64_t exit_ns;
} driver_call_t;

/* The leading fields of CUPTI's CUpti_CallbackData. */
typedef struct {
  int32_t site; /* CUPTI_API_ENTER 0, CUPTI_API_EXIT 1 */
  const char* function_name;
} callback_head_t;

driver_call_t autosched_calls[CAPACITY];
atomic_int autosched_call_count;
volatile int autosched_recording;
static __thread int64_t entered_ns; /* driver calls do not nest on one thread */
static char names[CAPACITY][NAME_BYTES]; /* the preloaded use's copies (libcupti may be gone) */
static int preloaded;

static int64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

void autosched_driver_callback(void* user, int domain, uint32_t cbid, const void* data) {
  (void)user;
  (void)domain;
  if (!autosched_recording) return;
  const callback_head_t* head = (const callback_head_t*)data;
  int64_t now = now_ns();
  if (head->site == 0) {
    entered_ns = now;
    return;
  }
  int index = atomic_fetch_add(&autosched_call_count, 1);
  if (index >= CAPACITY) return;
  driver_call_t* call = &autosched_calls[index];
  call->thread = (int32_t)syscall(SYS_gettid);
  call->cbid = cbid;
  call->name = head->function_name;
  call->enter_ns = entered_ns;
  call->exit_ns = now;
  if (preloaded && head->function_name) {
    strncpy(names[index], head->function_name, NAME_BYTES - 1);
  }
}

static void write_calls(void) {
  autosched_recording = 0;
  FILE* out = fopen(getenv("AUTOSCHED_CUPTI_OUT"), "w");
  if (out == NULL) return;
  int count = autosched_call_count < CAPACITY ? autosched_call_count : CAPACITY;
  for (int i = 0; i < count; ++i) {
    driver_call_t* call = &autosched_calls[i];
    fprintf(out, "%d %s %lld %lld\n", call->thread, names[i][0] ? names[i] : "?",
            (long long)call->enter_ns, (long long)call->exit_ns);
  }
  fclose(out);
}

typedef int (*subscribe_fn)(void**, void*, void*);
typedef int (*enable_fn)(uint32_t, void*, int);

__attribute__((constructor)) static void subscribe_when_preloaded(void) {
  const char* library = getenv("AUTOSCHED_CUPTI_LIB");
  if (library == NULL || getenv("AUTOSCHED_CUPTI_OUT") == NULL) return;
  void* cupti = dlopen(library, RTLD_NOW | RTLD_GLOBAL);
  if (cupti == NULL) {
    fprintf(stderr, "cupti_trace: %s\n", dlerror());
    return;
  }
  subscribe_fn subscribe = (subscribe_fn)dlsym(cupti, "cuptiSubscribe");
  enable_fn enable = (enable_fn)dlsym(cupti, "cuptiEnableDomain");
  void* subscriber = NULL;
  if (!subscribe || !enable || subscribe(&subscriber, (void*)autosched_driver_callback, NULL) ||
      enable(1, subscriber, 1 /* CUPTI_CB_DOMAIN_DRIVER_API */)) {
    fprintf(stderr, "cupti_trace: could not subscribe to the driver's calls\n");
    return;
  }
  preloaded = 1;
  autosched_recording = 1;
  atexit(write_calls);
}
