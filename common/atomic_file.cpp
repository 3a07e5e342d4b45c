#include "common/atomic_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/errors.h"

namespace stepcast {

void write_file_atomic(const std::filesystem::path& path, const std::string& text) {
  namespace fs = std::filesystem;
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw InputError(path.string() + ": cannot write: folder '" + dir.string() + "' does not exist");
  if (fs::is_directory(path, ec)) throw InputError(path.string() + ": cannot write: it is a folder");
  const fs::path tmp = dir / ("." + path.filename().string() + ".tmp." + std::to_string(::getpid()));
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw InputError(path.string() + ": cannot write: " + std::strerror(errno));
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0 &&
                  ::fsync(::fileno(f)) == 0;
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed) {
    fs::remove(tmp, ec);
    throw InputError(path.string() + ": cannot write: " + std::strerror(errno));
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw InputError(path.string() + ": cannot write: " + ec.message());
  }
}

}  // namespace stepcast
