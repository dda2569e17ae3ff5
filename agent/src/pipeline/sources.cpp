#include "pipeline/sources.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>

#include "base/error.hpp"
#include "codec/dtype.hpp"
#include "codec/synth.hpp"
#include "detector/stream2.hpp"
#include "net/transport.hpp"
#include "obs/metric_catalog.hpp"

namespace numastream {
namespace {

namespace fs = std::filesystem;

// What the chunks are when no file says: the configuration, and synthetic projections are rows
// of 2560 pixels.
hdf5::FrameShape configured_shape(const Config& cfg) {
  hdf5::FrameShape shape;
  shape.dtype = cfg.source.dtype;
  const std::size_t elem = dtype_size(shape.dtype);
  const std::size_t row = SynthParams{}.width * elem;
  if (!cfg.source.shape.empty()) {
    shape.dims = cfg.source.shape;
  } else if (cfg.source.kind == SourceConfig::Kind::synthetic && cfg.chunk_bytes % row == 0) {
    shape.dims = {cfg.chunk_bytes / row, SynthParams{}.width};
  } else {
    shape.dims = {cfg.chunk_bytes / elem};
  }
  return shape;
}

// Deterministic projections (seed), one copy on each NUMA node that compresses, so compression
// reads local memory; generated once, then copied. A chunk names a projection; nothing is read.
class SyntheticSource final : public Source {
 public:
  explicit SyntheticSource(const SourceSetup& s) : cfg_(s.cfg) {
    SynthParams params;
    params.seed = cfg_.source.seed;
    params.chunk_bytes = cfg_.chunk_bytes;
    params.frames = cfg_.source.frames;
    params.flat_field = cfg_.source.flat_field;
    // With a change: a second set of the same projections under the other beam.
    const int sets = cfg_.source.change_at > 0 ? 2 : 1;
    const std::vector<Buffer*>* first = nullptr;
    for (int node : s.compress_nodes) {
      pools_.push_back(std::make_unique<BufferPool>(
          "frames-node" + std::to_string(node), static_cast<std::size_t>(sets * cfg_.source.frames),
          cfg_.chunk_bytes, node));
      std::vector<Buffer*> set;
      for (int f = 0; f < sets * cfg_.source.frames; ++f) {
        Buffer* b = pools_.back()->acquire();
        b->size = cfg_.chunk_bytes;
        if (!first) {
          SynthParams p = params;
          if (f >= cfg_.source.frames) p.flat_field = cfg_.source.change_flat_field;
          generate_projection(p, f % cfg_.source.frames, {b->data, b->size});
        } else {
          std::memcpy(b->data, (*first)[static_cast<std::size_t>(f)]->data, b->size);
        }
        set.push_back(b);
      }
      frames_.emplace_back(node, std::move(set));
      first = &frames_.front().second;
    }
  }
  hdf5::FrameShape shape() const override { return configured_shape(cfg_); }
  bool has_end() const override { return cfg_.source.chunks > 0; }
  bool read(RawChunk& c, StageStats&, const std::function<bool()>&) override {
    if (cfg_.source.chunks > 0 && c.seq >= cfg_.source.chunks) return false;
    c.frame = static_cast<int>(c.seq % static_cast<std::uint64_t>(cfg_.source.frames));
    if (cfg_.source.change_at > 0 && c.seq >= cfg_.source.change_at) c.frame += cfg_.source.frames;
    return true;
  }
  std::size_t skip(std::uint64_t seq) override {
    return cfg_.source.chunks > 0 && seq >= cfg_.source.chunks ? 0 : cfg_.chunk_bytes;
  }
  std::span<const std::byte> bytes(const RawChunk& c, int node) const override {
    const std::vector<Buffer*>* set = nullptr;
    for (const auto& [n, frames] : frames_) {
      if (n == node || !set) set = &frames;
    }
    return {(*set)[static_cast<std::size_t>(c.frame)]->data, cfg_.chunk_bytes};
  }

 private:
  const Config& cfg_;
  std::vector<std::unique_ptr<BufferPool>> pools_;
  std::vector<std::pair<int, std::vector<Buffer*>>> frames_;  // node -> frames
};

// Sources that read into buffers of their own pool (on the source thread's node).
class ReadingSource : public Source {
 public:
  ReadingSource(const SourceSetup& s, std::size_t capacity,
                BufferPool::Touch touch = BufferPool::Touch::now)
      : pool_("raw", s.buffers, capacity, s.source_node, touch) {}
  void close() override { pool_.close(); }

 protected:
  // A buffer to read into; empty once the pool is closed. Waiting for one is time blocked on
  // the output (the compressors hold them all).
  PooledBuffer take(StageStats& st) {
    ScopedTimer wait(st.blocked_output_ns);
    return pool_.take();
  }
  BufferPool pool_;
};

// One file or a directory of regular files (sorted by name), cut into chunk_bytes chunks.
class FileSource final : public ReadingSource {
 public:
  // Its buffers are written only where a file cannot be mapped.
  explicit FileSource(const SourceSetup& s)
      : ReadingSource(s, s.cfg.chunk_bytes, BufferPool::Touch::on_use), cfg_(s.cfg) {
    const std::string& path = cfg_.source.path;
    std::error_code ec;
    if (fs::is_directory(path, ec)) {
      for (const auto& e : fs::directory_iterator(path, ec)) {
        if (e.is_regular_file()) files_.push_back(e.path().string());
      }
      std::sort(files_.begin(), files_.end());
      if (files_.empty()) throw ConfigError("source.path", "directory " + path + " holds no files");
    } else if (fs::is_regular_file(path, ec)) {
      files_.push_back(path);
    } else {
      throw ConfigError("source.path", path + " is not a readable file or directory");
    }
    open_next();
  }
  ~FileSource() override {
    if (fd_ >= 0) ::close(fd_);
  }
  hdf5::FrameShape shape() const override { return configured_shape(cfg_); }
  bool has_end() const override { return true; }
  // A chunk of at most the buffer's capacity, never across two files (a file's last chunk may be
  // short): a view of the mapped file, or read into the buffer where it is not mapped.
  bool read(RawChunk& c, StageStats& st, const std::function<bool()>&) override {
    c.buffer = take(st);  // also where the file is mapped: bounds the chunks in flight
    if (!c.buffer) return false;
    ScopedTimer busy(st.busy_ns);
    const std::size_t n = next_chunk(c.buffer->capacity);
    if (n == 0) return false;
    if (map_) {
      c.mapped = MappedView(map_, off_, n);
    } else {
      read_exactly(c.buffer->data, n);
    }
    c.buffer->size = n;
    off_ += n;
    return true;
  }
  std::size_t skip(std::uint64_t) override {
    const std::size_t n = next_chunk(cfg_.chunk_bytes);
    off_ += n;
    return n;
  }

 private:
  // The next chunk's length in the current file, the next file opened when it is done; 0 at the
  // end of the last file.
  std::size_t next_chunk(std::size_t cap) {
    while (fd_ >= 0 && off_ >= size_) open_next();
    return fd_ < 0 ? 0 : std::min<std::size_t>(cap, size_ - off_);
  }
  void read_exactly(std::byte* out, std::size_t n) {
    for (std::size_t got = 0; got < n;) {
      const ssize_t r = ::pread(fd_, out + got, n - got, static_cast<off_t>(off_ + got));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw_errno("read " + files_[index_]);
      if (r == 0) throw std::runtime_error(cut_short_message(files_[index_], size_));
      got += static_cast<std::size_t>(r);
    }
  }
  void open_next() {
    if (fd_ >= 0) {
      map_.reset();
      ::close(fd_);
      fd_ = -1;
      ++index_;
    }
    if (index_ >= files_.size()) return;
    const std::string& path = files_[index_];
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw_errno("open " + path);
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw_errno("stat " + path);
    size_ = static_cast<std::size_t>(st.st_size);
    off_ = 0;
    map_ = MappedFile::map(fd_, size_, path);
  }

  const Config& cfg_;
  std::vector<std::string> files_;
  std::size_t index_ = 0;
  int fd_ = -1;
  std::size_t size_ = 0;  // the current file's, when opened: what is read of it
  std::size_t off_ = 0;   // where its next chunk starts
  std::shared_ptr<const MappedFile> map_;
};

// One chunk per frame along the first axis of an HDF5 dataset. Frames stored with a filter the
// agent speaks (bslz4) are read with direct chunk reads and sent as stored.
class Hdf5Source final : public ReadingSource {
 public:
  Hdf5Source(const SourceSetup& s, std::unique_ptr<hdf5::Reader> h5)
      : ReadingSource(s, std::max(s.cfg.chunk_bytes, h5->max_read_bytes())), h5_(std::move(h5)) {}
  static std::unique_ptr<Source> open(const SourceSetup& s) {
    const Config& cfg = s.cfg;
    std::unique_ptr<hdf5::Reader> h5;
    try {
      h5 = std::make_unique<hdf5::Reader>(cfg.source.path, cfg.source.dataset);
    } catch (const std::exception& e) {
      throw ConfigError("source.path", e.what());
    }
    if (h5->shape().frame_bytes() > cfg.chunk_bytes) {
      throw ConfigError("chunk_bytes", "a frame of " + cfg.source.path + ":" + cfg.source.dataset +
                                           " has " + std::to_string(h5->shape().frame_bytes()) +
                                           " bytes, more than chunk_bytes (" +
                                           std::to_string(cfg.chunk_bytes) + ")");
    }
    if (s.log) s.log("source " + cfg.source.path + ":" + cfg.source.dataset + ": " + h5->layout());
    return std::make_unique<Hdf5Source>(s, std::move(h5));
  }
  hdf5::FrameShape shape() const override { return h5_->shape(); }
  bool has_end() const override { return true; }
  bool read(RawChunk& c, StageStats& st, const std::function<bool()>&) override {
    if (c.seq >= h5_->frames()) return false;
    c.buffer = take(st);
    if (!c.buffer) return false;
    ScopedTimer busy(st.busy_ns);
    c.buffer->size = h5_->read_frame(c.seq, {c.buffer->data, c.buffer->capacity});
    if (h5_->stored() == hdf5::Stored::bslz4) {
      c.as_is = true;
      c.stored = Codec::bslz4;
      c.raw_size = h5_->shape().frame_bytes();
    }
    return c.buffer->size > 0;
  }
  std::size_t skip(std::uint64_t seq) override {
    return seq < h5_->frames() ? h5_->shape().frame_bytes() : 0;
  }

 private:
  std::unique_ptr<hdf5::Reader> h5_;
};

// Sources that pull messages from a detector's PUSH socket (connected to, PULL), one message per
// chunk, kept in the message ZeroMQ received (nothing copied). Live: what they sent cannot be
// asked for again. The socket (and its monitor, when the source watches the connection) is made and
// closed by the source thread, which alone uses it.
class PullingSource : public Source {
 public:
  PullingSource(const SourceSetup& s, zmq::Context& ctx, bool monitored)
      : cfg_(s.cfg), ctx_(ctx), monitored_(monitored) {}
  bool has_end() const override { return false; }
  bool replays() const override { return false; }
  std::size_t skip(std::uint64_t) override { return 0; }
  std::chrono::steady_clock::time_point waiting_since() const override {
    return waiting_since_.value_or(std::chrono::steady_clock::now());
  }
  void end() override {
    mon_.reset();
    sock_.reset();
  }

 protected:
  // The next message into `m`. False when `stop` says so. `on_idle` runs when the monitor has news
  // and no message waits; when it returns true, receive returns true with `m` empty for the caller
  // to look again. Throws on a socket error, and when a message is larger than chunk_bytes (`what`
  // names it in the message): nothing is dropped silently.
  bool receive(zmq::Message& m, StageStats& st, const std::function<bool()>& stop, const char* what,
               const std::function<bool()>& on_idle = {}) {
    if (!sock_) {
      sock_.emplace(ctx_, ZMQ_PULL);
      sock_->set_int(ZMQ_RCVHWM, cfg_.hwm);
      sock_->set_int(ZMQ_LINGER, 0);
      if (monitored_) mon_.emplace(ctx_, *sock_, "source");
      sock_->connect(cfg_.source.endpoint);
    }
    waiting_since_ = std::chrono::steady_clock::now();
    // `stop` is asked after a look at the socket that found no message, never before one: a
    // thread that was not scheduled for a while (a loaded node) reads what came meanwhile before
    // a drain may take the time for the detector's silence.
    while (true) {
      zmq_pollitem_t items[] = {{sock_->get(), 0, ZMQ_POLLIN, 0},
                                {mon_ ? mon_->get() : nullptr, 0, ZMQ_POLLIN, 0}};
      int ready;
      {
        ScopedTimer wait(st.blocked_input_ns);
        ready = zmq_poll(items, mon_ ? 2 : 1, 50);
      }
      // Messages sent before a disconnect are read first; then the monitor's news.
      zmq::Message got;
      if (ready <= 0 || !got.receive(*sock_)) {
        if (ready > 0 && mon_ && (items[1].revents & ZMQ_POLLIN) && on_idle && on_idle()) {
          m = zmq::Message();
          waiting_since_.reset();
          return true;
        }
        if (stop()) return false;
        continue;
      }
      if (got.bytes().size() > cfg_.chunk_bytes) {
        throw std::runtime_error(std::string(what) + " of " + std::to_string(got.bytes().size()) +
                                 " bytes from " + cfg_.source.endpoint +
                                 " is larger than chunk_bytes (" +
                                 std::to_string(cfg_.chunk_bytes) + "): raise chunk_bytes");
      }
      m = std::move(got);
      waiting_since_.reset();
      return true;
    }
  }

  const Config& cfg_;
  zmq::Context& ctx_;
  bool monitored_;
  std::optional<zmq::Socket> sock_;
  std::optional<zmq::Monitor> mon_;  // declared after sock_: closed before it
  // Set while receive waits (a message may already be there: the first poll tells).
  std::optional<std::chrono::steady_clock::time_point> waiting_since_;
};

// One chunk per message from an upstream PUSH socket; an empty message ends the stream.
class ZmqSource final : public PullingSource {
 public:
  ZmqSource(const SourceSetup& s, zmq::Context& ctx) : PullingSource(s, ctx, false) {}
  hdf5::FrameShape shape() const override { return configured_shape(cfg_); }
  bool read(RawChunk& c, StageStats& st, const std::function<bool()>& stop) override {
    c.message.emplace();
    return receive(*c.message, st, stop, "a chunk") && !c.message->bytes().empty();
  }
};

// A DECTRIS Stream V2 detector: a PULL socket connected to its PUSH socket; every CBOR message
// (start, image, end) is one chunk, carried byte for byte as it came, in the message it came in:
// the frames stay compressed as the detector compressed them. Each message is parsed only to
// follow the series; one that is not a Stream V2 message is counted, named in the log and not
// sent. Series follow series; the source ends only when the sender is stopped. Live: what it sent
// cannot be asked for again.
class Stream2Source final : public PullingSource {
 public:
  Stream2Source(const SourceSetup& s, zmq::Context& ctx)
      : PullingSource(s, ctx, true), log_(s.log) {}
  hdf5::FrameShape shape() const override {
    hdf5::FrameShape shape;
    shape.dtype = "stream2";  // messages, not pixels: a sink that stores frames reads the series
    shape.dims = {cfg_.chunk_bytes};
    return shape;
  }
  bool read(RawChunk& c, StageStats& st, const std::function<bool()>& stop) override {
    c.message.emplace();
    zmq::Message& m = *c.message;
    while (true) {
      if (!pending_end_.empty()) {
        // The end of a series the detector left unfinished: numastream's own (see
        // watch_connection).
        m = zmq::Message::of(pending_end_);
        pending_end_.clear();
        c.as_is = true;
        c.stored = Codec::none;
        c.raw_size = m.bytes().size();
        return true;
      }
      if (!receive(m, st, stop, "a Stream V2 message", [this] { return watch_connection(); }))
        return false;
      const auto bytes = m.bytes();
      if (bytes.empty()) continue;
      ScopedTimer busy(st.busy_ns);
      std::string error;
      auto parsed = stream2::parse(bytes, error);
      if (!parsed) {
        if (malformed_++ < 3 && log_) {
          log_("stream2: dropped a message that is not Stream V2 (" + error + ", " +
               std::to_string(bytes.size()) + " bytes)");
        }
        continue;
      }
      follow(*parsed);
      c.as_is = true;
      c.stored = Codec::none;
      c.raw_size = bytes.size();
      return true;
    }
  }
  void report(nlohmann::json& summary) const override {
    summary["stream2"] = {
        {"series_started", started_},
        {"series_ended", ended_},
        {"images", images_},
        {"series_incomplete", incomplete_.load()},
        {"detector_disconnects", disconnects_},
        {"malformed", malformed_.load()},
        {"series_open", open_ ? nlohmann::json(*open_) : nlohmann::json(nullptr)}};
  }
  void declare_metrics(MetricRegistry& m) const override {
    m.counter(metric::stream2_messages_malformed,
              [this] { return static_cast<double>(malformed_.load()); });
    m.counter(metric::stream2_series_incomplete,
              [this] { return static_cast<double>(incomplete_.load()); });
  }

 private:
  // The detector's connection went down: a series it had open cannot be complete (what it had
  // queued towards us went with the connection). Said, counted, the series closed, and an end
  // message of numastream's sent for it, saying why (stream2::build_end): the gateway's sinks
  // report the series incomplete, consumers written for the detector close it. True when that
  // end message waits to be sent.
  bool watch_connection() {
    const int before = mon_->disconnects();
    mon_->drain();
    if (mon_->disconnects() == before) return false;
    disconnects_ += static_cast<std::uint64_t>(mon_->disconnects() - before);
    if (!open_) {
      if (log_)
        log_("stream2: the detector at " + cfg_.source.endpoint + " disconnected between series");
      return false;
    }
    ++incomplete_;
    const std::string why = "the detector at " + cfg_.source.endpoint + " disconnected after " +
                            std::to_string(series_images_) + " images, before its end message";
    if (log_) log_("stream2: series " + std::to_string(*open_) + " is INCOMPLETE: " + why);
    pending_end_ = stream2::build_end(*open_, open_unique_, why);
    open_.reset();
    series_images_ = 0;
    return true;
  }

  // Series bookkeeping, for the log and the summary: which series is open, how many images it has.
  void follow(const stream2::Message& m) {
    const std::string name = std::to_string(m.series_id) +
                             (m.series_unique_id.empty() ? "" : " (" + m.series_unique_id + ")");
    if (m.type == stream2::Type::start) {
      if (open_ && log_)
        log_("stream2: series " + std::to_string(*open_) + " had no end message before series " +
             name);
      open_ = m.series_id;
      open_unique_ = m.series_unique_id;
      series_images_ = 0;
      ++started_;
      if (log_) log_("stream2: series " + name + " started");
    } else if (m.type == stream2::Type::image) {
      ++images_;
      ++series_images_;
    } else {
      ++ended_;
      if (log_)
        log_("stream2: series " + name + " ended after " + std::to_string(series_images_) +
             " images");
      open_.reset();
      series_images_ = 0;
    }
  }

  std::function<void(const std::string&)> log_;
  std::atomic<std::uint64_t> malformed_{0}, incomplete_{0};
  std::uint64_t disconnects_ = 0;
  std::uint64_t started_ = 0, ended_ = 0, images_ = 0, series_images_ = 0;
  std::optional<std::uint64_t> open_;
  std::string open_unique_;
  std::vector<std::byte> pending_end_;
};

}  // namespace

std::unique_ptr<Source> make_source(const SourceSetup& s, zmq::Context& ctx) {
  switch (s.cfg.source.kind) {
    case SourceConfig::Kind::synthetic:
      return std::make_unique<SyntheticSource>(s);
    case SourceConfig::Kind::file:
      return std::make_unique<FileSource>(s);
    case SourceConfig::Kind::hdf5:
      return Hdf5Source::open(s);
    case SourceConfig::Kind::zmq:
      return std::make_unique<ZmqSource>(s, ctx);
    case SourceConfig::Kind::stream2:
      return std::make_unique<Stream2Source>(s, ctx);
  }
  throw ConfigError("source.kind", "unknown source");
}

}  // namespace numastream
