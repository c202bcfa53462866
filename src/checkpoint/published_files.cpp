#include "fsdp/checkpoint/published_files.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <system_error>

namespace fsdp::checkpoint {

namespace fs = std::filesystem;

std::string without_trailing_slashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

bool absent_or_empty(const fs::path& path) {
  std::error_code error;
  const fs::file_status status = fs::symlink_status(path, error);
  if (!fs::exists(status)) return true;
  return fs::is_directory(status) && fs::is_empty(path, error) && !error;
}

void refuse_existing(const fs::path& path, const std::string& what, const std::string& advice) {
  if (absent_or_empty(path)) return;
  throw std::runtime_error(what + " '" + path.string() + "' exists: " + advice);
}

std::string path_inside(const std::string& dir, const std::string& relative, const std::string& what) {
  const fs::path path(relative);
  bool climbs = false;
  for (const auto& part : path) climbs = climbs || part == "..";
  if (relative.empty() || path.is_absolute() || climbs || relative.find('\0') != std::string::npos) {
    throw std::runtime_error(what + " names the file '" + relative + "', which is not inside '" + dir +
                             "' (files are named relative to their directory, without '..')");
  }
  return (fs::path(dir) / path).string();
}

void fsync_path(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

namespace {

#ifndef RENAME_EXCHANGE
constexpr unsigned kRenameExchange = 1u << 1;
#else
constexpr unsigned kRenameExchange = RENAME_EXCHANGE;
#endif

// Swaps two existing paths in one step; false where the filesystem or kernel cannot.
bool exchange(const fs::path& a, const fs::path& b) {
#ifdef SYS_renameat2
  if (::syscall(SYS_renameat2, AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), kRenameExchange) == 0) return true;
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) {
    throw std::runtime_error("cannot exchange '" + a.string() + "' and '" + b.string() + "': " + std::strerror(errno));
  }
#endif
  return false;
}

}  // namespace

void publish(const fs::path& ready, const fs::path& target, bool replace) {
  std::error_code error;
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  if (absent_or_empty(target)) {
    if (fs::is_directory(fs::symlink_status(target, error))) fs::remove(target, error);  // empty: nothing of anyone's
    fs::rename(ready, target);
    fsync_path(parent);
    return;
  }
  if (!replace) {
    throw std::runtime_error("'" + target.string() + "' exists; not replaced (the new one is left at '" +
                             ready.string() + "')");
  }
  if (fs::is_directory(fs::symlink_status(target, error)) != fs::is_directory(fs::symlink_status(ready, error))) {
    throw std::runtime_error("'" + target.string() + "' is a " +
                             (fs::is_directory(fs::symlink_status(target, error)) ? "directory" : "file") +
                             ", and what would replace it is not: not replaced (the new one is left at '" +
                             ready.string() + "')");
  }
  if (exchange(ready, target)) {
    // `ready` now names the old one.
    fsync_path(parent);
    fs::remove_all(ready, error);
    return;
  }
  // Where exchange is not to be had: the old one aside first, so that a crash between the two
  // renames leaves both (the old under TARGET.replaced), never neither.
  const fs::path aside = target.string() + ".replaced";
  if (fs::exists(fs::symlink_status(aside, error))) {
    throw std::runtime_error("'" + aside.string() + "' exists (left by an interrupted replacement?): move it away; '" +
                             target.string() + "' was not replaced");
  }
  fs::rename(target, aside);
  fs::rename(ready, target);
  fsync_path(parent);
  fs::remove_all(aside, error);
}

}  // namespace fsdp::checkpoint
