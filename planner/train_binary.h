// Where the backend's `train` is: an explicit --train flag, else the one built
// beside this program (build/<tool>/<tool> -> build/backend/train). Used by the
// tools that run plans on the backend (planner validate, calibrate measure).
#pragma once

#include <string>

namespace stepcast {

// Throws InputError naming the path when there is no such file.
std::string train_binary(const std::string& flag);

}  // namespace stepcast
