// Timeline: a Chrome-trace JSON file (loads in chrome://tracing and Perfetto) of what the
// engine did, per layer and step: submit, queue wait, pack (selection / compression),
// communication, unpack / scale (decompression), done.
//
// File: POSEIDON_TIMELINE=path. With one rank the file is `path`; with several ranks every
// rank writes its own file with the rank before the extension: trace.json -> trace.rank3.json
// (trace -> trace.rank3). Each event has pid = rank and tid = layer id (threads are named after
// the layers), so the files of several ranks can be loaded together.
//
// Cost on the hot path: the engine thread appends fixed-size records to a private vector (no
// lock, no formatting, names are static strings) and hands the vector to the writer thread
// once per cycle (one mutex acquisition). The writer thread formats and writes the JSON off the
// engine thread. The file is a JSON array; Close writes the closing bracket (Chrome and
// Perfetto also accept the array unclosed if the process dies).
//
// Thread-safety: Span / Instant / Publish from one thread only (the engine thread);
// SetLayerName before the engine starts; Close from any one thread, once.
// Lock order: mu_ is a leaf lock.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/status.h"

namespace poseidon::engine {

class Timeline {
 public:
  // The file this rank writes (see above).
  static std::string FileFor(const std::string& path, int rank, int world);
  // Opens FileFor(path, rank, world) and starts the writer thread. Errors name the path.
  static Result<std::unique_ptr<Timeline>> Open(const std::string& path, int rank, int world);
  ~Timeline();  // Close()
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  const std::string& file() const { return file_; }
  void SetLayerName(int layer, const std::string& name);

  // Microseconds on a monotonic clock shared by every Timeline of the process.
  static double NowUs();
  // A complete event [begin_us, end_us) on the layer's track. `name` must be a static string.
  void Span(int layer, const char* name, int64_t step, double begin_us, double end_us);
  void Instant(int layer, const char* name, int64_t step, double ts_us);
  // Hands the events recorded so far to the writer thread.
  void Publish();
  // Publishes, waits for the writer, closes the file. Idempotent.
  Status Close();

 private:
  struct Event {
    const char* name;
    int layer;
    char phase;  // 'X' complete, 'i' instant
    int64_t step;
    double ts_us;
    double dur_us;
  };
  Timeline() = default;
  void WriterLoop();
  void Write(const std::vector<Event>& events);

  std::string file_;
  int rank_ = 0;
  std::FILE* out_ = nullptr;  // writer thread only (and Open / Close around it)
  bool wrote_any_ = false;    // writer thread only
  std::vector<Event> local_;  // engine thread only
  std::vector<std::pair<int, std::string>> names_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Event> pending_;  // guarded by mu_
  bool closing_ = false;        // guarded by mu_
  bool closed_ = false;         // guarded by mu_
  std::thread writer_;
};

}  // namespace poseidon::engine
