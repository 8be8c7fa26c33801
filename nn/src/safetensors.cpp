// The safetensors byte layout (see nn/checkpoint.hpp): the 8-byte header length, the JSON header
// (safetensors_header.cpp), and the data section, which the tensors tile exactly. Files are read
// by offset (the header length first, checked against the file's size), and written atomically.
#include <algorithm>
#include <bit>
#include <cstring>
#include <set>
#include <utility>
#include <vector>

#include "atomic_file.hpp"
#include "safetensors.hpp"

namespace nn {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; headgrad's reader and writer assume a little-endian host");

namespace {

using detail::TensorEntry;

constexpr std::uint64_t kMaxHeaderBytes = std::uint64_t{100} << 20;

[[noreturn]] void fail_file(std::string_view source, const std::string& message) {
  throw CheckpointError(fmt::format("{}: {}", source, message));
}

// A whole file's bytes in memory, read like a detail::RegularFile.
class MemoryBytes {
 public:
  explicit MemoryBytes(std::string_view bytes) : bytes_(bytes) {}
  std::uint64_t size() const { return bytes_.size(); }
  void read(std::uint64_t offset, void* out, std::size_t n) const {
    if (n > 0) std::memcpy(out, bytes_.data() + offset, n);
  }

 private:
  std::string_view bytes_;
};

// The header's length (the first 8 bytes, little-endian), checked against the file's size
// before any more of the file is read.
template <class Source>
std::uint64_t read_header_length(const Source& file, std::string_view source) {
  if (file.size() < 8)
    fail_file(source, fmt::format("file is {} bytes, too short for the 8-byte header length (truncated?)", file.size()));
  unsigned char prefix[8];
  file.read(0, prefix, sizeof prefix);
  std::uint64_t n = 0;
  for (int b = 7; b >= 0; --b) n = (n << 8) | prefix[b];
  const std::uint64_t available = file.size() - 8;
  if (n > available)
    fail_file(source, fmt::format("header length {} is more than the {} bytes after it: the file is truncated or corrupt",
                                  n, available));
  if (n > kMaxHeaderBytes) fail_file(source, fmt::format("header length {} is over 100 MB: corrupt", n));
  return n;
}

// Sorts the entries by their offsets and checks that they tile the data section exactly: no
// gap, no overlap, no byte left over.
void check_tiling(std::vector<TensorEntry>& entries, std::uint64_t data_size, std::string_view source) {
  std::sort(entries.begin(), entries.end(), [](const TensorEntry& a, const TensorEntry& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    return a.end != b.end ? a.end < b.end : a.name < b.name;
  });
  std::uint64_t cursor = 0;
  for (const auto& e : entries) {
    if (e.begin < cursor)
      fail_file(source, fmt::format("corrupt header: tensor {} at bytes [{}, {}] overlaps the tensor before it",
                                    quote_name(e.name), e.begin, e.end));
    if (e.begin > cursor)
      fail_file(source, fmt::format("corrupt header: {} bytes of data before tensor {} belong to no tensor",
                                    e.begin - cursor, quote_name(e.name)));
    cursor = e.end;
  }
  if (cursor > data_size)
    fail_file(source, fmt::format("the tensors need {} bytes of data but the file has {} after the header: the file is "
                                  "truncated", cursor, data_size));
  if (cursor < data_size)
    fail_file(source, fmt::format("{} bytes of data after the last tensor belong to no tensor: the file is corrupt",
                                  data_size - cursor));
}

// Reads and checks a file's length prefix, header and layout; the data section starts at 8 + n.
template <class Source>
detail::Header read_checked_header(const Source& file, std::string_view source, std::uint64_t& n) {
  n = read_header_length(file, source);
  std::string text(static_cast<std::size_t>(n), '\0');
  file.read(8, text.data(), text.size());
  detail::Header header = detail::parse_header(text, source);
  check_tiling(header.entries, file.size() - 8 - n, source);
  return header;
}

// Reads and checks a whole file: length, header, layout, then the tensors' bytes (only once
// everything before them is known to be right).
template <class Source>
SafetensorsData read_safetensors(const Source& file, std::string_view source) {
  std::uint64_t n = 0;
  detail::Header header = read_checked_header(file, source, n);
  const std::uint64_t data_start = 8 + n;
  SafetensorsData out;
  out.metadata = std::move(header.metadata);
  for (auto& e : header.entries) {
    ag::Tensor t = ag::Tensor::empty(e.shape, e.dtype);
    file.read(data_start + e.begin, t.raw_data(), static_cast<std::size_t>(e.end - e.begin));
    out.tensors.emplace_back(std::move(e.name), std::move(t));
  }
  return out;
}

// Everything that would make a file no reader accepts, before a byte is written: every name and
// metadata string is JSON text in the header, so valid UTF-8.
void check_for_saving(std::string_view op, const NamedTensors& tensors, const Metadata& metadata) {
  std::set<std::string_view> names;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__") throw CheckpointError(fmt::format("{}: '__metadata__' is reserved, not a tensor name", op));
    detail::check_utf8(op, "tensor name", name);
    if (!t.defined()) throw CheckpointError(fmt::format("{}: tensor {} is undefined", op, quote_name(name)));
    if (!names.insert(name).second)
      throw CheckpointError(fmt::format("{}: tensor name {} appears twice", op, quote_name(name)));
  }
  for (const auto& [key, value] : metadata) {
    detail::check_utf8(op, "metadata key", key);
    detail::check_utf8(op, fmt::format("metadata {}: its value", quote_name(key)), value);
  }
}

std::uint64_t byte_size(const ag::Tensor& t) { return static_cast<std::uint64_t>(t.numel()) * ag::dtype_size(t.dtype()); }

// The order Python's safetensors writes tensors in: larger dtype first, then by name.
std::vector<std::size_t> python_order(const NamedTensors& tensors) {
  std::vector<std::size_t> order(tensors.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const auto sa = ag::dtype_size(tensors[a].second.dtype()), sb = ag::dtype_size(tensors[b].second.dtype());
    if (sa != sb) return sa > sb;
    return tensors[a].first < tensors[b].first;
  });
  return order;
}

}  // namespace

namespace detail {

void check_utf8(std::string_view op, std::string_view what, std::string_view text) {
  const std::size_t at = invalid_utf8_at(text);
  if (at == std::string_view::npos) return;
  throw CheckpointError(fmt::format("{}: {} {} is not valid UTF-8 (byte 0x{:02x} at position {}): a safetensors file "
                                    "holds names and metadata as JSON text, which is UTF-8",
                                    op, what, quote_name(text), static_cast<unsigned char>(text[at]), at));
}

Header read_header(const std::string& path) {
  std::uint64_t n = 0;
  return read_checked_header(RegularFile(path), path, n);
}

std::string serialize(std::string_view op, const NamedTensors& tensors, const Metadata& metadata) {
  check_for_saving(op, tensors, metadata);
  const std::vector<std::size_t> order = python_order(tensors);
  std::vector<TensorEntry> entries;
  std::uint64_t offset = 0;
  for (const std::size_t i : order) {
    const auto& [name, t] = tensors[i];
    entries.push_back({name, t.dtype(), t.shape(), offset, offset + byte_size(t)});
    offset = entries.back().end;
  }
  std::string header = detail::format_header(entries, metadata);
  header.append((8 - header.size() % 8) % 8, ' ');

  std::string out;
  out.reserve(8 + header.size() + offset);
  const std::uint64_t n = header.size();
  for (int b = 0; b < 8; ++b) out += static_cast<char>((n >> (8 * b)) & 0xFF);
  out += header;
  for (const std::size_t i : order) {
    const ag::Tensor& t = tensors[i].second;
    out.append(static_cast<const char*>(t.raw_data()), static_cast<std::size_t>(byte_size(t)));
  }
  return out;
}

void write_safetensors(std::string_view op, const std::string& path, const NamedTensors& tensors,
                       const Metadata& metadata) {
  write_file_atomically(path, serialize(op, tensors, metadata));
}

}  // namespace detail

std::string serialize_safetensors(const NamedTensors& tensors, const Metadata& metadata) {
  return detail::serialize("serialize_safetensors", tensors, metadata);
}

SafetensorsData parse_safetensors(std::string_view bytes, std::string_view source) {
  return read_safetensors(MemoryBytes(bytes), source);
}

void save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata) {
  detail::write_safetensors("save_safetensors", path, tensors, metadata);
}

SafetensorsData load_safetensors(const std::string& path) { return read_safetensors(detail::RegularFile(path), path); }

}  // namespace nn
