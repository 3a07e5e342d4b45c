// Edits of a profile's TOML text that keep everything else as written (comments, order, the
// sources beside each value): the profile writers (calibrate fit, calibrate link) change what
// they measured and nothing more.
#pragma once

#include <string>

namespace stepcast {

// Removes the table [NAME] and the subtables [NAME.…] that follow it, from its header to the next
// header of another table; a writer then puts the new table in its place. Returns whether the
// text held the table.
bool erase_toml_table(std::string& text, const std::string& name);

// Replaces the line `KEY = …` of table `table` ("" for the keys before the first table header)
// with `KEY = VALUE_TEXT` (VALUE_TEXT as TOML, e.g. "{ value = 1, source = \"…\" }"). Throws
// InputError "ORIGIN: key 'TABLE.KEY' is missing" when the table holds no such line.
void set_toml_key(std::string& text, const std::string& table, const std::string& key, const std::string& value_text,
                  const std::string& origin);

// As set_toml_key, but where table `table` holds no such line the line is added right after its
// header. Throws InputError "ORIGIN: table '[TABLE]' is missing" when there is no header.
void upsert_toml_key(std::string& text, const std::string& table, const std::string& key, const std::string& value_text,
                     const std::string& origin);

}  // namespace stepcast
