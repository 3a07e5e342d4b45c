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

}  // namespace

void write_file_atomic(const std::filesystem::path& path, const std::string& text) {
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
  if (error == 0 && ::rename(tmp.c_str(), path.c_str()) != 0) error = errno;
  if (error != 0) {
    fs::remove(tmp, ec);
    cannot_write(path, error);
  }
}

}  // namespace stepcast
