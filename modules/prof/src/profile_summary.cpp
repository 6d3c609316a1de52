// Summary of a profiler window: per-category statistics, top-N operators and kernels with
// self time from per-thread nesting and HTA's temporal breakdown by a sweep over device intervals.
// No LibTorch here, so it is tested with synthetic events.
#include "trainscope/prof/profile_summary.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <tuple>
#include <utility>

namespace trainscope::prof {

namespace {

constexpr double kNsPerS = 1e9;

double seconds(std::int64_t ns) {
    return static_cast<double>(ns) / kNsPerS;
}

void add(std::map<std::string, CategoryStats>& categories, const std::string& name, double s) {
    CategoryStats& c = categories[name];
    if (c.count == 0) {
        c.name = name;
        c.min_s = s;
        c.max_s = s;
    }
    ++c.count;
    c.total_s += s;
    c.min_s = std::min(c.min_s, s);
    c.max_s = std::max(c.max_s, s);
}

bool contains(const std::string& text, const char* part) {
    return text.find(part) != std::string::npos;
}

std::string memcpy_category(const std::string& name) {
    if (contains(name, "HtoD")) return "memcpy_htod";
    if (contains(name, "DtoH")) return "memcpy_dtoh";
    if (contains(name, "DtoD")) return "memcpy_dtod";
    return "memcpy_other"; // PtoP, HtoH, ...
}

std::vector<TopEntry> top(std::map<std::string, TopEntry>& by_name, std::size_t n) {
    std::vector<TopEntry> rows;
    rows.reserve(by_name.size());
    for (auto& [name, row] : by_name)
        rows.push_back(std::move(row));
    // Ties broken by name so every run orders equal rows the same way.
    std::sort(rows.begin(), rows.end(), [](const TopEntry& a, const TopEntry& b) {
        return std::tie(b.total_s, a.name) < std::tie(a.total_s, b.name);
    });
    if (rows.size() > n) rows.resize(n);
    return rows;
}

} // namespace

KernelClass classify_kernel(const std::string& name) {
    if (name.rfind("nccl", 0) == 0 || contains(name, "ncclKernel") ||
        contains(name, "ncclDevKernel"))
        return KernelClass::Communication;
    if (contains(name, "Memcpy") || contains(name, "Memset") || contains(name, "dma"))
        return KernelClass::Memory;
    return KernelClass::Compute;
}

TemporalBreakdown temporal_breakdown(const std::vector<ProfileEvent>& events) {
    TemporalBreakdown b;
    // Boundaries of device intervals: (time, +1/-1, class). Ends sort before starts at equal
    // times; the order within one timestamp does not change any measured segment.
    std::vector<std::tuple<std::int64_t, int, KernelClass>> edges;
    for (const auto& e : events) {
        KernelClass cls;
        if (e.kind == EventKind::Kernel) {
            ++b.gpu_kernels;
            cls = classify_kernel(e.name);
        } else if (e.kind == EventKind::Memcpy || e.kind == EventKind::Memset) {
            cls = KernelClass::Memory;
        } else {
            continue;
        }
        ++b.gpu_events;
        edges.emplace_back(e.start_ns, +1, cls);
        edges.emplace_back(e.end_ns, -1, cls);
    }
    if (edges.empty()) return b; // CPU run: NaN, never invented numbers
    std::sort(edges.begin(), edges.end(), [](const auto& x, const auto& y) {
        return std::tie(std::get<0>(x), std::get<1>(x)) < std::tie(std::get<0>(y), std::get<1>(y));
    });

    std::int64_t active[3] = {0, 0, 0}; // by KernelClass
    std::int64_t compute = 0, comm = 0, memory = 0, idle = 0, comm_any = 0, overlap = 0;
    std::int64_t previous = std::get<0>(edges.front());
    for (const auto& [t, delta, cls] : edges) {
        const std::int64_t len = t - previous;
        const bool comp_on = active[int(KernelClass::Compute)] > 0;
        const bool comm_on = active[int(KernelClass::Communication)] > 0;
        const bool mem_on = active[int(KernelClass::Memory)] > 0;
        if (comp_on)
            compute += len;
        else if (comm_on)
            comm += len;
        else if (mem_on)
            memory += len;
        else
            idle += len;
        if (comm_on) {
            comm_any += len;
            if (comp_on) overlap += len;
        }
        active[int(cls)] += delta;
        previous = t;
    }
    const std::int64_t span = std::get<0>(edges.back()) - std::get<0>(edges.front());
    b.compute_s = seconds(compute);
    b.communication_s = seconds(comm);
    b.memory_s = seconds(memory);
    b.idle_s = seconds(idle);
    b.span_s = seconds(span);
    b.overlap_ratio = comm_any > 0 ? static_cast<double>(overlap) / comm_any : kNaN;
    return b;
}

bool is_host_synchronising_call(const std::string& name) {
    static const std::set<std::string> kBlocking = {"cudaDeviceSynchronize",
                                                    "cudaStreamSynchronize",
                                                    "cudaEventSynchronize",
                                                    "cudaMemcpy",
                                                    "cudaMemcpy2D",
                                                    "cudaMemcpy3D",
                                                    "cudaMemcpyToSymbol",
                                                    "cudaMemcpyFromSymbol",
                                                    "cudaMemset",
                                                    "cudaMemset2D",
                                                    "cudaMemset3D"};
    // Kineto may append the API version ("cudaStreamSynchronize_v2..." is not used today, but
    // "_ptsz"/"_ptds" per-thread default-stream variants are).
    std::string base = name;
    for (const char* suffix : {"_ptsz", "_ptds"})
        if (base.size() > std::strlen(suffix) &&
            base.compare(base.size() - std::strlen(suffix), std::string::npos, suffix) == 0)
            base.erase(base.size() - std::strlen(suffix));
    return kBlocking.count(base) > 0;
}

ProfileSummary summarise_events(const std::vector<ProfileEvent>& events, std::size_t top_n) {
    ProfileSummary s;
    std::map<std::string, CategoryStats> categories;
    std::map<std::string, TopEntry> ops, kernels;
    std::map<std::uint64_t, std::vector<const ProfileEvent*>> cpu_ops_by_thread;

    for (const auto& e : events) {
        const double d = seconds(e.end_ns - e.start_ns);
        switch (e.kind) {
        case EventKind::CpuOp:
            add(categories, "cpu_op", d);
            cpu_ops_by_thread[e.thread].push_back(&e);
            break;
        case EventKind::ProfilerStep:
            add(categories, "profiler_step", d);
            break;
        case EventKind::UserAnnotation:
            add(categories, "user_annotation", d);
            break;
        case EventKind::Kernel: {
            const bool nccl = classify_kernel(e.name) == KernelClass::Communication;
            add(categories, nccl ? "nccl_kernel" : "gpu_kernel", d);
            TopEntry& k = kernels[e.name];
            k.name = e.name;
            ++k.count;
            k.total_s += d;
            break;
        }
        case EventKind::Memcpy:
            add(categories, memcpy_category(e.name), d);
            break;
        case EventKind::Memset:
            add(categories, "memset", d);
            break;
        case EventKind::CudaRuntime:
            add(categories, "cuda_runtime:" + e.name, d);
            if (is_host_synchronising_call(e.name)) ++s.host_sync_calls;
            break;
        case EventKind::CudaDriver:
            add(categories, "cuda_driver:" + e.name, d);
            break;
        case EventKind::CudaSync:
            add(categories, "cuda_sync", d);
            break;
        case EventKind::Other:
            break;
        }
    }

    // Operators nest (aten::conv2d > aten::convolution > aten::_convolution > ...) on one thread:
    // a sweep with a stack of open operators gives each one its direct children's time (for self
    // time) and finds the top-level operators, whose durations never overlap on a thread.
    for (auto& [thread, list] : cpu_ops_by_thread) {
        std::sort(list.begin(), list.end(), [](const ProfileEvent* a, const ProfileEvent* b) {
            return a->start_ns != b->start_ns ? a->start_ns < b->start_ns : a->end_ns > b->end_ns;
        });
        std::vector<std::int64_t> children_ns(list.size(), 0);
        std::vector<std::size_t> open; // indexes into list
        for (std::size_t i = 0; i < list.size(); ++i) {
            const ProfileEvent& e = *list[i];
            while (!open.empty() && list[open.back()]->end_ns <= e.start_ns)
                open.pop_back();
            const std::int64_t ns = e.end_ns - e.start_ns;
            if (open.empty())
                add(categories, "cpu_op_top_level", seconds(ns));
            else
                children_ns[open.back()] += ns;
            open.push_back(i);
        }
        for (std::size_t i = 0; i < list.size(); ++i) {
            const ProfileEvent& e = *list[i];
            TopEntry& op = ops[e.name];
            if (op.count == 0) {
                op.name = e.name;
                op.self_s = 0;
            }
            ++op.count;
            op.total_s += seconds(e.end_ns - e.start_ns);
            op.self_s += seconds(std::max<std::int64_t>(e.end_ns - e.start_ns - children_ns[i], 0));
        }
    }

    for (auto& [name, c] : categories)
        s.categories.push_back(std::move(c));
    s.top_ops = top(ops, top_n);
    s.top_kernels = top(kernels, top_n);
    s.breakdown = temporal_breakdown(events);
    return s;
}

std::string trace_path_for(const std::string& run_file_path, int rank) {
    const std::filesystem::path p(run_file_path);
    const std::string name = p.stem().string() + ".rank" + std::to_string(rank) + ".trace.json";
    return (p.parent_path() / name).string();
}

} // namespace trainscope::prof
