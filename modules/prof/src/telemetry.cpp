// TelemetrySampler: host counters from getrusage, /proc/self/statm and getloadavg; GPU counters
// from NVML, dlopen()ed at run time so the binary has no link-time dependency on the driver. The
// few NVML types and signatures used are declared here (the toolkit may not ship nvml.h); they are
// part of NVML's stable C ABI.
#include "trainscope/prof/telemetry.hpp"

#include <dlfcn.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>

#include "trainscope/core/mpi_util.hpp"
#include "trainscope/core/numeric.hpp"
#include "trainscope/prof/phase_timer.hpp"

namespace trainscope::prof {
namespace {

using core::kNaN;

// --- NVML ABI subset (nvml.h) ---------------------------------------------------------------
using nvmlReturn_t = int; // enum; NVML_SUCCESS = 0
using nvmlDevice_t = struct nvmlDevice_st*;
constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr int kNvmlClockSm = 1;              // nvmlClockType_t NVML_CLOCK_SM
constexpr int kNvmlTemperatureGpu = 0;       // nvmlTemperatureSensors_t NVML_TEMPERATURE_GPU
constexpr int kNvmlPcieTxBytes = 0;          // nvmlPcieUtilCounter_t, KB/s
constexpr int kNvmlPcieRxBytes = 1;          //
constexpr unsigned kFieldPowerInstant = 186; // NVML_FI_DEV_POWER_INSTANT, mW
constexpr unsigned kFieldNvlinkTx = 138;     // NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, KiB counter
constexpr unsigned kFieldNvlinkRx = 139;     // NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, KiB counter

struct NvmlUtilization {
    unsigned int gpu;    // percent
    unsigned int memory; // percent
};
struct NvmlMemory {                       // nvmlMemory_t (v1)
    unsigned long long total, free, used; // bytes
};
union NvmlValue {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    int siVal;
    unsigned short usVal;
};
struct NvmlFieldValue {
    unsigned int fieldId;
    unsigned int scopeId; // NVLink fields: link id, UINT_MAX = all links
    long long timestamp;  // us since 1970
    long long latencyUsec;
    int valueType; // nvmlValueType_t
    nvmlReturn_t nvmlReturn;
    NvmlValue value;
};

double field_value(const NvmlFieldValue& f) {
    if (f.nvmlReturn != kNvmlSuccess) return kNaN;
    switch (f.valueType) {
    case 0:
        return f.value.dVal;
    case 1:
        return static_cast<double>(f.value.uiVal);
    case 2:
        return static_cast<double>(f.value.ulVal);
    case 3:
        return static_cast<double>(f.value.ullVal);
    case 4:
        return static_cast<double>(f.value.sllVal);
    case 5:
        return static_cast<double>(f.value.siVal);
    case 6:
        return static_cast<double>(f.value.usVal);
    default:
        return kNaN;
    }
}

// Process CPU time (user + system) in seconds: the counters /proc/self/stat reports as utime and
// stime, with microsecond rather than clock-tick (10 ms) resolution.
double process_cpu_seconds() {
    rusage u{};
    if (getrusage(RUSAGE_SELF, &u) != 0) return kNaN;
    return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// Resident set from /proc/self/statm (second field, pages): cheaper than parsing status.
double rss_bytes() {
    std::ifstream statm("/proc/self/statm");
    double size = 0, resident = 0;
    if (!(statm >> size >> resident)) return kNaN;
    return resident * static_cast<double>(sysconf(_SC_PAGESIZE));
}

double load1() {
    double l[1];
    return getloadavg(l, 1) == 1 ? l[0] : kNaN;
}

} // namespace

// The loaded library, its entry points and this rank's device handle.
struct TelemetrySampler::Nvml {
    void* lib = nullptr;
    bool initialised = false;
    nvmlDevice_t device = nullptr;

    nvmlReturn_t (*init)() = nullptr;
    nvmlReturn_t (*shutdown)() = nullptr;
    const char* (*error_string)(nvmlReturn_t) = nullptr;
    nvmlReturn_t (*by_pci_bus_id)(const char*, nvmlDevice_t*) = nullptr;
    nvmlReturn_t (*by_index)(unsigned int, nvmlDevice_t*) = nullptr;
    nvmlReturn_t (*get_name)(nvmlDevice_t, char*, unsigned int) = nullptr;
    nvmlReturn_t (*power_usage)(nvmlDevice_t, unsigned int*) = nullptr;          // mW
    nvmlReturn_t (*total_energy)(nvmlDevice_t, unsigned long long*) = nullptr;   // mJ
    nvmlReturn_t (*utilization)(nvmlDevice_t, NvmlUtilization*) = nullptr;       // %
    nvmlReturn_t (*clock_info)(nvmlDevice_t, int, unsigned int*) = nullptr;      // MHz
    nvmlReturn_t (*temperature)(nvmlDevice_t, int, unsigned int*) = nullptr;     // degC
    nvmlReturn_t (*memory_info)(nvmlDevice_t, NvmlMemory*) = nullptr;            // B
    nvmlReturn_t (*pcie_throughput)(nvmlDevice_t, int, unsigned int*) = nullptr; // KB/s
    nvmlReturn_t (*field_values)(nvmlDevice_t, int, NvmlFieldValue*) = nullptr;

    ~Nvml() {
        if (initialised && shutdown) shutdown();
        if (lib) dlclose(lib);
    }

    std::string error(nvmlReturn_t r) const {
        const char* s = error_string ? error_string(r) : nullptr;
        return s ? std::string(s) + " (" + std::to_string(r) + ")"
                 : "NVML error " + std::to_string(r);
    }

    template <typename F> bool resolve(F& fn, const char* name) {
        fn = reinterpret_cast<F>(dlsym(lib, name));
        return fn != nullptr;
    }
};

TelemetrySampler::TelemetrySampler(const TelemetryOptions& options, int cuda_device,
                                   const std::string& pci_bus_id)
    : options_(options), cuda_device_(cuda_device), started_at_(kNaN), stopped_at_(kNaN) {
    if (!options_.enabled) {
        reason_ = "telemetry disabled (telemetry.enabled=false)";
        return;
    }
    if (cuda_device < 0) {
        reason_ = "CPU run: no CUDA device bound to this rank";
        return;
    }
    auto n = std::make_unique<Nvml>();
    const std::string& libname = options_.nvml_library;
    n->lib = dlopen(libname.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!n->lib) {
        const char* e = dlerror();
        reason_ = libname +
                  " not loadable (no NVIDIA driver on this node?): " + (e ? e : "dlopen failed");
        return;
    }
    // Required entry points; the others are optional and their columns stay NaN when absent.
    const char* missing = nullptr;
    if (!n->resolve(n->init, "nvmlInit_v2"))
        missing = "nvmlInit_v2";
    else if (!n->resolve(n->shutdown, "nvmlShutdown"))
        missing = "nvmlShutdown";
    else if (!n->resolve(n->by_index, "nvmlDeviceGetHandleByIndex_v2"))
        missing = "nvmlDeviceGetHandleByIndex_v2";
    if (missing) {
        reason_ = std::string(missing) + " not found in " + libname + " (driver too old?)";
        return;
    }
    n->resolve(n->error_string, "nvmlErrorString");
    n->resolve(n->by_pci_bus_id, "nvmlDeviceGetHandleByPciBusId_v2");
    n->resolve(n->get_name, "nvmlDeviceGetName");
    n->resolve(n->power_usage, "nvmlDeviceGetPowerUsage");
    n->resolve(n->total_energy, "nvmlDeviceGetTotalEnergyConsumption");
    n->resolve(n->utilization, "nvmlDeviceGetUtilizationRates");
    n->resolve(n->clock_info, "nvmlDeviceGetClockInfo");
    n->resolve(n->temperature, "nvmlDeviceGetTemperature");
    n->resolve(n->memory_info, "nvmlDeviceGetMemoryInfo");
    n->resolve(n->pcie_throughput, "nvmlDeviceGetPcieThroughput");
    n->resolve(n->field_values, "nvmlDeviceGetFieldValues");

    if (const nvmlReturn_t r = n->init(); r != kNvmlSuccess) {
        reason_ = "nvmlInit_v2 failed: " + n->error(r);
        return;
    }
    n->initialised = true;
    // The PCI bus id names the same GPU as CUDA even when CUDA_VISIBLE_DEVICES renumbers devices;
    // the index is a fallback that is right only without such remapping.
    if (!pci_bus_id.empty() && n->by_pci_bus_id &&
        n->by_pci_bus_id(pci_bus_id.c_str(), &n->device) == kNvmlSuccess) {
        device_match_ = "pci_bus_id";
    } else if (const nvmlReturn_t r = n->by_index(static_cast<unsigned>(cuda_device), &n->device);
               r == kNvmlSuccess) {
        device_match_ = "index";
    } else {
        reason_ = "no NVML device for PCI bus id '" + pci_bus_id + "' or index " +
                  std::to_string(cuda_device) + ": " + n->error(r);
        return;
    }
    if (n->get_name) {
        char name[96] = {};
        if (n->get_name(n->device, name, sizeof(name)) == kNvmlSuccess) gpu_name_ = name;
    }
    nvml_ = std::move(n);
    gpu_available_ = true;
}

TelemetrySampler::~TelemetrySampler() {
    try {
        stop();
    } catch (...) {
        // A destructor must not throw; the thread is joined either way.
    }
}

TelemetrySample TelemetrySampler::take_sample() {
    TelemetrySample s;
    s.t_s = run_clock_seconds();
    const double cpu = process_cpu_seconds();
    s.cpu_percent = prev_t_ >= 0 && s.t_s > prev_t_
                        ? 100.0 * (cpu - prev_cpu_s_) / (s.t_s - prev_t_)
                        : kNaN; // first sample: no interval yet
    s.rss_bytes = rss_bytes();
    s.load1 = load1();

    s.power_w = s.power_instant_w = s.energy_j = kNaN;
    s.gpu_util_percent = s.mem_util_percent = s.sm_clock_mhz = s.temperature_c = kNaN;
    s.gpu_mem_used_bytes = s.pcie_tx_bytes_per_s = s.pcie_rx_bytes_per_s = kNaN;
    s.nvlink_tx_bytes_per_s = s.nvlink_rx_bytes_per_s = kNaN;
    if (nvml_) {
        Nvml& n = *nvml_;
        unsigned int u = 0;
        if (n.power_usage && n.power_usage(n.device, &u) == kNvmlSuccess) s.power_w = u * 1e-3;
        unsigned long long mj = 0;
        if (n.total_energy && n.total_energy(n.device, &mj) == kNvmlSuccess) {
            if (energy0_mj_ < 0) energy0_mj_ = static_cast<double>(mj);
            s.energy_j = (static_cast<double>(mj) - energy0_mj_) * 1e-3;
        }
        NvmlUtilization util{};
        if (n.utilization && n.utilization(n.device, &util) == kNvmlSuccess) {
            s.gpu_util_percent = util.gpu;
            s.mem_util_percent = util.memory;
        }
        if (n.clock_info && n.clock_info(n.device, kNvmlClockSm, &u) == kNvmlSuccess)
            s.sm_clock_mhz = u;
        if (n.temperature && n.temperature(n.device, kNvmlTemperatureGpu, &u) == kNvmlSuccess)
            s.temperature_c = u;
        NvmlMemory mem{};
        if (n.memory_info && n.memory_info(n.device, &mem) == kNvmlSuccess)
            s.gpu_mem_used_bytes = static_cast<double>(mem.used);
        if (n.pcie_throughput && n.pcie_throughput(n.device, kNvmlPcieTxBytes, &u) == kNvmlSuccess)
            s.pcie_tx_bytes_per_s = u * 1e3;
        if (n.pcie_throughput && n.pcie_throughput(n.device, kNvmlPcieRxBytes, &u) == kNvmlSuccess)
            s.pcie_rx_bytes_per_s = u * 1e3;
        if (n.field_values) {
            NvmlFieldValue f[3] = {};
            f[0].fieldId = kFieldPowerInstant;
            f[1].fieldId = kFieldNvlinkTx;
            f[1].scopeId = UINT_MAX;
            f[2].fieldId = kFieldNvlinkRx;
            f[2].scopeId = UINT_MAX;
            if (n.field_values(n.device, 3, f) == kNvmlSuccess) {
                s.power_instant_w = field_value(f[0]) * 1e-3;
                const double tx = field_value(f[1]), rx = field_value(f[2]);
                const double dt = s.t_s - prev_t_;
                if (prev_t_ >= 0 && dt > 0 && prev_nvlink_tx_kib_ >= 0 && !std::isnan(tx))
                    s.nvlink_tx_bytes_per_s = (tx - prev_nvlink_tx_kib_) * 1024.0 / dt;
                if (prev_t_ >= 0 && dt > 0 && prev_nvlink_rx_kib_ >= 0 && !std::isnan(rx))
                    s.nvlink_rx_bytes_per_s = (rx - prev_nvlink_rx_kib_) * 1024.0 / dt;
                prev_nvlink_tx_kib_ = std::isnan(tx) ? -1 : tx;
                prev_nvlink_rx_kib_ = std::isnan(rx) ? -1 : rx;
            }
        }
    }
    prev_t_ = s.t_s;
    prev_cpu_s_ = cpu;
    return s;
}

void TelemetrySampler::start() {
    if (!options_.enabled || thread_.joinable()) return;
    started_at_ = run_clock_seconds();
    TelemetrySample first = take_sample();
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_requested_ = false;
        samples_.push_back(first);
    }
    thread_ = std::thread([this] { run(); });
}

void TelemetrySampler::run() {
    const auto period = std::chrono::milliseconds(options_.interval_ms);
    auto next = std::chrono::steady_clock::now() + period;
    std::unique_lock<std::mutex> lock(mutex_);
    // Deadlines advance by whole periods, so the sampling rate does not drift with sample cost.
    while (!wake_.wait_until(lock, next, [this] { return stop_requested_; })) {
        lock.unlock();
        TelemetrySample s = take_sample();
        lock.lock();
        samples_.push_back(s);
        next += period;
        const auto now = std::chrono::steady_clock::now();
        if (next < now) next = now + period; // fell behind (e.g. starved of CPU): skip, not burst
    }
}

void TelemetrySampler::stop() {
    if (!thread_.joinable()) return;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_requested_ = true;
    }
    wake_.notify_all();
    thread_.join();
    TelemetrySample last = take_sample();
    std::lock_guard<std::mutex> lock(mutex_);
    samples_.push_back(last);
    stopped_at_ = run_clock_seconds();
}

std::vector<TelemetrySample> TelemetrySampler::samples() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return samples_;
}

double TelemetrySampler::energy_joules() const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (samples_.size() < 2) return kNaN;
    return samples_.back().energy_j - samples_.front().energy_j;
}

double TelemetrySampler::energy_joules_between(double t0, double t1) const {
    std::vector<TelemetrySample> s = samples();
    s.erase(std::remove_if(s.begin(), s.end(),
                           [](const TelemetrySample& x) { return std::isnan(x.energy_j); }),
            s.end());
    if (s.size() < 2 || !(t0 <= t1) || t0 < s.front().t_s || t1 > s.back().t_s) return kNaN;
    // Energy counter at time t, linear between the two samples around it.
    auto at = [&](double t) {
        auto hi = std::lower_bound(s.begin(), s.end(), t,
                                   [](const TelemetrySample& x, double v) { return x.t_s < v; });
        if (hi == s.begin()) return hi->energy_j;
        auto lo = hi - 1;
        const double w = hi->t_s > lo->t_s ? (t - lo->t_s) / (hi->t_s - lo->t_s) : 1.0;
        return lo->energy_j + w * (hi->energy_j - lo->energy_j);
    };
    return at(t1) - at(t0);
}

std::vector<TelemetryColumn> TelemetrySampler::columns() {
    return {{"t_s", "s"},
            {"cpu_percent", "percent"},
            {"rss_bytes", "B"},
            {"load1", "1"},
            {"power_w", "W"},
            {"power_instant_w", "W"},
            {"energy_j", "J"},
            {"gpu_util_percent", "percent"},
            {"mem_util_percent", "percent"},
            {"sm_clock_mhz", "MHz"},
            {"temperature_c", "degC"},
            {"gpu_mem_used_bytes", "B"},
            {"pcie_tx_bytes_per_s", "B/s"},
            {"pcie_rx_bytes_per_s", "B/s"},
            {"nvlink_tx_bytes_per_s", "B/s"},
            {"nvlink_rx_bytes_per_s", "B/s"}};
}

std::vector<double> TelemetrySampler::values(const TelemetrySample& s) {
    return {s.t_s,
            s.cpu_percent,
            s.rss_bytes,
            s.load1,
            s.power_w,
            s.power_instant_w,
            s.energy_j,
            s.gpu_util_percent,
            s.mem_util_percent,
            s.sm_clock_mhz,
            s.temperature_c,
            s.gpu_mem_used_bytes,
            s.pcie_tx_bytes_per_s,
            s.pcie_rx_bytes_per_s,
            s.nvlink_tx_bytes_per_s,
            s.nvlink_rx_bytes_per_s};
}

std::vector<TelemetrySample> TelemetrySampler::take_new_samples() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<TelemetrySample> fresh(samples_.begin() + static_cast<std::ptrdiff_t>(taken_),
                                       samples_.end());
    taken_ = samples_.size();
    return fresh;
}

TelemetryStatus TelemetrySampler::status(MPI_Comm comm) const {
    int rank = 0, size = 1;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    const int mine = gpu_available_ ? 1 : 0;
    int all = 0, count = 0, first_bad = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, comm);
    MPI_Allreduce(&mine, &count, 1, MPI_INT, MPI_SUM, comm);
    const int candidate = mine ? size : rank;
    MPI_Allreduce(&candidate, &first_bad, 1, MPI_INT, MPI_MIN, comm);
    TelemetryStatus st;
    st.gpu_available = all == 1;
    st.gpu_available_ranks = count;
    if (first_bad < size)
        st.reason = "rank " + std::to_string(first_bad) + ": " +
                    core::broadcast_string(comm, reason_, first_bad);
    st.interval_ms = options_.interval_ms;
    st.gpu_name = gpu_name_;
    st.nvml_device_match = device_match_;
    return st;
}

} // namespace trainscope::prof
