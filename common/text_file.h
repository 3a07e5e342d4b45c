// Reading a whole file (cards, profiles, run files): InputError naming the path when it
// cannot be opened.
#pragma once

#include <filesystem>
#include <string>

namespace stepcast {

std::string read_text_file(const std::filesystem::path& path);

}  // namespace stepcast
