// The process boundary of every Stepcast program: runs the program's body and
// turns what it throws into one line on stderr and the exit status of
// common/errors.h. Mains call it and nothing else catches.
#pragma once

#include <functional>

namespace stepcast {

// `tool` prefixes the message ("planner: error: ..."). Returns the exit status.
int run_main(const char* tool, const std::function<int()>& body);

}  // namespace stepcast
