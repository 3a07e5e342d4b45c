// LibTorch and Ceres pull in glog, whose CHECK macros abort instead of
// reporting to doctest. Include this after them, instead of doctest.h.
#pragma once

#undef CHECK
#undef CHECK_EQ
#undef CHECK_NE
#undef CHECK_LT
#undef CHECK_LE
#undef CHECK_GT
#undef CHECK_GE
#include <doctest/doctest.h>
