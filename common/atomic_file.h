// Writes a whole file or nothing: the text goes to a temporary file in the
// same folder, which is then renamed over the target. Throws InputError
// naming the path when the folder cannot be written.
#pragma once

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace stepcast {

void write_file_atomic(const std::filesystem::path& path, const std::string& text);

// Several files, all or none: each is written to its temporary first, and only when all are
// written are they renamed into place. The same path named twice is an InputError.
void write_files_atomic(const std::vector<std::pair<std::filesystem::path, std::string>>& files);

}  // namespace stepcast
