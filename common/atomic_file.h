// Writes a whole file or nothing: the text goes to a temporary file in the
// same folder, which is then renamed over the target. Throws InputError
// naming the path when the folder cannot be written.
#pragma once

#include <filesystem>
#include <string>

namespace stepcast {

void write_file_atomic(const std::filesystem::path& path, const std::string& text);

}  // namespace stepcast
