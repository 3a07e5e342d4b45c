#include "planner/train_binary.h"

#include <filesystem>

#include "model/errors.h"

namespace stepcast {

std::string train_binary(const std::string& flag) {
  namespace fs = std::filesystem;
  const std::string path =
      flag.empty() ? (fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "backend" / "train").string()
                   : flag;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw InputError(path + ": no train binary (build the backend, or pass --train PATH)");
  return path;
}

}  // namespace stepcast
