// safetensors reader (mmap, validated header) and writer (aligned header, atomic rename).
#include "trainscope/models/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "trainscope/core/error.hpp"
#include "trainscope/core/text.hpp"
#include "trainscope/models/safetensors_header.hpp"

namespace trainscope::models {

namespace fs = std::filesystem;
using json = nlohmann::json;

torch::ScalarType safetensors_dtype(const std::string& name) {
    if (name == "F64") return torch::kFloat64;
    if (name == "F32") return torch::kFloat32;
    if (name == "F16") return torch::kFloat16;
    if (name == "BF16") return torch::kBFloat16;
    if (name == "I64") return torch::kInt64;
    if (name == "I32") return torch::kInt32;
    if (name == "I16") return torch::kInt16;
    if (name == "I8") return torch::kInt8;
    if (name == "U8") return torch::kUInt8;
    if (name == "BOOL") return torch::kBool;
    throw core::InputError("safetensors dtype '" + name +
                           "' is not supported (F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL)");
}

std::string safetensors_dtype_name(torch::ScalarType dtype) {
    switch (dtype) {
    case torch::kFloat64:
        return "F64";
    case torch::kFloat32:
        return "F32";
    case torch::kFloat16:
        return "F16";
    case torch::kBFloat16:
        return "BF16";
    case torch::kInt64:
        return "I64";
    case torch::kInt32:
        return "I32";
    case torch::kInt16:
        return "I16";
    case torch::kInt8:
        return "I8";
    case torch::kUInt8:
        return "U8";
    case torch::kBool:
        return "BOOL";
    default:
        throw core::InputError(std::string("dtype ") + c10::toString(dtype) +
                               " cannot be stored in safetensors");
    }
}

struct SafetensorsFile::Mapping {
    void* base = nullptr;
    std::size_t size = 0;
    ~Mapping() {
        if (base && base != MAP_FAILED) ::munmap(base, size);
    }
};

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
    // open() of a FIFO blocks until a writer comes, and a device has no size to map: refused
    // before opening (O_NONBLOCK as well, should one appear between the check and the open).
    if (fs::exists(fs::symlink_status(path)) && !fs::is_regular_file(path))
        safetensors_error(path, "is " + core::file_kind(path) +
                                    ", not a regular file: a checkpoint shard must be a "
                                    ".safetensors file");
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK);
    if (fd < 0) safetensors_error(path, std::string("cannot open: ") + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        ::close(fd);
        safetensors_error(path, std::string("cannot stat: ") + std::strerror(errno));
    }
    const auto size = static_cast<std::uint64_t>(st.st_size);
    mapping_ = std::make_shared<Mapping>();
    mapping_->size = static_cast<std::size_t>(size);
    // An empty file cannot be mapped; the header parser rejects it (and any file under 8 bytes).
    if (size > 0) mapping_->base = ::mmap(nullptr, mapping_->size, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (mapping_->base == MAP_FAILED)
        safetensors_error(path, std::string("mmap failed: ") + std::strerror(errno));
    set_header(static_cast<const unsigned char*>(mapping_->base), size);
}

SafetensorsFile::SafetensorsFile(const std::string& path, const std::string& header,
                                 std::uint64_t file_size)
    : path_(path) {
    // The parser reads the 8-byte length and the JSON only, and checks offsets against the size.
    if (header.size() > file_size)
        safetensors_error(path, "header of " + std::to_string(header.size()) +
                                    " bytes in a file of " + std::to_string(file_size));
    set_header(reinterpret_cast<const unsigned char*>(header.data()), file_size);
}

void SafetensorsFile::set_header(const unsigned char* bytes, std::uint64_t size) {
    file_size_ = size;
    SafetensorsHeader header = parse_safetensors_header(bytes, size, path_);
    for (auto& h : header.entries) {
        index_[h.name] = entries_.size();
        entries_.push_back(
            {h.name, safetensors_dtype(h.dtype), std::move(h.shape), h.begin, h.end});
    }
    metadata_ = std::move(header.metadata);
    header_bytes_ = header.header_bytes;
}

SafetensorsFile::~SafetensorsFile() = default;

bool SafetensorsFile::contains(const std::string& name) const {
    return index_.count(name) != 0;
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
    auto it = index_.find(name);
    if (it == index_.end()) safetensors_error(path_, "no tensor named '" + name + "'");
    return entries_[it->second];
}

std::string SafetensorsFile::header() const {
    if (!mapping_ || !mapping_->base) return {};
    return std::string(static_cast<const char*>(mapping_->base), header_bytes_);
}

torch::Tensor SafetensorsFile::tensor(const std::string& name) const {
    const SafetensorsEntry& e = entry(name);
    if (!mapping_)
        throw core::InternalError("safetensors file '" + path_ +
                                  "': its data are on the rank that opened it (tensor() there)");
    auto* data = static_cast<char*>(mapping_->base) + header_bytes_ + e.begin;
    auto keep = mapping_; // the tensor keeps the mapping alive
    return torch::from_blob(
        data, e.shape, [keep](void*) {}, torch::TensorOptions().dtype(e.dtype));
}

namespace {

// The headers of a checkpoint's files as one string: per file, "<path length> <path><size>
// <header length> <header>", lengths in decimal.
void put_field(std::string& out, const std::string& field) {
    out += std::to_string(field.size()) + " " + field;
}
std::string take_field(const std::string& in, std::size_t& at) {
    const std::size_t space = in.find(' ', at);
    const std::size_t n = std::stoull(in.substr(at, space - at));
    std::string field = in.substr(space + 1, n);
    at = space + 1 + n;
    return field;
}

} // namespace

SafetensorsCheckpoint::SafetensorsCheckpoint(const std::string& path,
                                             std::shared_ptr<SafetensorsShare> share)
    : share_(std::move(share)) {
    if (!share_) {
        open(path);
        return;
    }
    // The reader's verdict first ("1" + the headers, or "0" + its error), so that every rank
    // fails alike or goes on to the same headers.
    std::string verdict;
    std::exception_ptr error;
    if (share_->reader()) {
        try {
            open(path);
            verdict = "1";
            for (const auto& f : files_) {
                put_field(verdict, f->path());
                put_field(verdict, std::to_string(f->file_size()));
                put_field(verdict, f->header());
            }
        } catch (const std::exception& e) {
            error = std::current_exception();
            verdict = "0" + std::string(e.what());
        }
    }
    verdict = share_->share_text(verdict);
    if (error) std::rethrow_exception(error);
    if (verdict.empty() || verdict[0] != '1') throw core::InputError(verdict.substr(1));
    if (share_->reader()) return;
    for (std::size_t at = 1; at < verdict.size();) {
        const std::string file = take_field(verdict, at);
        const std::uint64_t size = std::stoull(take_field(verdict, at));
        files_.push_back(std::make_unique<SafetensorsFile>(file, take_field(verdict, at), size));
        for (const auto& e : files_.back()->entries())
            where_[e.name] = files_.size() - 1;
    }
}

void SafetensorsCheckpoint::open(const std::string& path) {
    const fs::path p(path);
    std::vector<std::string> files;
    if (fs::is_directory(p)) {
        const fs::path index = p / "model.safetensors.index.json";
        if (fs::exists(index)) {
            json j;
            try {
                std::ifstream in(index);
                j = json::parse(in);
            } catch (const json::exception& e) {
                throw core::InputError("'" + index.string() + "' is not valid JSON: " + e.what());
            }
            if (!j.contains("weight_map") || !j["weight_map"].is_object())
                throw core::InputError("'" + index.string() + "' has no weight_map object");
            std::map<std::string, std::size_t> shard_index;
            for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
                const std::string shard = it->get<std::string>();
                if (!shard_index.count(shard)) {
                    shard_index[shard] = files.size();
                    files.push_back((p / shard).string());
                }
            }
        } else if (fs::exists(p / "model.safetensors")) {
            files.push_back((p / "model.safetensors").string());
        } else {
            throw core::InputError("'" + path +
                                   "' has neither model.safetensors nor "
                                   "model.safetensors.index.json");
        }
    } else {
        files.push_back(path);
    }
    for (const auto& f : files) {
        if (!fs::exists(f)) throw core::InputError("safetensors shard '" + f + "' is missing");
        files_.push_back(std::make_unique<SafetensorsFile>(f));
        for (const auto& e : files_.back()->entries()) {
            if (where_.count(e.name))
                throw core::InputError("tensor '" + e.name + "' appears in two shards ('" +
                                       files_[where_[e.name]]->path() + "' and '" + f + "')");
            where_[e.name] = files_.size() - 1;
        }
    }
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
    std::vector<std::string> out;
    for (const auto& [n, i] : where_)
        out.push_back(n);
    return out;
}

bool SafetensorsCheckpoint::contains(const std::string& name) const {
    return where_.count(name) != 0;
}

const SafetensorsEntry& SafetensorsCheckpoint::entry(const std::string& name) const {
    auto it = where_.find(name);
    if (it == where_.end())
        throw core::InputError("the checkpoint has no tensor named '" + name + "'");
    return files_[it->second]->entry(name);
}

std::string SafetensorsCheckpoint::file_of(const std::string& name) const {
    entry(name);
    return files_[where_.at(name)]->path();
}

torch::Tensor SafetensorsCheckpoint::tensor(const std::string& name) const {
    const SafetensorsEntry& e = entry(name);
    const SafetensorsFile& file = *files_[where_.at(name)];
    if (!share_) return file.tensor(name);
    torch::Tensor t = share_->reader()
                          ? file.tensor(name)
                          : torch::empty(e.shape, torch::TensorOptions().dtype(e.dtype));
    share_->share_bytes(t.data_ptr(), static_cast<std::size_t>(e.end - e.begin));
    return t;
}

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
    json header = json::object();
    if (!metadata.empty()) header["__metadata__"] = metadata;
    std::vector<torch::Tensor> host;
    std::uint64_t offset = 0;
    for (const auto& [name, t] : tensors) {
        torch::Tensor c = t.detach().to(torch::kCPU).contiguous();
        const std::uint64_t n = static_cast<std::uint64_t>(c.nbytes());
        header[name] = {{"dtype", safetensors_dtype_name(c.scalar_type())},
                        {"shape", c.sizes().vec()},
                        {"data_offsets", {offset, offset + n}}};
        offset += n;
        host.push_back(c);
    }
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' '); // data section 8-byte aligned
    const std::string tmp = path + ".tmp";
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        if (!out) throw core::OutputError("cannot write '" + tmp + "': " + std::strerror(errno));
        const std::uint64_t n = text.size();
        char len[8];
        for (int i = 0; i < 8; ++i)
            len[i] = static_cast<char>((n >> (8 * i)) & 0xff);
        out.write(len, 8);
        out.write(text.data(), static_cast<std::streamsize>(text.size()));
        for (const auto& c : host)
            out.write(static_cast<const char*>(c.data_ptr()),
                      static_cast<std::streamsize>(c.nbytes()));
        if (!out) throw core::OutputError("writing '" + tmp + "' failed (disk full?)");
    }
    std::error_code ec;
    fs::rename(tmp, path, ec);
    if (ec)
        throw core::OutputError("cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
}

} // namespace trainscope::models
