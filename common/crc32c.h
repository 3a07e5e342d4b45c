// CRC-32C (Castagnoli, polynomial 0x1EDC6F41, reflected 0x82F63B78; RFC 3720
// appendix B.4): the checksum of checkpoint shards. Its standard check value
// is crc32c("123456789") = 0xE3069283 (tests/test_planner.cpp checks it). On
// x86 with SSE4.2 the CPU's crc32 instruction computes it at several GB/s, so
// verifying a shard of tens of GB costs seconds; elsewhere a table does.
#pragma once

#include <cstddef>
#include <cstdint>

namespace stepcast {

// The CRC of `bytes` following the CRC `crc` of what came before (0 to start).
uint32_t crc32c(uint32_t crc, const void* bytes, size_t size);

}  // namespace stepcast
