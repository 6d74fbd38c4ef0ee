/* A stand-in for the CUDA driver's library (libcuda.so.1) for tests/test_deploy_start.py: the calls
   fusetune.search.driver_machine makes, answering from the environment as a machine would:
   FAKE_CUDA_DRIVER (cuDriverGetVersion, 12080 for 12.8), FAKE_CUDA_COUNT (devices visible),
   FAKE_CUDA_NAME (device 0's name), FAKE_CUDA_CAPABILITY ("9.0"). Every call returns CUDA_SUCCESS (0), or
   CUDA_ERROR_INVALID_DEVICE (101) for a device or attribute it does not have. */
#include <stdlib.h>
#include <string.h>

static int number(const char *name) { const char *value = getenv(name); return value ? atoi(value) : 0; }

int cuInit(unsigned int flags) { return flags == 0 ? 0 : 1; }

int cuDriverGetVersion(int *version) { *version = number("FAKE_CUDA_DRIVER"); return 0; }

int cuDeviceGetCount(int *count) { *count = number("FAKE_CUDA_COUNT"); return 0; }

int cuDeviceGet(int *device, int ordinal) {
    if (ordinal < 0 || ordinal >= number("FAKE_CUDA_COUNT")) return 101;
    *device = ordinal;
    return 0;
}

int cuDeviceGetName(char *name, int length, int device) {
    const char *given = getenv("FAKE_CUDA_NAME");
    if (device != 0 || length < 1 || !given) return 101;
    strncpy(name, given, (size_t)length - 1);
    name[length - 1] = '\0';
    return 0;
}

int cuDeviceGetAttribute(int *value, int attribute, int device) {
    const char *capability = getenv("FAKE_CUDA_CAPABILITY");
    const char *dot = capability ? strchr(capability, '.') : NULL;
    if (device != 0 || !dot) return 101;
    if (attribute == 75) { *value = atoi(capability); return 0; }  /* ..._COMPUTE_CAPABILITY_MAJOR */
    if (attribute == 76) { *value = atoi(dot + 1); return 0; }     /* ..._COMPUTE_CAPABILITY_MINOR */
    return 101;
}
