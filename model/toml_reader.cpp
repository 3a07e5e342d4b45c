#include "model/toml_reader.h"

#include <cmath>
#include <sstream>

#include "common/errors.h"
#include "common/join.h"

namespace stepcast {

TomlReader::TomlReader(const toml::table& table, std::string origin, std::string prefix)
    : table_(table), origin_(std::move(origin)), prefix_(std::move(prefix)) {}

toml::table TomlReader::parse(const std::string& text, const std::string& origin) {
  try {
    return toml::parse(text, origin);
  } catch (const toml::parse_error& err) {
    const auto& where = err.source().begin;
    std::ostringstream msg;
    msg << origin << ":" << where.line << ":" << where.column << ": malformed TOML: ";
    // The parser quotes the character it saw, which may be a line break: one line, escaped.
    for (const char ch : err.description()) {
      if (ch == '\n')
        msg << "\\n";
      else if (ch == '\r')
        msg << "\\r";
      else if (static_cast<unsigned char>(ch) < 0x20)
        msg << "\\x" << std::hex << static_cast<int>(ch) << std::dec;
      else
        msg << ch;
    }
    throw InputError(msg.str());
  }
}

bool TomlReader::has(const std::string& key) const { return table_.contains(key); }

std::string TomlReader::key_path(const std::string& key) const {
  return prefix_.empty() ? key : prefix_ + "." + key;
}

void TomlReader::fail(const std::string& key, const std::string& what) const {
  throw InputError(origin_ + ": key '" + key_path(key) + "' " + what);
}

std::string TomlReader::describe(const toml::node& node) const {
  std::ostringstream out;
  if (auto s = node.as_string()) {
    out << '"' << s->get() << '"';
  } else if (node.is_table()) {
    out << "a table";
  } else if (node.is_array()) {
    out << "an array";
  } else {
    node.visit([&](auto&& v) {
      if constexpr (toml::is_number<decltype(v)> || toml::is_boolean<decltype(v)>) out << v;
    });
  }
  std::string text = out.str();
  return text.empty() ? std::string("a value of another type") : text;
}

std::string TomlReader::get_string(const std::string& key) const {
  const toml::node* node = table_.get(key);
  if (!node) fail(key, "is missing (a string is required)");
  if (auto s = node->as_string()) return s->get();
  fail(key, "must be a string, got " + describe(*node));
}

std::string TomlReader::get_string_or(const std::string& key, const std::string& fallback) const {
  return has(key) ? get_string(key) : fallback;
}

int64_t TomlReader::get_int(const std::string& key, int64_t min_value, int64_t max_value) const {
  const toml::node* node = table_.get(key);
  if (!node) fail(key, "is missing (an integer is required)");
  auto v = node->as_integer();
  if (!v) fail(key, "must be an integer, got " + describe(*node));
  int64_t value = v->get();
  if (value < min_value || value > max_value) {
    fail(key, "= " + std::to_string(value) + " is out of range [" + std::to_string(min_value) +
                  ", " + std::to_string(max_value) + "]");
  }
  return value;
}

int64_t TomlReader::get_int_or(const std::string& key, int64_t fallback, int64_t min_value,
                               int64_t max_value) const {
  return has(key) ? get_int(key, min_value, max_value) : fallback;
}

double TomlReader::get_double(const std::string& key, double min_value, double max_value) const {
  const toml::node* node = table_.get(key);
  if (!node) fail(key, "is missing (a number is required)");
  double value = 0;
  if (auto f = node->as_floating_point()) {
    value = f->get();
  } else if (auto i = node->as_integer()) {
    value = static_cast<double>(i->get());
  } else {
    fail(key, "must be a number, got " + describe(*node));
  }
  if (!std::isfinite(value) || value < min_value || value > max_value) {
    std::ostringstream msg;
    msg << "= " << value << " is out of range [" << min_value << ", " << max_value << "]";
    fail(key, msg.str());
  }
  return value;
}

double TomlReader::get_double_or(const std::string& key, double fallback, double min_value,
                                 double max_value) const {
  return has(key) ? get_double(key, min_value, max_value) : fallback;
}

bool TomlReader::get_bool_or(const std::string& key, bool fallback) const {
  const toml::node* node = table_.get(key);
  if (!node) return fallback;
  if (auto b = node->as_boolean()) return b->get();
  fail(key, "must be true or false, got " + describe(*node));
}

std::vector<std::string> TomlReader::get_string_array_or(const std::string& key) const {
  std::vector<std::string> out;
  const toml::node* node = table_.get(key);
  if (!node) return out;
  auto arr = node->as_array();
  if (!arr) fail(key, "must be an array of strings, got " + describe(*node));
  for (const auto& item : *arr) {
    auto s = item.as_string();
    if (!s) fail(key, "must be an array of strings, got an element " + describe(item));
    out.push_back(s->get());
  }
  return out;
}

std::optional<double> TomlReader::get_sourced_opt(const std::string& key, double min_value,
                                                  double max_value,
                                                  std::string* source_out) const {
  if (!has(key)) return std::nullopt;
  return get_sourced(key, min_value, max_value, source_out);
}

double TomlReader::get_sourced(const std::string& key, double min_value, double max_value,
                               std::string* source_out) const {
  const toml::node* node = table_.get(key);
  if (!node) fail(key, "is missing (write { value = ..., source = \"...\" })");
  auto tbl = node->as_table();
  if (!tbl) {
    fail(key, "must be { value = ..., source = \"...\" } (every number carries its source), got " +
                  describe(*node));
  }
  TomlReader sub(*tbl, origin_, key_path(key));
  sub.reject_unknown_keys({"value", "source"});
  std::string source = sub.get_string("source");
  if (source.empty()) sub.fail("source", "must not be empty");
  if (source_out) *source_out = source;
  return sub.get_double("value", min_value, max_value);
}

TomlReader TomlReader::subtable(const std::string& key) const {
  const toml::node* node = table_.get(key);
  if (!node) fail(key, "is missing (a table is required)");
  auto tbl = node->as_table();
  if (!tbl) fail(key, "must be a table, got " + describe(*node));
  return TomlReader(*tbl, origin_, key_path(key));
}

std::optional<TomlReader> TomlReader::subtable_opt(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  return subtable(key);
}

void TomlReader::reject_unknown_keys(const std::set<std::string>& allowed) const {
  for (const auto& [key, node] : table_) {
    std::string name(key.str());
    if (!allowed.count(name)) {
      fail(name, "is not a known key (valid: " + join_names(allowed) + ")");
    }
  }
}

}  // namespace stepcast
