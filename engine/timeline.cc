// Timeline writer: the engine thread buffers records; a writer thread formats Chrome-trace JSON.
#include "engine/timeline.h"

#include <pthread.h>

#include <chrono>
#include <cinttypes>

namespace poseidon::engine {

std::string Timeline::FileFor(const std::string& path, int rank, int world) {
  if (world <= 1) return path;
  const std::string tag = StrCat(".rank", rank);
  const size_t slash = path.find_last_of('/');
  const size_t dot = path.find_last_of('.');
  // An extension is a dot after the first character of the file name (".hidden" has none).
  const size_t name_start = slash == std::string::npos ? 0 : slash + 1;
  if (dot != std::string::npos && dot > name_start) {
    return path.substr(0, dot) + tag + path.substr(dot);
  }
  return path + tag;
}

Result<std::unique_ptr<Timeline>> Timeline::Open(const std::string& path, int rank, int world) {
  PSD_REQUIRE_ARG(!path.empty(), "Timeline::Open: empty path; expected a file path");
  std::unique_ptr<Timeline> t(new Timeline());
  t->file_ = FileFor(path, rank, world);
  t->rank_ = rank;
  t->out_ = std::fopen(t->file_.c_str(), "w");
  PSD_REQUIRE_ARG(t->out_ != nullptr, "Timeline::Open: cannot write POSEIDON_TIMELINE file '",
                  t->file_, "'; expected a writable path");
  std::fputs("[\n", t->out_);
  std::fprintf(t->out_,
               "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
               "\"args\":{\"name\":\"poseidon rank %d\"}}",
               rank, rank);
  t->wrote_any_ = true;
  t->writer_ = std::thread([p = t.get()] { p->WriterLoop(); });
  return t;
}

Timeline::~Timeline() { (void)Close(); }

double Timeline::NowUs() {
  using Clock = std::chrono::steady_clock;
  static const Clock::time_point origin = Clock::now();
  return std::chrono::duration<double, std::micro>(Clock::now() - origin).count();
}

void Timeline::SetLayerName(int layer, const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  names_.emplace_back(layer, name);
}

void Timeline::Span(int layer, const char* name, int64_t step, double begin_us, double end_us) {
  local_.push_back(Event{name, layer, 'X', step, begin_us, end_us - begin_us});
}

void Timeline::Instant(int layer, const char* name, int64_t step, double ts_us) {
  local_.push_back(Event{name, layer, 'i', step, ts_us, 0});
}

void Timeline::Publish() {
  if (local_.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_.empty()) {
      pending_.swap(local_);
    } else {
      pending_.insert(pending_.end(), local_.begin(), local_.end());
    }
  }
  local_.clear();
  cv_.notify_one();
}

void Timeline::WriterLoop() {
  pthread_setname_np(pthread_self(), "psd-timeline");
  std::vector<Event> batch;
  std::vector<std::pair<int, std::string>> names;
  for (;;) {
    bool closing;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return closing_ || !pending_.empty() || !names_.empty(); });
      batch.swap(pending_);
      names.swap(names_);
      closing = closing_;  // everything published before closing_ was set is in this batch
    }
    for (const auto& [layer, name] : names) {
      std::fprintf(out_,
                   ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
                   "\"args\":{\"name\":\"layer %d %s\"}}",
                   rank_, layer, layer, name.c_str());
    }
    names.clear();
    Write(batch);
    batch.clear();
    if (closing) return;
  }
}

void Timeline::Write(const std::vector<Event>& events) {
  for (const Event& e : events) {
    if (e.phase == 'X') {
      std::fprintf(out_,
                   ",\n{\"name\":\"%s\",\"cat\":\"engine\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,"
                   "\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"step\":%" PRId64 "}}",
                   e.name, rank_, e.layer, e.ts_us, e.dur_us, e.step);
    } else {
      std::fprintf(out_,
                   ",\n{\"name\":\"%s\",\"cat\":\"engine\",\"ph\":\"i\",\"s\":\"t\",\"pid\":%d,"
                   "\"tid\":%d,\"ts\":%.3f,\"args\":{\"step\":%" PRId64 "}}",
                   e.name, rank_, e.layer, e.ts_us, e.step);
    }
  }
}

Status Timeline::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return Status::Ok();
    closed_ = true;
  }
  Publish();  // before closing_, so the writer's last batch holds every event
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
  }
  cv_.notify_one();
  if (writer_.joinable()) writer_.join();
  if (out_ == nullptr) return Status::Ok();
  std::fputs("\n]\n", out_);
  const bool failed = std::ferror(out_) != 0;
  std::fclose(out_);
  out_ = nullptr;
  PSD_REQUIRE(!failed, StatusCode::kInternal, "Timeline::Close: writing '", file_, "' failed");
  return Status::Ok();
}

}  // namespace poseidon::engine
