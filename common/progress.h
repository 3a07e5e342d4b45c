// Progress of long work on stderr, one printer for every command that loops over runs or refits.
// On a terminal the count (and, for runs, a bar and the item's name) is rewritten in place with an
// ETA; in a log each item gets one line (`lines_per_item`) or the work gets its title line only,
// so that a log holds the same text on every run (the golden outputs' stderr, docs_figures.sh).
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>

namespace stepcast {

class Progress {
 public:
  // `prefix`: the command ("calibrate"). `title` (may be empty: no title line) is printed once as
  // "PREFIX: TITLE: TOTAL UNIT[s]". `lines_per_item`: in a log, one line per item with its name.
  Progress(std::string prefix, const std::string& title, size_t total, const std::string& unit, bool lines_per_item)
      : prefix_(std::move(prefix)), total_(total), lines_(lines_per_item), tty_(isatty(fileno(stderr)) != 0) {
    if (!title.empty())
      std::fprintf(stderr, "%s: %s: %zu %s%s\n", prefix_.c_str(), title.c_str(), total_, unit.c_str(),
                   total_ == 1 ? "" : "s");
  }
  ~Progress() {  // the rewritten line cleared: the named lines stay
    if (tty_ && shown_) std::fprintf(stderr, "\r%100s\r", "");
  }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // A message line amid the progress: on a terminal it replaces the rewritten line.
  void line(const std::string& text) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (tty_ && shown_) std::fprintf(stderr, "\r%100s\r", "");
    std::fprintf(stderr, "%s\n", text.c_str());
  }

  // Called before each item (thread-safe): shows the ones done so far and, where given, the
  // item's name.
  void next(const std::string& item = "") {
    std::lock_guard<std::mutex> lock(mutex_);
    const double elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const double eta_s = done_ > 0 ? elapsed_s / static_cast<double>(done_) * static_cast<double>(total_ - done_) : 0.0;
    // A terminal's line holds a shortened name; a log keeps it whole.
    const std::string name = tty_ && item.size() > 60 ? item.substr(0, 57) + "..." : item;
    if (tty_ && (done_ > 0 || !item.empty())) {
      const int width = 20, filled = static_cast<int>(width * static_cast<double>(done_) / static_cast<double>(total_));
      std::fprintf(stderr, "\r[%s%s] %zu/%zu  %s  ETA %.0f s   ", std::string(filled, '#').c_str(),
                   std::string(width - filled, '.').c_str(), done_, total_, name.c_str(), eta_s);
      shown_ = true;
    } else if (!tty_ && lines_) {
      std::fprintf(stderr, "%s: %zu/%zu  %s  ETA %.0f s\n", prefix_.c_str(), done_ + 1, total_, name.c_str(), eta_s);
    }
    ++done_;
  }

 private:
  std::string prefix_;
  size_t total_ = 0, done_ = 0;
  bool lines_ = false, tty_ = false, shown_ = false;
  std::mutex mutex_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace stepcast
