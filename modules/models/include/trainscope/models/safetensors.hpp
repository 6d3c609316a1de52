// Hugging Face safetensors, read and written by trainscope itself: an 8-byte little-endian header
// length, a JSON header {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
// {string: string}}, then the raw little-endian tensor bytes. Files are memory-mapped; tensors come
// out as zero-copy CPU views of the mapping (kept alive by the tensors) or converted to a dtype.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace trainscope::models {

struct SafetensorsEntry {
    std::string name;
    torch::ScalarType dtype; // F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL
    std::vector<std::int64_t> shape;
    std::uint64_t begin = 0, end = 0; // byte offsets relative to the data section
};

// How the ranks of one node share a checkpoint so that one of them opens its files (issue 39).
// train implements it over MPI (a core::NodeComm); models stays MPI-free. Both calls are
// collective over the node's ranks, which make them in the same order.
class SafetensorsShare {
  public:
    virtual ~SafetensorsShare() = default;
    virtual bool reader() const = 0; // this rank opens and maps the files
    // The reader's `text` on every rank (others pass anything).
    virtual std::string share_text(const std::string& text) = 0;
    // The reader's `bytes` bytes at `data` into `data` on every other rank.
    virtual void share_bytes(void* data, std::size_t bytes) = 0;
};

// One .safetensors file. The constructor validates the whole header: header length within the
// file, valid JSON, known dtypes, offsets inside the data section, end - begin equal to
// numel * element size, no overlaps. Every failure throws core::InputError naming the file, the
// tensor and what is wrong.
class SafetensorsFile {
  public:
    explicit SafetensorsFile(const std::string& path);
    // A file another rank opened: its header (the first header_bytes() bytes, as header() gives
    // them) and size, validated as above; no mapping, so tensor() is refused.
    SafetensorsFile(const std::string& path, const std::string& header, std::uint64_t file_size);
    ~SafetensorsFile();
    SafetensorsFile(const SafetensorsFile&) = delete;
    SafetensorsFile& operator=(const SafetensorsFile&) = delete;

    const std::string& path() const { return path_; }
    const std::vector<SafetensorsEntry>& entries() const { return entries_; }
    const std::map<std::string, std::string>& metadata() const { return metadata_; }
    bool contains(const std::string& name) const;
    const SafetensorsEntry& entry(const std::string& name) const; // throws core::InputError

    // Zero-copy CPU tensor over the mapping (read-only data: clone before writing into it).
    torch::Tensor tensor(const std::string& name) const;
    std::string header() const; // the 8-byte length and the JSON header, as stored
    std::uint64_t file_size() const { return file_size_; }

  private:
    struct Mapping;
    std::string path_;
    std::shared_ptr<Mapping> mapping_;
    std::vector<SafetensorsEntry> entries_;
    std::map<std::string, std::size_t> index_;
    std::map<std::string, std::string> metadata_;
    std::uint64_t header_bytes_ = 0; // 8 + header length: where the data section starts
    std::uint64_t file_size_ = 0;
    void set_header(const unsigned char* bytes, std::uint64_t size);
};

// A checkpoint: a directory with model.safetensors, or with model.safetensors.index.json
// ({"weight_map": {name: shard file}}) and its shards; or a single .safetensors file.
// With a share, only its reader opens the files (the index, each shard once) and validates them;
// its verdict reaches every rank first (a missing or corrupt file is the same InputError on
// each), then the headers; tensor() becomes collective over the share: the reader's bytes are
// broadcast one tensor at a time, so no rank holds more than one tensor beyond what it loads.
class SafetensorsCheckpoint {
  public:
    explicit SafetensorsCheckpoint(const std::string& path,
                                   std::shared_ptr<SafetensorsShare> share = nullptr);
    std::vector<std::string> names() const; // sorted
    bool contains(const std::string& name) const;
    const SafetensorsEntry& entry(const std::string& name) const;
    std::string file_of(const std::string& name) const;
    // A zero-copy view, as SafetensorsFile; with a share, collective and a copy except on the
    // reader.
    torch::Tensor tensor(const std::string& name) const;

  private:
    void open(const std::string& path); // this rank reads the files
    std::shared_ptr<SafetensorsShare> share_;
    std::vector<std::unique_ptr<SafetensorsFile>> files_;
    std::map<std::string, std::size_t> where_; // tensor -> index in files_
};

// Writes tensors (any device; contiguous copies are made on CPU) in the given order with 8-byte
// aligned offsets, and the metadata. Replaces `path` atomically (write to path.tmp, rename).
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// "F32" <-> torch::kFloat32 etc.; throws core::InputError for unknown names / unsupported dtypes.
torch::ScalarType safetensors_dtype(const std::string& name);
std::string safetensors_dtype_name(torch::ScalarType dtype);

} // namespace trainscope::models
