// Summary of a profiler window: per-category statistics, top-N operators and kernels with
// self time from per-thread nesting, HTA's temporal breakdown by a sweep over device intervals,
// and the collective /profile writer. No LibTorch here, so it is tested with synthetic events.
#include "trainscope/prof/profile_summary.hpp"

#include <algorithm>
#include <filesystem>
#include <map>
#include <tuple>
#include <utility>

#include "trainscope/io/run_file.hpp"

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

std::string json_string(const std::string& text) {
    std::string out = "\"";
    for (char c : text) {
        if (c == '"' || c == '\\') out += '\\';
        out += c;
    }
    return out + "\"";
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

void write_profile(io::RunFile& file, const ProfileOptions& options, const ProfileSummary& mine,
                   int world_size) {
    if (!options.enabled) {
        file.set_attributes("/profile", {{"enabled", std::int64_t{0}}});
        return;
    }
    // Attributes carry rank 0's values; ranks run the same iterations, so status agrees (the
    // per-rank `iterations` dataset shows it if not).
    std::string traces = "[";
    if (options.trace && mine.status != "not_reached")
        for (int r = 0; r < world_size; ++r)
            traces += (r ? ", " : "") + json_string(trace_path_for(file.path(), r));
    traces += "]";
    file.set_attributes(
        "/profile",
        {{"enabled", std::int64_t{1}},
         {"start_iter", options.start_iter},
         {"iters", options.iters},
         {"top_n", options.top_n},
         {"trace", std::int64_t{options.trace ? 1 : 0}},
         {"status", mine.status},
         {"first_iteration", mine.first_iteration},
         {"trace_files", traces},
         {"threads", std::string("operators of the thread that runs the training loop (and "
                                 "autograd's device threads); data-loader workers are not "
                                 "profiled")}});
    file.write_per_rank("/profile/window_s", mine.window_s, "s");
    file.write_per_rank("/profile/iterations", static_cast<double>(mine.iterations), "iterations");

    auto write_table = [&](const std::string& group, const auto& rows, bool with_self,
                           bool with_min_max) {
        std::vector<std::string> names;
        std::vector<double> count, total, self, min, max;
        for (const auto& row : rows) {
            names.push_back(row.name);
            count.push_back(static_cast<double>(row.count));
            total.push_back(row.total_s);
            if constexpr (requires { row.self_s; }) self.push_back(row.self_s);
            if constexpr (requires { row.min_s; }) {
                min.push_back(row.min_s);
                max.push_back(row.max_s);
            }
        }
        file.write_ragged_strings(group + "/name", names);
        file.write_ragged(group + "/count", count, "events");
        file.write_ragged(group + "/total_s", total, "s");
        if (with_self) file.write_ragged(group + "/self_s", self, "s");
        if (with_min_max) {
            file.write_ragged(group + "/min_s", min, "s");
            file.write_ragged(group + "/max_s", max, "s");
        }
    };
    write_table("/profile/categories", mine.categories, false, true);
    write_table("/profile/top_ops", mine.top_ops, true, false);
    write_table("/profile/top_kernels", mine.top_kernels, false, false);

    const TemporalBreakdown& b = mine.breakdown;
    file.write_per_rank("/profile/breakdown/gpu_kernels", static_cast<double>(b.gpu_kernels),
                        "kernels");
    file.write_per_rank("/profile/breakdown/compute_s", b.compute_s, "s");
    file.write_per_rank("/profile/breakdown/communication_s", b.communication_s, "s");
    file.write_per_rank("/profile/breakdown/memory_s", b.memory_s, "s");
    file.write_per_rank("/profile/breakdown/idle_s", b.idle_s, "s");
    file.write_per_rank("/profile/breakdown/span_s", b.span_s, "s");
    file.write_per_rank("/profile/breakdown/overlap_ratio", b.overlap_ratio, "1");
    file.set_attributes(
        "/profile/breakdown",
        {{"gpu_kernels", b.gpu_kernels}, // rank 0's; per rank in the dataset gpu_kernels
         {"definition",
          std::string("Holistic Trace Analysis temporal breakdown over the device intervals of the "
                      "window: compute + communication + memory + idle = span; NaN when a rank "
                      "has no GPU kernels (CPU runs)")}});
}

} // namespace trainscope::prof
