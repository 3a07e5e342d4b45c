#include "model/toml_edit.h"

#include <cctype>

#include "common/errors.h"

namespace stepcast {

bool erase_toml_table(std::string& text, const std::string& name) {
  const std::string header = "[" + name + "]", sub = "[" + name + ".";
  size_t start = 0;
  if (text.compare(0, header.size(), header) != 0) {
    const size_t at = text.find("\n" + header);
    if (at == std::string::npos) return false;
    start = at + 1;
  }
  size_t end = text.find("\n[", start + header.size());
  while (end != std::string::npos && text.compare(end + 1, sub.size(), sub) == 0) end = text.find("\n[", end + 1);
  end = end == std::string::npos ? text.size() : end + 1;
  text.erase(start, end - start);
  return true;
}

namespace {

// The table a header line opens ("[links]" -> "links", "[[a.b]]" -> "a.b"), or "" with `is_header`
// false for any other line (an array's continuation row "[1.0, ..." is not a header).
std::string header_table(const std::string& line, bool& is_header) {
  is_header = false;
  const size_t k = line.find_first_not_of(" \t");
  if (k == std::string::npos || line[k] != '[') return "";
  const size_t letter = line.find_first_not_of('[', k);
  if (letter == std::string::npos || !std::isalpha(static_cast<unsigned char>(line[letter]))) return "";
  const size_t close = line.find(']', letter);
  if (close == std::string::npos) return "";
  is_header = true;
  return line.substr(letter, close - letter);
}

// Whether `line` assigns `key` (leading blanks, the key, blanks, then '=').
bool assigns(const std::string& line, const std::string& key) {
  const size_t k = line.find_first_not_of(" \t");
  if (k == std::string::npos || line.compare(k, key.size(), key) != 0) return false;
  const size_t after = line.find_first_not_of(" \t", k + key.size());
  return after != std::string::npos && line[after] == '=';
}

}  // namespace

void set_toml_key(std::string& text, const std::string& table, const std::string& key, const std::string& value_text,
                  const std::string& origin) {
  std::string current;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t eol = text.find('\n', pos);
    const size_t end = eol == std::string::npos ? text.size() : eol;
    const std::string line = text.substr(pos, end - pos);
    bool is_header = false;
    const std::string opened = header_table(line, is_header);
    if (is_header) {
      current = opened;
    } else if (current == table && assigns(line, key)) {
      text.replace(pos, end - pos, key + " = " + value_text);
      return;
    }
    pos = end + 1;
  }
  throw InputError(origin + ": key '" + (table.empty() ? key : table + "." + key) + "' is missing");
}

void upsert_toml_key(std::string& text, const std::string& table, const std::string& key, const std::string& value_text,
                     const std::string& origin) {
  try {
    set_toml_key(text, table, key, value_text, origin);
    return;
  } catch (const InputError&) {
  }
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t eol = text.find('\n', pos);
    const size_t end = eol == std::string::npos ? text.size() : eol;
    bool is_header = false;
    if (header_table(text.substr(pos, end - pos), is_header) == table && is_header) {
      const std::string line = key + " = " + value_text + "\n";
      if (eol == std::string::npos) {
        text += "\n" + line;
      } else {
        text.insert(eol + 1, line);
      }
      return;
    }
    pos = end + 1;
  }
  throw InputError(origin + ": table '[" + table + "]' is missing");
}

}  // namespace stepcast
