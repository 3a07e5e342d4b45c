// Typed, validating access to a TOML table. Every failure throws InputError
// naming the file, the key (dotted path), the value found and what is valid.
#pragma once

#include <toml++/toml.h>

#include <cstdint>
#include <optional>
#include <set>
#include <string>

namespace stepcast {

class TomlReader {
 public:
  // `origin` is the file name, `prefix` the dotted path of this table ("" at the root).
  TomlReader(const toml::table& table, std::string origin, std::string prefix = "");

  // Parses text; syntax errors name file, line and column.
  static toml::table parse(const std::string& text, const std::string& origin);

  bool has(const std::string& key) const;
  std::string key_path(const std::string& key) const;
  const std::string& origin() const { return origin_; }

  std::string get_string(const std::string& key) const;
  std::string get_string_or(const std::string& key, const std::string& fallback) const;
  int64_t get_int(const std::string& key, int64_t min_value, int64_t max_value) const;
  int64_t get_int_or(const std::string& key, int64_t fallback, int64_t min_value,
                     int64_t max_value) const;
  double get_double(const std::string& key, double min_value, double max_value) const;
  double get_double_or(const std::string& key, double fallback, double min_value,
                       double max_value) const;
  bool get_bool_or(const std::string& key, bool fallback) const;
  std::vector<std::string> get_string_array_or(const std::string& key) const;

  // A number written as { value = X, source = "..." }: every number that comes
  // from outside carries its source. Returns the value; `source_out` gets the source.
  double get_sourced(const std::string& key, double min_value, double max_value,
                     std::string* source_out = nullptr) const;
  std::optional<double> get_sourced_opt(const std::string& key, double min_value,
                                        double max_value, std::string* source_out = nullptr) const;

  TomlReader subtable(const std::string& key) const;
  std::optional<TomlReader> subtable_opt(const std::string& key) const;

  // Throws for any key not in `allowed` (catches typos such as "hiden_size").
  void reject_unknown_keys(const std::set<std::string>& allowed) const;

  const toml::table& table() const { return table_; }

 private:
  [[noreturn]] void fail(const std::string& key, const std::string& what) const;
  std::string describe(const toml::node& node) const;

  const toml::table& table_;
  std::string origin_;
  std::string prefix_;
};

}  // namespace stepcast
