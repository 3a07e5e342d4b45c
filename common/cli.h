// The command line of every Stepcast program (CLI11): parse_cli parses argv
// into `app`; --help prints the help and ends with status 0, and a command line
// that does not parse ends with one line on stderr and status 2.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdio>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "common/errors.h"

namespace stepcast {

// std::nullopt: parsed, run the program. A value: the exit status to end with now.
inline std::optional<int> parse_cli(CLI::App& app, int argc, char** argv, const char* tool) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& help) {
    return app.exit(help);
  } catch (const CLI::CallForAllHelp& help) {
    return app.exit(help);
  } catch (const CLI::ParseError& err) {
    std::fprintf(stderr, "%s: error: %s (see %s --help)\n", tool, err.what(), tool);
    return kExitBadInput;
  }
  return std::nullopt;
}

// The items of a comma-separated flag value ("a,b,,c" -> a, b, c): empty items are dropped.
inline std::vector<std::string> split_comma_list(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

}  // namespace stepcast
