/* Sets the CUDA primary context's scheduling flags (how a host thread waits for the GPU)
 * before the program runs, for benchmarks/wait_scheduling.py (issue 24): loaded with
 * LD_PRELOAD, it reads AUTOSCHED_CUDA_SCHED (0 auto, 1 spin, 2 yield, 4 blocking sync).
 * IREE's CUDA driver retains the primary context and waits on it with cuEventSynchronize.
 *
 *     cc -shared -fPIC -O2 -o cuda_wait_shim.so benchmarks/cuda_wait_shim.c -ldl
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef int (*init_fn)(unsigned int);
typedef int (*device_fn)(int*, int);
typedef int (*flags_fn)(int, unsigned int);

__attribute__((constructor)) static void set_wait_scheduling(void) {
  const char* value = getenv("AUTOSCHED_CUDA_SCHED");
  if (value == NULL) return;
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (cuda == NULL) {
    fprintf(stderr, "cuda_wait_shim: libcuda.so.1 not found\n");
    return;
  }
  init_fn init = (init_fn)dlsym(cuda, "cuInit");
  device_fn device_get = (device_fn)dlsym(cuda, "cuDeviceGet");
  flags_fn set_flags = (flags_fn)dlsym(cuda, "cuDevicePrimaryCtxSetFlags_v2");
  if (set_flags == NULL) set_flags = (flags_fn)dlsym(cuda, "cuDevicePrimaryCtxSetFlags");
  int device = 0;
  int status = init(0);
  if (status == 0) status = device_get(&device, 0);
  if (status == 0) status = set_flags(device, (unsigned int)atoi(value));
  if (status != 0) fprintf(stderr, "cuda_wait_shim: CUDA error %d\n", status);
}
