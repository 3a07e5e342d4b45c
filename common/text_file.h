// Reading a whole file (cards, profiles, run files): InputError naming the path when it
// cannot be opened.
#pragma once

#include <filesystem>
#include <string>

namespace stepcast {

std::string read_text_file(const std::filesystem::path& path);

// JSON text nested deeper than `max_depth` arrays/objects is an InputError naming `where`
// (checked before parsing: no Stepcast file nests beyond a handful of levels, and a
// hostile one of 100k levels must not exhaust the stack of whatever walks it).
void check_json_depth(const std::string& text, const std::string& where, int max_depth = 64);

}  // namespace stepcast
