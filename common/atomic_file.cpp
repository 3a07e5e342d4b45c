#include "common/atomic_file.h"

#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/errors.h"

namespace stepcast {

namespace {

[[noreturn]] void cannot_write(const std::filesystem::path& path, int error) {
  throw IoError(path.string() + ": cannot write: " + std::strerror(error));
}

std::filesystem::path folder_of(const std::filesystem::path& path) {
  return path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
}

// Writes `text` to a new temporary file beside `path` (checked, synced) and returns its name.
std::filesystem::path stage(const std::filesystem::path& path, const std::string& text) {
  namespace fs = std::filesystem;
  const fs::path dir = folder_of(path);
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw InputError(path.string() + ": cannot write: folder '" + dir.string() + "' does not exist");
  if (fs::is_directory(path, ec)) throw InputError(path.string() + ": cannot write: it is a folder");
  // An unpredictable name, created exclusively (mkstemp: O_CREAT | O_EXCL, so that a planted
  // file or link of that name makes it fail instead of being followed).
  std::string tmpl = (dir / ("." + path.filename().string() + ".tmp.XXXXXX")).string();
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  const int fd = ::mkostemp(name.data(), O_CLOEXEC);
  if (fd < 0) cannot_write(path, errno);
  const fs::path tmp(name.data());
  const mode_t mask = ::umask(0);
  ::umask(mask);
  int error = 0;
  if (::fchmod(fd, 0666 & ~mask) != 0) error = errno;
  for (size_t done = 0; error == 0 && done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno != EINTR) error = errno;
    if (n > 0) done += static_cast<size_t>(n);
  }
  if (error == 0 && ::fsync(fd) != 0) error = errno;
  if (::close(fd) != 0 && error == 0) error = errno;
  if (error != 0) {
    fs::remove(tmp, ec);
    cannot_write(path, error);
  }
  return tmp;
}

}  // namespace

void write_file_atomic(const std::filesystem::path& path, const std::string& text) {
  write_files_atomic({{path, text}});
}

void write_files_atomic(const std::vector<std::pair<std::filesystem::path, std::string>>& files) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (size_t i = 0; i < files.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (fs::weakly_canonical(files[i].first, ec) == fs::weakly_canonical(files[j].first, ec))
        throw InputError(files[i].first.string() + ": named for two outputs; give each its own file");
  // Every file staged before any is renamed into place: a failure writes none of them.
  std::vector<fs::path> staged;
  try {
    for (const auto& [path, text] : files) staged.push_back(stage(path, text));
  } catch (...) {
    for (const auto& t : staged) fs::remove(t, ec);
    throw;
  }
  for (size_t i = 0; i < files.size(); ++i) {
    if (::rename(staged[i].c_str(), files[i].first.c_str()) != 0) {
      const int error = errno;
      for (size_t k = i; k < staged.size(); ++k) fs::remove(staged[k], ec);
      cannot_write(files[i].first, error);
    }
  }
  for (const auto& [path, text] : files) sync_folder(folder_of(path));
}

void check_output_path(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(folder_of(path), ec))
    throw InputError(path.string() + ": cannot write: folder '" + folder_of(path).string() + "' does not exist");
  if (fs::is_directory(path, ec)) throw InputError(path.string() + ": cannot write: it is a folder");
}

void remove_tree(const std::filesystem::path& path) {
  ::nftw(
      path.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 16,
      FTW_DEPTH | FTW_PHYS);
}

void sync_folder(const std::filesystem::path& folder) {
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) cannot_write(folder, errno);
  const int rc = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  // Some file systems (and /proc-like ones) cannot sync a folder: that is not a failed write.
  if (rc != 0 && error != EINVAL && error != EROFS) cannot_write(folder, error);
}

void append_lines(const std::filesystem::path& path, const std::string& lines) {
  namespace fs = std::filesystem;
  STEPCAST_ASSERT(lines.empty() || lines.back() == '\n');
  std::error_code ec;
  if (!fs::is_directory(folder_of(path), ec))
    throw InputError(path.string() + ": cannot append: folder '" + folder_of(path).string() + "' does not exist");
  if (fs::is_directory(path, ec)) throw InputError(path.string() + ": cannot append: it is a folder");
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) cannot_write(path, errno);
  // One write: with O_APPEND the kernel places it at the end as a unit. A short write
  // (disk full, file-size limit) is cut back so that no torn line stays behind.
  const off_t before = ::lseek(fd, 0, SEEK_END);
  const ssize_t n = ::write(fd, lines.data(), lines.size());
  const int error = errno;
  if (n != static_cast<ssize_t>(lines.size())) {
    if (n > 0 && before >= 0) (void)!::ftruncate(fd, before);
    ::close(fd);
    cannot_write(path, n < 0 ? error : ENOSPC);
  }
  if (::close(fd) != 0) cannot_write(path, errno);
}

}  // namespace stepcast
