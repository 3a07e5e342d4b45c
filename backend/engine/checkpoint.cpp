#include "backend/engine/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <regex>

#include "common/atomic_file.h"
#include "common/crc32c.h"
#include "common/errors.h"
#include "common/text_file.h"

namespace stepcast::backend {

namespace fs = std::filesystem;

namespace {

constexpr const char* kManifest = "manifest.json";
constexpr const char* kLatest = "latest";

std::string step_folder_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}


struct ShardWrite {
  int error = 0;  // errno of the failing call, 0 when written
  std::string what;
  uint64_t bytes = 0;
  uint32_t crc = 0;
};

// Writes the tensors to `file` (created exclusively, never through a link), checksumming
// the bytes on their way out, and syncs it.
ShardWrite write_shard(const fs::path& file, const std::vector<torch::Tensor>& tensors) {
  ShardWrite w;
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (fd < 0) {
    w.error = errno;
    return w;
  }
  // After a failed write the rest is dropped but reported as written: LibTorch's zip writer
  // throws from its destructor on a short write, which ends the process (std::terminate).
  auto writer = [&](const void* data, size_t size) -> size_t {
    const auto* p = static_cast<const char*>(data);
    for (size_t done = 0; w.error == 0 && done < size;) {
      const ssize_t n = ::write(fd, p + done, size - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        w.error = n < 0 ? errno : ENOSPC;
        break;
      }
      w.crc = crc32c(w.crc, p + done, static_cast<size_t>(n));
      w.bytes += static_cast<uint64_t>(n);
      done += static_cast<size_t>(n);
    }
    return size;
  };
  try {
    torch::save(tensors, std::function<size_t(const void*, size_t)>(writer));
  } catch (const c10::Error& e) {
    if (w.error == 0) {
      w.error = EIO;
      w.what = e.what_without_backtrace();
    }
  }
  if (w.error == 0 && ::fsync(fd) != 0) w.error = errno;
  if (::close(fd) != 0 && w.error == 0) w.error = errno;
  return w;
}

// The CRC-32C and size of a file, read in blocks.
std::pair<uint64_t, uint32_t> checksum_file(const fs::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InputError(file.string() + ": cannot read the checkpoint shard: " + std::strerror(errno));
  std::vector<char> buf(8 << 20);
  uint64_t bytes = 0;
  uint32_t crc = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      throw IoError(file.string() + ": cannot read the checkpoint shard: " + std::strerror(e));
    }
    if (n == 0) break;
    crc = crc32c(crc, buf.data(), static_cast<size_t>(n));
    bytes += static_cast<uint64_t>(n);
  }
  ::close(fd);
  return {bytes, crc};
}

// Folder entries of ROOT that belong to older saves or to interrupted ones.
void remove_entries(const fs::path& root, const std::function<bool(const std::string&)>& which) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (which(name)) remove_tree(e.path());
  }
}

bool is_step_name(const std::string& name) {
  static const std::regex re("step-[0-9]{8,}");
  return std::regex_match(name, re);
}

bool is_partial_name(const std::string& name) {
  static const std::regex re("\\.step-[0-9]{8,}\\.(partial|old)");
  return std::regex_match(name, re);
}

}  // namespace

void all_ranks_ok(bool ok, const std::string& failure_message, int exit_status, Collectives& comm, Runtime& rt,
           const std::string& peer_message) {
  const std::vector<int64_t> all = gather_small_ints({ok ? 1 : 0}, comm, rt);
  int first_failed = -1;
  for (size_t r = 0; r < all.size(); ++r)
    if (all[r] == 0 && first_failed < 0) first_failed = static_cast<int>(r);
  if (first_failed < 0) return;
  // One line for the run: the lowest failing rank says it (often all fail alike).
  if (!ok && comm.rank() == first_failed) {
    if (exit_status == kExitBadInput) throw InputError(failure_message);
    throw IoError(failure_message);
  }
  throw PeerFailure(exit_status, "rank " + std::to_string(first_failed) + ": " + peer_message);
}

std::vector<int64_t> gather_small_ints(const std::vector<int64_t>& values, Collectives& comm, Runtime& rt) {
  const int world = comm.world();
  const int64_t n = static_cast<int64_t>(values.size());
  // fp32 holds integers below 2^24 exactly, and every collective here has fp32.
  torch::Tensor slots = torch::zeros({world * n}, torch::kFloat);
  for (int64_t i = 0; i < n; ++i) {
    STEPCAST_ASSERT(values[static_cast<size_t>(i)] >= 0 && values[static_cast<size_t>(i)] < (int64_t{1} << 24));
    slots[comm.rank() * n + i] = static_cast<float>(values[static_cast<size_t>(i)]);
  }
  torch::Tensor t = slots.to(rt.device());
  rt.synchronize();
  rt.comm_waits_for_compute();
  comm.all_reduce_sum(t);
  rt.synchronize();
  const torch::Tensor back = t.to(torch::kCPU);
  std::vector<int64_t> out(static_cast<size_t>(world * n));
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<int64_t>(back[static_cast<int64_t>(i)].item<float>());
  return out;
}

void save_checkpoint(const fs::path& root, int64_t step, const CheckpointIdentity& id,
                     const std::vector<torch::Tensor>& shard, Collectives& comm, Runtime& rt, int die_at_rank) {
  const std::string name = step_folder_name(step);
  const fs::path partial = root / ("." + name + ".partial");
  std::string previous;
  std::error_code ec0;
  if (fs::is_regular_file(root / kLatest, ec0)) {
    previous = read_text_file(root / kLatest);
    while (!previous.empty() && previous.back() == '\n') previous.pop_back();
  }
  const std::string kept = " (step " + std::to_string(step) + " is not saved; " +
                           (previous.empty() ? std::string("there is no earlier checkpoint")
                                             : (root / kLatest).string() + " still names " + previous) + ")";
  // Rank 0 prepares the folder; stale partial folders of earlier failed saves go.
  bool ok = true;
  std::string why;
  if (id.rank == 0) {
    std::error_code ec;
    fs::create_directories(root, ec);
    if (!ec && !fs::is_directory(root, ec)) ec = std::make_error_code(std::errc::not_a_directory);
    if (!ec) remove_entries(root, is_partial_name);
    if (!ec) fs::create_directory(partial, ec);
    if (ec) {
      ok = false;
      why = root.string() + ": cannot save a checkpoint there: " + ec.message();
    }
  }
  all_ranks_ok(ok, why, kExitIo, comm, rt, "could not prepare the checkpoint folder");

  // Each rank's shard, with a trailer that names its step, rank and world size.
  std::vector<torch::Tensor> tensors = shard;
  tensors.push_back(torch::tensor({step, static_cast<int64_t>(id.rank), static_cast<int64_t>(id.world_size)}, torch::kLong));
  const fs::path file = partial / shard_file_name(id.rank);
  const ShardWrite w = write_shard(file, tensors);
  if (id.rank == die_at_rank) {
    std::fprintf(stderr, "train: rank %d: injected fault while saving step %lld\n", id.rank, static_cast<long long>(step));
    std::fflush(stderr);
    std::_Exit(7);  // as a rank that crashes after its shard is on disk, before the others know
  }
  try {
    all_ranks_ok(w.error == 0,
                 file.string() + ": cannot write the checkpoint shard: " + std::strerror(w.error) +
                     (w.what.empty() ? "" : " (" + w.what.substr(0, w.what.find('\n')) + ")") + kept,
                 kExitIo, comm, rt, "could not write its checkpoint shard");
  } catch (...) {
    if (id.rank == 0) remove_tree(partial);  // the ranks are past writing: nothing else touches it
    throw;
  }

  // Rank 0 learns every shard's size and checksum (16-bit pieces fit the collective's fp32).
  std::vector<int64_t> mine{static_cast<int64_t>(w.crc >> 16), static_cast<int64_t>(w.crc & 0xFFFFu)};
  for (int k = 3; k >= 0; --k) mine.push_back(static_cast<int64_t>((w.bytes >> (16 * k)) & 0xFFFFu));
  const std::vector<int64_t> all = gather_small_ints(mine, comm, rt);

  ok = true;
  if (id.rank == 0) {
    try {
      std::vector<std::pair<uint64_t, uint32_t>> shards;
      for (int r = 0; r < id.world_size; ++r) {
        const int64_t* v = &all[static_cast<size_t>(r) * mine.size()];
        uint64_t bytes = 0;
        for (int k = 0; k < 4; ++k) bytes = (bytes << 16) | static_cast<uint64_t>(v[2 + k]);
        shards.emplace_back(bytes, static_cast<uint32_t>((v[0] << 16) | v[1]));
      }
      write_file_atomic(partial / kManifest, manifest_text(id, step, shards));
      sync_folder(partial);
      // Saving a step twice replaces the earlier folder of that step.
      const fs::path final_path = root / name, old = root / ("." + name + ".old");
      std::error_code ec;
      if (fs::exists(final_path, ec)) fs::rename(final_path, old);
      fs::rename(partial, final_path);
      sync_folder(root);
      write_file_atomic(root / kLatest, name + "\n");
      remove_entries(root, [&](const std::string& n) { return (is_step_name(n) && n != name) || is_partial_name(n); });
    } catch (const std::exception& e) {
      ok = false;
      why = root.string() + ": cannot complete the checkpoint: " + e.what() + kept;
    }
  }
  all_ranks_ok(ok, why, kExitIo, comm, rt, "could not complete the checkpoint");
}

LoadedShard load_checkpoint(const fs::path& path, const CheckpointIdentity& id) {
  std::error_code ec;
  fs::path folder = path;
  if (!fs::exists(path, ec)) throw InputError(path.string() + ": no such checkpoint folder (--resume)");
  if (!fs::is_directory(path, ec)) throw InputError(path.string() + ": --resume takes a checkpoint folder, this is a file");
  if (!fs::exists(path / kManifest, ec)) {
    const fs::path latest = path / kLatest;
    if (!fs::exists(latest, ec))
      throw InputError(path.string() + ": not a checkpoint (no " + kManifest + ", no " + kLatest +
                       "); give the --save folder or one of its step-N folders");
    std::string name = read_text_file(latest);
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    if (!is_step_name(name)) throw InputError(latest.string() + ": \"" + name.substr(0, 40) + "\" is not a step folder name");
    folder = path / name;
    if (!fs::exists(folder / kManifest, ec))
      throw InputError(latest.string() + ": names " + name + ", which has no " + kManifest);
  }
  const fs::path manifest_path = folder / kManifest;
  const ManifestShard entry = check_manifest(read_text_file(manifest_path), manifest_path.string(), id);
  const int64_t step = entry.step;

  const fs::path file = folder / shard_file_name(id.rank);
  if (!fs::is_regular_file(file, ec)) throw InputError(file.string() + ": missing (the manifest lists it)");
  const auto [bytes, crc] = checksum_file(file);
  const uint64_t want_bytes = entry.bytes;
  if (bytes != want_bytes)
    throw InputError(file.string() + ": " + std::to_string(bytes) + " bytes, the manifest says " +
                     std::to_string(want_bytes) + " (truncated or replaced)");
  if (crc32c_hex(crc) != entry.crc32c)
    throw InputError(file.string() + ": CRC-32C " + crc32c_hex(crc) + ", the manifest says " + entry.crc32c + " (corrupted, or a file of another checkpoint or rank)");
  LoadedShard out;
  out.file = file;
  try {
    torch::load(out.tensors, file.string());
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    throw InputError(file.string() + ": not a readable shard: " + what.substr(0, what.find('\n')));
  }
  if (out.tensors.empty() || out.tensors.back().scalar_type() != torch::kLong || out.tensors.back().numel() != 3)
    throw InputError(file.string() + ": no step/rank/world trailer");
  const torch::Tensor trailer = out.tensors.back();
  out.tensors.pop_back();
  const int64_t t_step = trailer[0].item<int64_t>(), t_rank = trailer[1].item<int64_t>(), t_world = trailer[2].item<int64_t>();
  if (t_step != step || t_rank != id.rank || t_world != id.world_size)
    throw InputError(file.string() + ": holds step " + std::to_string(t_step) + " of rank " + std::to_string(t_rank) + "/" +
                     std::to_string(t_world) + ", the manifest and this run expect step " + std::to_string(step) +
                     " of rank " + std::to_string(id.rank) + "/" + std::to_string(id.world_size));
  out.step = step;
  return out;
}

}  // namespace stepcast::backend
