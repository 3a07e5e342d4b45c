// The shipped catalog parses and the coefficient table is consistent. (The parsers'
// fuzz targets are tests/fuzz_parsers.cpp.)
#include <doctest/doctest.h>

#include <fstream>
#include <random>
#include <sstream>

#include "common/errors.h"
#include "test_util.h"

using namespace stepcast;


TEST_CASE("every shipped card and profile parses") {
  for (const auto& e : list_model_catalog(test::data_dir())) CHECK_NOTHROW(load_model_card(e.path));
  for (const auto& n : list_hardware(test::data_dir())) CHECK_NOTHROW(resolve_hardware(n, test::data_dir()));
}

TEST_CASE("coefficient table: ids in order, defaults within bounds") {
  const auto& table = coef_table();
  for (int i = 0; i < kNumCoefs; ++i) {
    CAPTURE(table[i].name);
    CHECK(table[i].id == i);
    CHECK(table[i].lower <= table[i].default_value);
    CHECK(table[i].default_value <= table[i].upper);
    CHECK(coef_by_name(table[i].name) == table[i].id);
  }
}
