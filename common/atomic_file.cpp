#include "common/atomic_file.h"

#include <fcntl.h>
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
  throw InputError(path.string() + ": cannot write: " + std::strerror(error));
}

// Writes `text` to a new temporary file beside `path` (checked, synced) and returns its name.
std::filesystem::path stage(const std::filesystem::path& path, const std::string& text) {
  namespace fs = std::filesystem;
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
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
}

}  // namespace stepcast
