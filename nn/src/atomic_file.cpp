#include "atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <functional>
#include <random>
#include <system_error>
#include <utility>

#include "nn/checkpoint.hpp"

namespace nn::detail {

namespace {

namespace fs = std::filesystem;

// The text of the current errno (std::strerror's, but safe to call from several threads).
std::string errno_text() { return std::generic_category().message(errno); }

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "a special file";
}

std::function<void(std::size_t)>& save_hook() {
  static std::function<void(std::size_t)> hook;
  return hook;
}

// Where a save to `path` goes: `path` itself or, when it is a symbolic link, the file at the end
// of the chain of links (a relative link is read against the directory of the link).
fs::path follow_links(const std::string& path) {
  constexpr int kMaxLinks = 40;  // Linux's own limit for one path lookup
  fs::path p(path);
  for (int hops = 0; hops <= kMaxLinks; ++hops) {
    std::error_code ec;
    if (!fs::is_symlink(fs::symlink_status(p, ec))) return p;
    const fs::path link = fs::read_symlink(p, ec);
    if (ec) throw CheckpointError(fmt::format("{}: cannot read the symbolic link {}: {}", path, p.string(), ec.message()));
    p = link.is_absolute() ? link : p.parent_path() / link;
  }
  throw CheckpointError(fmt::format("{}: more than {} symbolic links in a row (a loop?)", path, kMaxLinks));
}

// "path" or, when a link led elsewhere, "path (a link to target)".
std::string describe(const std::string& path, const fs::path& target) {
  return target == fs::path(path) ? path : fmt::format("{} (a link to {})", path, target.string());
}

// Creates a new file under a short random name in `dir`; returns its descriptor and name.
std::pair<int, std::string> create_temporary(const fs::path& dir, const std::string& where) {
  static std::atomic<std::uint64_t> counter{0};
  std::random_device entropy;
  for (int attempt = 0; attempt < 100; ++attempt) {
    const std::uint64_t r = ((std::uint64_t{entropy()} << 32) | entropy()) ^ (counter++ * 0x9E3779B97F4A7C15ULL);
    const std::string name = (dir / fmt::format(".headgrad-{:016x}.tmp", r)).string();
    const int fd = ::open(name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) return {fd, name};
    if (errno != EEXIST)
      throw CheckpointError(fmt::format("{}: cannot create a temporary file in {}: {}", where, dir.string(), errno_text()));
  }
  throw CheckpointError(fmt::format("{}: cannot find a free temporary file name in {}", where, dir.string()));
}

// Writes all of `bytes` to fd in chunks (the save hook runs before each) and flushes them to disk.
void write_all(int fd, std::string_view bytes, const std::string& where, const std::string& tmp) {
  constexpr std::size_t kChunk = std::size_t{1} << 16;
  std::size_t written = 0;
  while (written < bytes.size()) {
    if (save_hook()) save_hook()(written);
    const std::size_t n = std::min(kChunk, bytes.size() - written);
    const ssize_t r = ::write(fd, bytes.data() + written, n);
    if (r < 0) {
      if (errno == EINTR) continue;
      throw CheckpointError(fmt::format("{}: writing {} failed: {}", where, tmp, errno_text()));
    }
    written += static_cast<std::size_t>(r);
  }
  if (::fsync(fd) != 0) throw CheckpointError(fmt::format("{}: flushing {} to disk failed: {}", where, tmp, errno_text()));
}

}  // namespace

void set_save_hook(std::function<void(std::size_t)> hook) { save_hook() = std::move(hook); }

void write_file_atomically(const std::string& path, std::string_view bytes) {
  if (fs::path(path).filename().empty()) throw CheckpointError(fmt::format("{}: not a file name", path));
  const fs::path target = follow_links(path);
  const std::string where = describe(path, target);
  struct stat st {};
  const bool exists = ::stat(target.c_str(), &st) == 0;
  if (exists && !S_ISREG(st.st_mode))
    throw CheckpointError(fmt::format("{}: is {}, not a regular file; a save replaces only a regular file", where,
                                      kind_of(st.st_mode)));
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const auto [fd, tmp] = create_temporary(dir, where);
  try {
    if (exists && ::fchmod(fd, st.st_mode & 07777) != 0)
      throw CheckpointError(fmt::format("{}: setting the permissions of {} failed: {}", where, tmp, errno_text()));
    write_all(fd, bytes, where, tmp);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    const std::string err = errno_text();
    ::unlink(tmp.c_str());
    throw CheckpointError(fmt::format("{}: closing {} failed: {}", where, tmp, err));
  }
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    const std::string err = errno_text();
    ::unlink(tmp.c_str());
    throw CheckpointError(fmt::format("{}: renaming {} over it failed: {}", where, tmp, err));
  }
  // Make the rename itself durable.
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

RegularFile::RegularFile(const std::string& path) : path_(path) {
  auto refuse = [&](mode_t mode) {
    throw CheckpointError(fmt::format("{}: is {}, not a regular file; a checkpoint is read only from a regular file",
                                      path, kind_of(mode)));
  };
  // Looked at before opening: opening a FIFO or a device can block or have effects of its own.
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) refuse(st.st_mode);
  // O_NONBLOCK: should the path be swapped for a FIFO after the stat, the open does not wait.
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd_ < 0) throw CheckpointError(fmt::format("{}: cannot open: {}", path, errno_text()));
  if (::fstat(fd_, &st) != 0) {
    const std::string err = errno_text();
    ::close(fd_);
    throw CheckpointError(fmt::format("{}: cannot read its size: {}", path, err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    refuse(st.st_mode);
  }
  size_ = static_cast<std::uint64_t>(st.st_size);
}

RegularFile::~RegularFile() { ::close(fd_); }

void RegularFile::read(std::uint64_t offset, void* out, std::size_t n) const {
  auto* dst = static_cast<char*>(out);
  std::size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd_, dst + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw CheckpointError(fmt::format("{}: read error at byte {}: {}", path_, offset + done, errno_text()));
    }
    if (r == 0)
      throw CheckpointError(fmt::format("{}: the file ended at byte {} while {} bytes were expected (did it change "
                                        "while being read?)", path_, offset + done, size_));
    done += static_cast<std::size_t>(r);
  }
}

}  // namespace nn::detail
