// The receiver's file sink and acknowledgement hand-off. Internal to the agent.
#pragma once

#include <fcntl.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/error.hpp"
#include "base/files.hpp"
#include "config/config.hpp"
#include "data/buffer_pool.hpp"
#include "data/seqset.hpp"
#include "obs/metric_catalog.hpp"
#include "pipeline/chunk.hpp"
#include "pipeline/runtime.hpp"
#include "wire/tracker.hpp"
#include "wire/wire.hpp"

namespace numastream {

// Writes each stream back in sequence order. Chunks arrive out of order (parallel decompression,
// several connections); up to `window` are held to restore the order. If the next chunk is still
// missing when the window is full, the sink moves on without it (that chunk is then lost to the
// file and reported). The file is written as <path>.part and renamed to <path> only when the
// stream ended complete and verified.
//
// A chunk the receiver has taken off the network but not yet handed to the sink is "in flight"
// (queued for, or inside, a decompressor). The sink never gives up on an in-flight chunk while it
// can still hold more (`slack` beyond the window): that chunk is certain to come, however the
// decompressing threads are scheduled. It gives up only on chunks that have not arrived at all.
class InFlight {
 public:
  void add(std::uint32_t stream, std::uint64_t seq) {
    std::lock_guard lock(mu_);
    set_.insert({stream, seq});
  }
  void remove(std::uint32_t stream, std::uint64_t seq) {
    std::lock_guard lock(mu_);
    auto it = set_.find({stream, seq});
    if (it != set_.end()) set_.erase(it);
  }
  bool contains(std::uint32_t stream, std::uint64_t seq) const {
    std::lock_guard lock(mu_);
    return set_.count({stream, seq}) > 0;
  }

 private:
  mutable std::mutex mu_;
  std::multiset<std::pair<std::uint32_t, std::uint64_t>> set_;
};

// Where a chunk is acknowledged: (connection the chunk arrived on, stream, sequence).
using AckFn = std::function<void(int, std::uint32_t, std::uint64_t)>;

// Acknowledgements a sink holds back until what it wrote is durable in its file (flushed): the
// sink adds each chunk as it writes it, and acknowledges them all after each flush. full() says
// when enough wait that the sink should flush now (the sink also flushes whenever it waits).
class DeferredAcks {
 public:
  static constexpr std::size_t kFlushEvery = 32;
  explicit DeferredAcks(AckFn ack) : ack_(std::move(ack)) {}
  void add(int via, std::uint32_t stream, std::uint64_t seq) {
    held_.push_back({via, stream, seq});
  }
  bool full() const noexcept { return held_.size() >= kFlushEvery; }
  // After a flush: every chunk held is in the file.
  void release() {
    for (const auto& h : held_) ack_(h.via, h.stream, h.seq);
    held_.clear();
  }

 private:
  struct Held {
    int via;
    std::uint32_t stream;
    std::uint64_t seq;
  };
  AckFn ack_;
  std::vector<Held> held_;
};

// Where a gateway's verified chunks go (file, hdf5, zmq). The sink thread hands it each chunk
// in the order they come; the sink acknowledges a chunk once it has it. Every call comes from
// the sink thread.
class Sink {
 public:
  virtual ~Sink() = default;
  virtual const char* name() const = 0;
  // The sink thread starts: what it will use (a socket) is opened here, by that thread.
  virtual void start() {}
  // Takes one chunk; `st` gets the time spent working or waiting on the output. Throws when the
  // sink cannot go on (an I/O error, a consumer gone).
  virtual void put(Chunk c, StageStats& st) = 0;
  // No more chunks come; the senders still read acknowledgements: write what is held.
  virtual void drain(StageStats& /*st*/) {}
  // Nothing came for a moment (the sink thread calls it every 20 ms it waits): a sink that
  // acknowledges in batches (what it has made durable) acknowledges what it holds now.
  virtual void idle(StageStats& /*st*/) {}
  // The sink thread ends (`aborted`: the run failed): what the thread opened is closed here.
  virtual void close(bool /*aborted*/) {}
  // After the run: closes the outputs, publishes the complete ones, returns those left
  // incomplete.
  virtual std::vector<std::string> finish() { return {}; }
  // Adds what the sink alone knows to the run's summary.
  virtual void report(nlohmann::json& /*summary*/) const {}
  // Declares the sink's own metric families (read from the metrics thread).
  virtual void declare_metrics(MetricRegistry& /*m*/) const {}
};

// How the Stream V2 series a gateway's sink ended, for the summary and the metrics the operator
// reads into the StreamPipeline's status: how many it completed, how many ended incomplete (its
// sender's end message says why) and the last five of those by name. Written by the sink
// thread, read by the metrics thread.
class SeriesOutcomes {
 public:
  void completed() {
    std::lock_guard lock(mu_);
    ++completed_;
  }
  void add(std::uint64_t series_id, const std::string& unique_id, const std::string& why) {
    std::lock_guard lock(mu_);
    ++count_;
    last_.push_back("series " + std::to_string(series_id) +
                    (unique_id.empty() ? "" : " (" + unique_id + ")") + ": " + why);
    if (last_.size() > 5) last_.erase(last_.begin());
  }
  void report(nlohmann::json& summary) const {
    std::lock_guard lock(mu_);
    summary["stream2_series_completed"] = completed_;
    summary["stream2_series_incomplete"] = count_;
    summary["stream2_series_incomplete_last"] = last_;
  }
  void declare_metrics(MetricRegistry& m) const {
    m.counter(metric::stream2_series_completed, [this] {
      std::lock_guard lock(mu_);
      return static_cast<double>(completed_);
    });
    m.counter(metric::stream2_series_incomplete, [this] {
      std::lock_guard lock(mu_);
      return static_cast<double>(count_);
    });
    m.add(metric::stream2_series_incomplete_last, [this](MetricSamples& s) {
      std::lock_guard lock(mu_);
      for (std::size_t i = 0; i < last_.size(); ++i)
        s.add({{"order", std::to_string(i)}, {"series", last_[i]}}, 1);
    });
  }

 private:
  mutable std::mutex mu_;
  std::uint64_t completed_ = 0;
  std::uint64_t count_ = 0;  // incomplete
  std::vector<std::string> last_;
};

class FileSink final : public Sink {
 public:
  // `stopping`: the run is ending (a drain or a failure): a sink waiting for disk space gives up.
  FileSink(
      const Config& cfg, StreamTracker& tracker, InFlight& in_flight, std::size_t window,
      std::size_t slack, AckFn ack, AckFn discard,
      std::function<bool()> stopping = [] { return false; })
      : cfg_(cfg),
        tracker_(tracker),
        in_flight_(in_flight),
        window_(window),
        slack_(slack),
        ack_(std::move(ack)),
        discard_(std::move(discard)),
        stopping_(std::move(stopping)) {}
  ~FileSink() override {
    for (auto& [id, o] : outs_) {
      if (o.fd >= 0) ::close(o.fd);
      if (o.index_fd >= 0) ::close(o.index_fd);
    }
  }

  const char* name() const override { return "file"; }

  void put(Chunk c, StageStats& st) override {
    ScopedTimer busy(st.busy_ns);
    const wire::Header h = c.header;
    Out& o = open(h.stream_id);
    if (o.written.contains(h.sequence)) {  // a retransmission of a chunk already in the file
      ack_(c.via, h.stream_id, h.sequence);
      return;
    }
    if (h.sequence < o.next || o.pending.count(h.sequence)) {
      tracker_.on_unwritten(h.stream_id, h.sequence);
      discard_(c.via, h.stream_id,
               h.sequence);  // reported lost to the file; the sender declares it gone
      return;
    }
    o.pending.emplace(h.sequence, std::move(c));
    in_flight_.remove(h.stream_id, h.sequence);
    // Out of space: held (the pool bounds how many, and the senders wait for acknowledgements)
    // and tried again now and then; nothing is given up on while the disk is full.
    if (stalled_ && std::chrono::steady_clock::now() - last_try_ < std::chrono::milliseconds(200))
      return;
    if (!flush(h.stream_id, o)) return;
    while (o.pending.size() > window_ &&
           (!in_flight_.contains(h.stream_id, o.next) || o.pending.size() > window_ + slack_)) {
      log_warn("file sink: stream " + std::to_string(h.stream_id) + ": chunk " +
               std::to_string(o.next) + " still missing with " + std::to_string(o.pending.size()) +
               " later chunks waiting; writing on without it");
      o.next = o.pending.begin()->first;
      if (!flush(h.stream_id, o)) return;
    }
  }
  // While out of space: try again. Else, chunks held for one that a gap declared since says will
  // never come are written now: the gap may be declared after them (a resumed sender's
  // connections), and no chunk may come before they are acknowledged.
  void idle(StageStats& st) override {
    if (stalled_ && std::chrono::steady_clock::now() - last_try_ < std::chrono::milliseconds(200))
      return;
    for (auto& [id, o] : outs_) {
      if (!stalled_ && (o.pending.empty() || tracker_.past_gaps(id, o.next) == o.next)) continue;
      ScopedTimer busy(st.busy_ns);
      if (!flush(id, o)) return;
    }
  }

  // Writes (and acknowledges) everything still held, gaps skipped. Called when no more chunks
  // come, while acknowledgements can still reach the senders.
  void drain(StageStats& /*st*/) override { drain(); }
  void drain() {
    for (auto& [id, o] : outs_) {
      while (!o.pending.empty()) {
        if (!stalled_) o.next = o.pending.begin()->first;
        if (flush(id, o)) continue;
        // Out of space at the end: wait for it unless the run is ending (then what is held is
        // neither written nor acknowledged, and the file stays .part).
        if (stopping_()) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    }
  }

  void report(nlohmann::json& summary) const override { summary["sink_out_of_space"] = stalls_; }
  // Publishes complete files. Returns the files left incomplete (with their index, so that a
  // restarted receiver resumes them).
  std::vector<std::string> finish() override {
    drain();
    std::vector<std::string> incomplete;
    auto totals = tracker_.streams_json();
    // A stream whose every chunk an earlier process wrote (and acknowledged) reaches this one as
    // its end alone (a gateway killed between the two: its sender waits for the end while a
    // consumer's spill hands the stream on): the earlier process's .part is resumed, and
    // published below like any other.
    for (const auto& s : totals) {
      const auto id = s["stream_id"].get<std::uint32_t>();
      if (outs_.count(id) || !s["complete"].get<bool>()) continue;
      if (::access((stream_path(cfg_.sink.path, tracker_.names().of(id)) + ".part").c_str(),
                   F_OK) == 0)
        open(id);
    }
    std::string failed;
    for (auto& [id, o] : outs_) {
      const std::string part = stream_path(cfg_.sink.path, tracker_.names().of(id)) + ".part";
      // A file is complete only when it is on the disk: a failed fsync or close (a full or
      // failing filesystem, an NFS server gone) keeps it a .part, and fails the run naming it.
      cut_unconfirmed(o, part);  // what no chunk of this stream came for
      std::string error;
      if (::fsync(o.fd) != 0) error = "fsync " + part + ": " + errno_text(errno);
      if (::close(o.fd) != 0 && error.empty()) error = "close " + part + ": " + errno_text(errno);
      o.fd = -1;
      if (::close(o.index_fd) != 0 && error.empty())
        error = "close " + part + ".idx: " + errno_text(errno);
      o.index_fd = -1;
      if (!error.empty()) {
        log_error("file sink: " + error);
        if (failed.empty()) failed = "file sink: " + error;
        incomplete.push_back(part);
        continue;
      }
      bool good = false;
      for (const auto& s : totals) {
        if (s["stream_id"] == id) {
          good = s["complete"].get<bool>() && s["lost"].get<std::uint64_t>() == 0 &&
                 s["corrupt"].get<std::uint64_t>() == 0;
        }
      }
      std::string final_path = stream_path(cfg_.sink.path, tracker_.names().of(id));
      if (good) {
        if (::rename(part.c_str(), final_path.c_str()) == 0) {
          ::unlink((part + ".idx").c_str());
          continue;
        }
        if (failed.empty()) failed = "file sink: rename " + part + ": " + errno_text(errno);
      }
      incomplete.push_back(part);
    }
    if (!failed.empty()) throw std::runtime_error(failed);
    return incomplete;
  }

 private:
  struct IndexRecord {
    std::uint64_t seq = 0;
    std::uint64_t end = 0;  // the file's length with the chunk
  };
  struct Out {
    int fd = -1;
    int index_fd = -1;  // <path>.part.idx: (sequence, file length after it) per chunk written
    std::uint64_t length = 0;
    std::uint64_t records = 0;  // index records written
    std::uint64_t next = 0;
    SeqSet written;
    std::map<std::uint64_t, Chunk> pending;
    // An earlier receiver's chunks that no resume frame vouched for (its acknowledgements never
    // reached a sender that remembers them): kept in the file as long as each chunk that arrives
    // is the one written there before; the first that differs cuts the file back to it.
    std::deque<IndexRecord> unconfirmed;
  };

  Out& open(std::uint32_t stream) {
    auto it = outs_.find(stream);
    if (it != outs_.end()) return it->second;
    for (const auto& [held, o] : outs_) {
      if (tracker_.names().same_path(cfg_.sink.path, held, stream))
        throw std::runtime_error("file sink: a second stream (" +
                                 tracker_.names().describe(stream) +
                                 ") arrived but sink.path has no {stream} placeholder");
    }
    const std::string path = stream_path(cfg_.sink.path, tracker_.names().of(stream)) + ".part";
    const std::string index = path + ".idx";
    make_parent_dirs(path, cfg_.sink.mode);
    Out o;
    // A resumed stream (its sender reports chunks acknowledged by an earlier receiver) continues
    // the earlier file: the index says which chunks it holds and how long it validly is. Any
    // other stream whose file is there keeps it unconfirmed, chunk by chunk as the same chunks
    // come again (a sender restarted with this receiver, before their acknowledgements reached
    // it; or a new run to the same path, which cuts it back at its first chunk).
    const bool earlier = ::access(path.c_str(), F_OK) == 0 && ::access(index.c_str(), F_OK) == 0;
    std::vector<IndexRecord> found = earlier ? read_index(index) : std::vector<IndexRecord>{};
    const bool resume = earlier && tracker_.resumed(stream);
    const bool unconfirmed = !resume && !found.empty();
    std::uint64_t records = 0;
    if (resume) {
      for (const IndexRecord& r : found) {
        o.written.insert(r.seq);
        o.next = r.seq + 1;
        o.length = r.end;
        ++records;
      }
    }
    // The file is opened for reading too (an unconfirmed chunk is compared with what comes
    // again); the index of an unconfirmed file starts empty and records only confirmed chunks, so
    // a receiver killed meanwhile leaves no record of a chunk no one vouched for.
    o.fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | (earlier ? 0 : O_TRUNC), 0644);
    if (o.fd < 0) throw_errno("file sink: open " + path);
    o.index_fd =
        ::open(index.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (resume ? 0 : O_TRUNC), 0644);
    if (o.index_fd < 0) throw_errno("file sink: open " + index);
    if (unconfirmed) {
      o.unconfirmed.assign(found.begin(), found.end());
      log_line("file sink: " + path + " holds " + std::to_string(found.size()) + " chunks (" +
               std::to_string(found.back().end) + " bytes) of an earlier receiver that no sender " +
               "vouched for: kept as far as the chunks that come again match them");
      return outs_.emplace(stream, std::move(o)).first->second;
    }
    // Anything past the last indexed chunk was written but never recorded: cut it off.
    if (::ftruncate(o.fd, static_cast<off_t>(o.length)) != 0 ||
        ::ftruncate(o.index_fd, static_cast<off_t>(records * 16)) != 0 ||
        ::lseek(o.fd, 0, SEEK_END) < 0 || ::lseek(o.index_fd, 0, SEEK_END) < 0) {
      throw_errno("file sink: resume " + path);
    }
    o.records = records;
    if (resume) {
      log_line("file sink: resuming " + path + ": " + std::to_string(records) + " chunks (" +
               std::to_string(o.length) + " bytes) already written");
    }
    return outs_.emplace(stream, std::move(o)).first->second;
  }

  // A file sink's index: (sequence, file length with it) per chunk, in the order written. A
  // record cut short by a kill, or one that would shorten the file, ends it.
  static std::vector<IndexRecord> read_index(const std::string& index) {
    const int fd = ::open(index.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw_errno("file sink: open " + index);
    std::vector<IndexRecord> out;
    std::array<std::uint64_t, 2> rec;
    while (::read(fd, rec.data(), sizeof(rec)) == static_cast<ssize_t>(sizeof(rec))) {
      if (!out.empty() && rec[1] < out.back().end) break;
      out.push_back({rec[0], rec[1]});
    }
    ::close(fd);
    return out;
  }

  // Whether the chunk that comes next is the earlier receiver's next unconfirmed one: the same
  // sequence, length and bytes (read back from the file, most often from the page cache).
  bool same_as_before(const Out& o, std::span<const std::byte> payload) const {
    const IndexRecord& r = o.unconfirmed.front();
    if (r.seq != o.next || r.end - o.length != payload.size()) return false;
    std::array<std::byte, 64 << 10> buf;
    for (std::size_t at = 0; at < payload.size();) {
      const std::size_t n = std::min(buf.size(), payload.size() - at);
      if (::pread(o.fd, buf.data(), n, static_cast<off_t>(o.length + at)) !=
              static_cast<ssize_t>(n) ||
          std::memcmp(buf.data(), payload.data() + at, n) != 0)
        return false;
      at += n;
    }
    return true;
  }

  // The earlier receiver's chunks from here on are not this stream's: the file is cut back to
  // what is confirmed, and written on from there.
  void cut_unconfirmed(Out& o, const std::string& part) {
    if (o.unconfirmed.empty()) return;
    log_line("file sink: " + part + ": " + std::to_string(o.unconfirmed.size()) +
             " chunks of the earlier receiver's are not this stream's (from chunk " +
             std::to_string(o.unconfirmed.front().seq) + "): cut back to " +
             std::to_string(o.length) + " bytes");
    o.unconfirmed.clear();
    if (::ftruncate(o.fd, static_cast<off_t>(o.length)) != 0 || ::lseek(o.fd, 0, SEEK_END) < 0)
      throw_errno("file sink: cut back " + part);
  }

  // False when the filesystem is full (ENOSPC, EDQUOT); any other error throws, naming the file.
  bool write_all(int fd, const std::byte* p, std::size_t left, const std::string& what) {
    while (left > 0) {
      ssize_t n = ::write(fd, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == ENOSPC || errno == EDQUOT)) return false;
      if (n < 0) throw_errno("file sink: write " + what);
      p += n;
      left -= static_cast<std::size_t>(n);
    }
    return true;
  }

  // Writes what is next in order. False when the filesystem is full: the chunk stays held,
  // unacknowledged, the file and its index cut back to the last whole record, to be tried again.
  bool flush(std::uint32_t stream, Out& o) {
    last_try_ = std::chrono::steady_clock::now();
    // Chunks a sender declared gone are not waited for (they are counted missing and named).
    o.next = tracker_.past_gaps(stream, o.next);
    while (!o.pending.empty() && o.pending.begin()->first == o.next) {
      const std::string part = stream_path(cfg_.sink.path, tracker_.names().of(stream)) + ".part";
      const auto payload = o.pending.begin()->second.payload();
      std::array<std::uint64_t, 2> rec = {o.next, o.length + payload.size()};
      bool kept = false;  // in the file already: only its record is written
      if (!o.unconfirmed.empty()) {
        kept = same_as_before(o, payload);
        if (kept) {
          o.unconfirmed.pop_front();
        } else {
          cut_unconfirmed(o, part);
        }
      }
      if ((!kept && !write_all(o.fd, payload.data(), payload.size(), part)) ||
          !write_all(o.index_fd, reinterpret_cast<const std::byte*>(rec.data()), sizeof(rec),
                     part + ".idx")) {
        if (::ftruncate(o.fd, static_cast<off_t>(o.length)) != 0 ||
            ::lseek(o.fd, 0, SEEK_END) < 0 ||
            ::ftruncate(o.index_fd, static_cast<off_t>(o.records * 16)) != 0 ||
            ::lseek(o.index_fd, 0, SEEK_END) < 0) {
          throw_errno("file sink: cut back " + part + " after running out of space");
        }
        o.unconfirmed.clear();  // cut off with the rest
        if (!stalled_) {
          log_warn("file sink: no space left for " + part + " (chunk " + std::to_string(o.next) +
                   "): holding what arrives, unacknowledged, until space returns");
          ++stalls_;
        }
        stalled_ = true;
        return false;
      }
      if (stalled_) {
        log_line("file sink: space returned for " + part + ": writing on from chunk " +
                 std::to_string(o.next));
        stalled_ = false;
      }
      Chunk c = std::move(o.pending.begin()->second);
      o.pending.erase(o.pending.begin());
      o.length += payload.size();
      ++o.records;
      // The earlier receiver's last chunk confirmed: what it wrote past it was never recorded.
      if (kept && o.unconfirmed.empty() &&
          (::ftruncate(o.fd, static_cast<off_t>(o.length)) != 0 || ::lseek(o.fd, 0, SEEK_END) < 0))
        throw_errno("file sink: resume " + part);
      o.written.insert(o.next);
      ack_(c.via, stream, o.next);
      o.next = tracker_.past_gaps(stream, o.next + 1);
    }
    return true;
  }

  const Config& cfg_;
  StreamTracker& tracker_;
  InFlight& in_flight_;
  std::size_t window_;
  std::size_t slack_;
  AckFn ack_;
  AckFn discard_;  // settled without being kept: the sender declares it gone to later gateways
  std::function<bool()> stopping_;
  bool stalled_ = false;  // out of space: chunks held, tried again every 200 ms
  std::uint64_t stalls_ = 0;
  std::chrono::steady_clock::time_point last_try_{};
  std::map<std::uint32_t, Out> outs_;
};

// Acknowledgements on their way to the receiving thread that owns the connection's socket
// (ZeroMQ sockets belong to one thread). Posting wakes that thread through an eventfd it polls.
class AckBox {
 public:
  struct Pending {
    std::uint64_t floor = 0;
    std::vector<std::uint64_t> seqs;
    std::uint32_t flags = 0;
    std::vector<std::uint64_t> discarded;  // settled without being kept (wire::kAckDiscarded)
  };
  AckBox() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    if (fd_ < 0) throw_errno("eventfd");
  }
  ~AckBox() { ::close(fd_); }
  AckBox(const AckBox&) = delete;
  AckBox& operator=(const AckBox&) = delete;

  void post(std::uint32_t stream, std::uint64_t floor, std::span<const std::uint64_t> seqs,
            std::uint32_t flags, bool discarded = false) {
    {
      std::lock_guard lock(mu_);
      Pending& p = pending_[stream];
      p.floor = std::max(p.floor, floor);
      auto& to = discarded ? p.discarded : p.seqs;
      to.insert(to.end(), seqs.begin(), seqs.end());
      p.flags |= flags;
      // The receiving thread is woken once for what gathers until it takes it, not once per
      // chunk: at a fast detector's message rates a wake-up costs more than the ack.
      if (std::exchange(signaled_, true)) return;
    }
    std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(fd_, &one, sizeof(one));
  }
  // Everything posted so far. (A wake-up may find the box empty: what woke it was taken before.)
  std::map<std::uint32_t, Pending> take() {
    std::uint64_t count;
    [[maybe_unused]] auto n = ::read(fd_, &count, sizeof(count));
    std::lock_guard lock(mu_);
    signaled_ = false;
    return std::exchange(pending_, {});
  }
  bool empty() const {
    std::lock_guard lock(mu_);
    return pending_.empty();
  }
  int fd() const noexcept { return fd_; }

 private:
  int fd_;
  mutable std::mutex mu_;
  std::map<std::uint32_t, Pending> pending_;
  bool signaled_ = false;  // written to fd_ since the last take()
};

}  // namespace numastream
