#pragma once
// POSIX file access for checkpoints: replacing a file atomically, and reading a regular file by
// offset. Every error is an nn::CheckpointError that starts with the path.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace nn::detail {

// Replaces the file at `path` with `bytes` so that a crash at any moment leaves either the old
// file or the new one, never a mix: the bytes go to a temporary file in the same directory (a
// short name, ".headgrad-<16 hex digits>.tmp", so that any file name that fits the directory
// fits), which is flushed to disk and renamed over the target; then the directory is flushed.
// An existing target keeps its permission bits.
// A symbolic link is written through, as PyTorch and most tools do: the link stays and the file
// it points to (followed through chains of links) is replaced, atomically, in its own directory.
// A target that exists but is not a regular file (a directory, a device, a FIFO, a socket) is
// refused; nothing is written.
void write_file_atomically(const std::string& path, std::string_view bytes);

// A regular file open for reading. The constructor refuses anything else (a directory, a device
// such as /dev/zero, a FIFO, a socket) before reading a byte, and never blocks on it.
class RegularFile {
 public:
  explicit RegularFile(const std::string& path);
  ~RegularFile();
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;

  const std::string& path() const { return path_; }
  // The size when it was opened.
  std::uint64_t size() const { return size_; }
  // Reads exactly n bytes from `offset` into `out`; throws if the file ends first.
  void read(std::uint64_t offset, void* out, std::size_t n) const;

 private:
  std::string path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

}  // namespace nn::detail
