#include "common/text_file.h"

#include <fstream>
#include <sstream>

#include "common/errors.h"

namespace stepcast {

std::string read_text_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path.string() + ": cannot open file");
  std::ostringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

}  // namespace stepcast
