// Unit conversions for printing. Inside, times are seconds and sizes bytes;
// 1 GiB = 2^30 bytes, 1 MiB = 2^20 bytes, 1 GB = 1e9 bytes (shared STYLE: names and units).
#pragma once

namespace stepcast {

inline constexpr double kBytesPerGiB = 1073741824.0;
inline constexpr double kBytesPerMiB = 1048576.0;
inline constexpr double kBytesPerGB = 1e9;

}  // namespace stepcast
