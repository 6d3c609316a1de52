// A stand-in for libnvidia-ml.so.1 with deterministic readings, so the sampler's GPU path (symbol
// resolution, device lookup by PCI bus id, unit conversions, energy differences, NVLink rates) is
// tested on machines without a GPU. It models one GPU at bus id 0000:3B:00.0 drawing a constant
// 250 W (energy counter = 250 W x time since init), NVLink moving 1 GiB/s each way.
#include <chrono>
#include <cstring>

extern "C" {

namespace {
struct FakeDevice {
    int unused;
} g_device;
std::chrono::steady_clock::time_point g_init;
double seconds_since_init() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - g_init).count();
}
} // namespace

using nvmlDevice_t = FakeDevice*;
struct Utilization {
    unsigned int gpu, memory;
};
struct Memory {
    unsigned long long total, free, used;
};
union Value {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    int siVal;
    unsigned short usVal;
};
struct FieldValue {
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec;
    int valueType, nvmlReturn;
    Value value;
};

int nvmlInit_v2() {
    g_init = std::chrono::steady_clock::now();
    return 0;
}
int nvmlShutdown() {
    return 0;
}
const char* nvmlErrorString(int) {
    return "fake error";
}
int nvmlDeviceGetHandleByPciBusId_v2(const char* bus, nvmlDevice_t* d) {
    if (std::strcmp(bus, "0000:3B:00.0") != 0) return 6; // NVML_ERROR_NOT_FOUND
    *d = &g_device;
    return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t* d) {
    if (i != 0) return 2; // NVML_ERROR_INVALID_ARGUMENT
    *d = &g_device;
    return 0;
}
int nvmlDeviceGetName(nvmlDevice_t, char* name, unsigned int len) {
    std::strncpy(name, "NVIDIA H100 80GB HBM3", len);
    return 0;
}
int nvmlDeviceGetPowerUsage(nvmlDevice_t, unsigned int* mw) {
    *mw = 250000;
    return 0;
}
int nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t, unsigned long long* mj) {
    *mj = 5000000ull + static_cast<unsigned long long>(250000.0 * seconds_since_init()); // mJ
    return 0;
}
int nvmlDeviceGetUtilizationRates(nvmlDevice_t, Utilization* u) {
    u->gpu = 87;
    u->memory = 41;
    return 0;
}
int nvmlDeviceGetClockInfo(nvmlDevice_t, int type, unsigned int* mhz) {
    *mhz = type == 1 ? 1980 : 0;
    return 0;
}
int nvmlDeviceGetTemperature(nvmlDevice_t, int, unsigned int* c) {
    *c = 61;
    return 0;
}
int nvmlDeviceGetMemoryInfo(nvmlDevice_t, Memory* m) {
    m->total = 80ull << 30;
    m->used = 3ull << 30;
    m->free = m->total - m->used;
    return 0;
}
int nvmlDeviceGetPcieThroughput(nvmlDevice_t, int counter, unsigned int* kbps) {
    *kbps = counter == 0 ? 1000 : 2000; // KB/s
    return 0;
}
int nvmlDeviceGetFieldValues(nvmlDevice_t, int count, FieldValue* f) {
    for (int i = 0; i < count; ++i) {
        f[i].nvmlReturn = 0;
        if (f[i].fieldId == 186) {
            f[i].valueType = 1;
            f[i].value.uiVal = 260000; // mW
        } else if (f[i].fieldId == 138 || f[i].fieldId == 139) {
            f[i].valueType = 3; // cumulative KiB: 1 GiB/s
            f[i].value.ullVal = static_cast<unsigned long long>(1048576.0 * seconds_since_init());
        } else {
            f[i].nvmlReturn = 3; // NVML_ERROR_NOT_SUPPORTED
        }
    }
    return 0;
}

} // extern "C"
