#include "common/run_main.h"

#include <cstdio>
#include <exception>
#include <string>

#include "common/errors.h"

namespace stepcast {

namespace {

// Messages from libraries (LibTorch's carry a C++ backtrace) are cut to one screen line's worth.
std::string one_line(const char* what) {
  std::string s = what;
  if (const size_t nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
  if (s.size() > 600) s = s.substr(0, 600) + "...";
  return s;
}

}  // namespace

int run_main(const char* tool, const std::function<int()>& body) {
  try {
    return body();
  } catch (const InputError& e) {
    std::fprintf(stderr, "%s: error: %s\n", tool, e.what());
    return kExitBadInput;
  } catch (const OutOfMemoryError& e) {
    std::fprintf(stderr, "%s: %s\n", tool, e.what());
    return kExitOutOfMemory;
  } catch (const NonFiniteLossError& e) {
    std::fprintf(stderr, "%s: stopped: %s\n", tool, e.what());
    return kExitNonFinite;
  } catch (const PeerFailure& e) {
    return e.exit_status();
  } catch (const IoError& e) {
    std::fprintf(stderr, "%s: error: %s\n", tool, e.what());
    return kExitIo;
  } catch (const InterruptedError& e) {
    std::fprintf(stderr, "%s: interrupted: %s\n", tool, e.what());
    return kExitInterrupted;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", tool, one_line(e.what()).c_str());
    return kExitFailure;
  }
}

}  // namespace stepcast
