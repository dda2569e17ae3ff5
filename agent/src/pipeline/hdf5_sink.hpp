// The receiver's HDF5 sink: each stream into <path>.part (path with {stream}), a dataset of
// frames x rows x cols (the shape and pixel type from the stream's metadata frame), one frame per
// chunk at its sequence number, written with direct chunk writes: bslz4 frames as they arrived
// (the dataset declares filter 32008), other frames as pixels. Frames land where they belong
// whatever their order, so nothing is held back to reorder. Renamed to <path> when the stream
// ended complete and verified; a restarted receiver reopens the .part and skips the frames it
// holds. Internal to the agent.
#pragma once

#include <unistd.h>

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "pipeline/series_sink.hpp"
#include "pipeline/sink.hpp"
#include "store/hdf5_io.hpp"
#include "wire/tracker.hpp"
#include "wire/wire.hpp"

namespace numastream {

class Hdf5Sink final : public Sink {
 public:
  // The metadata text a stream's sender sent ("" when none arrived).
  using MetadataFn = std::function<std::string(std::uint32_t)>;
  Hdf5Sink(const Config& cfg, StreamTracker& tracker, AckFn ack, MetadataFn metadata)
      : cfg_(cfg), tracker_(tracker), ack_(std::move(ack)), metadata_(std::move(metadata)) {}

  const char* name() const override { return "hdf5"; }

  void put(Chunk c, StageStats& st) override {
    if (series_ || (outs_.empty() && carries_series(c.header.stream_id))) {
      if (!series_) {
        NxmxOptions nxmx{cfg_.sink.frames_per_file, cfg_.sink.instrument, cfg_.sink.source,
                         cfg_.sink.sample};
        series_ = std::make_unique<SeriesSink>(
            cfg_.sink.path, cfg_.sink.mode, cfg_.sink.direct_io, ack_,
            [this](std::uint32_t id) { return tracker_.resumed(id); }, outcomes_, std::move(nxmx));
      }
      series_->put(std::move(c), st);
      return;
    }
    ScopedTimer busy(st.busy_ns);
    const wire::Header& h = c.header;
    hdf5::Writer& w = open(h);
    if (!w.written().count(h.sequence)) {
      w.write_frame(h.sequence, c.payload(),
                    h.codec == Codec::bslz4 ? hdf5::Stored::bslz4 : hdf5::Stored::raw);
      dirty_.insert(h.stream_id);
    }
    // Acknowledged once the file holds it: after the next flush (a killed gateway's file then
    // opens again with every acknowledged frame in it).
    held_.add(c.via, h.stream_id, h.sequence);
    if (held_.full()) flush_and_acknowledge();
  }
  void idle(StageStats& st) override {
    if (series_) return series_->idle(st);
    ScopedTimer busy(st.busy_ns);
    flush_and_acknowledge();
  }
  void drain(StageStats& st) override { idle(st); }

  // Closes every file; publishes the complete ones. Returns those left incomplete.
  std::vector<std::string> finish() override {
    if (series_) return series_->finish();
    flush_and_acknowledge();
    std::vector<std::string> incomplete;
    auto totals = tracker_.streams_json();
    for (auto& [id, w] : outs_) {
      const std::uint64_t frames = w->written().size();
      w->close();
      bool good = false;
      for (const auto& s : totals) {
        if (s["stream_id"] == id) {
          good = s["complete"].get<bool>() && s["lost"].get<std::uint64_t>() == 0 &&
                 s["corrupt"].get<std::uint64_t>() == 0 && s["expected_chunks"].is_number() &&
                 s["expected_chunks"].get<std::uint64_t>() == frames;
        }
      }
      const std::string final_path = stream_path(cfg_.sink.path, tracker_.names().of(id));
      if (good && ::rename((final_path + ".part").c_str(), final_path.c_str()) == 0) continue;
      incomplete.push_back(final_path + ".part");
    }
    // A stream whose every frame an earlier process wrote (and acknowledged) reaches this one as
    // its end alone (a gateway killed between the two: its sender waits for the end while a
    // consumer's spill hands the stream on): the earlier process's .part is published when it
    // holds every frame the sender announced.
    for (const auto& s : totals) {
      const auto id = s["stream_id"].get<std::uint32_t>();
      const std::string final_path = stream_path(cfg_.sink.path, tracker_.names().of(id));
      const std::string part = final_path + ".part";
      if (outs_.count(id) || !s["complete"].get<bool>() || ::access(part.c_str(), F_OK) != 0)
        continue;
      std::uint64_t frames = 0;
      try {
        frames = hdf5::Reader(part, cfg_.sink.dataset).frames();
      } catch (const std::exception& e) {
        log_warn(std::string("hdf5 sink: ") + e.what());
      }
      const bool good =
          s["lost"].get<std::uint64_t>() == 0 && s["corrupt"].get<std::uint64_t>() == 0 &&
          s["expected_chunks"].is_number() && s["expected_chunks"].get<std::uint64_t>() == frames;
      if (good && ::rename(part.c_str(), final_path.c_str()) == 0) {
        log_line("hdf5 sink: " + final_path + ": the " + std::to_string(frames) +
                 " frames an earlier process wrote are the whole stream: published");
        continue;
      }
      incomplete.push_back(part);
    }
    return incomplete;
  }

  void report(nlohmann::json& summary) const override {
    if (series_) return series_->report(summary);
    // Each file's path and how it was written: "direct" (past the page cache) or "page cache".
    summary["files_io"] = io_;
  }
  void declare_metrics(MetricRegistry& m) const override { outcomes_.declare_metrics(m); }

 private:
  void flush_and_acknowledge() {
    for (auto id : dirty_) outs_.at(id)->flush();
    dirty_.clear();
    held_.release();
  }

  // A stream of Stream V2 messages (its sender reads a stream2 source): one file per series.
  bool carries_series(std::uint32_t stream) const {
    auto meta = nlohmann::json::parse(metadata_(stream), nullptr, false);
    return !meta.is_discarded() && meta.is_object() && meta.value("dtype", "") == "stream2";
  }

  hdf5::Writer& open(const wire::Header& h) {
    auto it = outs_.find(h.stream_id);
    if (it != outs_.end()) return *it->second;
    for (const auto& [held, o] : outs_) {
      if (tracker_.names().same_path(cfg_.sink.path, held, h.stream_id))
        throw std::runtime_error("hdf5 sink: a second stream (" +
                                 tracker_.names().describe(h.stream_id) +
                                 ") arrived but sink.path has no {stream} placeholder");
    }
    if (cfg_.sink.frames_per_file > 0) {
      log_warn("hdf5 sink: stream " + std::to_string(h.stream_id) +
               " carries frames, not Stream V2 series: sink.layout "
               "nxmx is for series; its frames go to one file, " +
               stream_path(cfg_.sink.path, tracker_.names().of(h.stream_id)));
    }
    const std::string text = metadata_(h.stream_id);
    auto meta = nlohmann::json::parse(text, nullptr, false);
    if (text.empty() || meta.is_discarded() || !meta.contains("dtype") || !meta.contains("shape")) {
      throw std::runtime_error("hdf5 sink: stream " + std::to_string(h.stream_id) +
                               " sent no usable metadata (pixel type and frame shape): got \"" +
                               text + "\"");
    }
    hdf5::FrameShape shape;
    shape.dtype = meta["dtype"].get<std::string>();
    shape.dims = meta["shape"].get<std::vector<std::uint64_t>>();
    if (h.raw_size != shape.frame_bytes()) {
      throw std::runtime_error("hdf5 sink: stream " + std::to_string(h.stream_id) + ": chunk " +
                               std::to_string(h.sequence) + " has " + std::to_string(h.raw_size) +
                               " bytes, a frame of its metadata " + text + " has " +
                               std::to_string(shape.frame_bytes()));
    }
    const std::string path =
        stream_path(cfg_.sink.path, tracker_.names().of(h.stream_id)) + ".part";
    const bool resume = tracker_.resumed(h.stream_id) && ::access(path.c_str(), F_OK) == 0;
    make_parent_dirs(path, cfg_.sink.mode);
    auto w = std::make_unique<hdf5::Writer>(path, cfg_.sink.dataset, shape, h.codec == Codec::bslz4,
                                            resume, cfg_.sink.direct_io);
    if (resume) {
      log_line("hdf5 sink: resuming " + path + ": " + std::to_string(w->written().size()) +
               " frames already written" + io_note(cfg_.sink.direct_io, w->direct()));
    } else if (cfg_.sink.direct_io) {
      log_line("hdf5 sink: " + path + io_note(true, w->direct()));
    }
    io_[stream_path(cfg_.sink.path, tracker_.names().of(h.stream_id))] =
        w->direct() ? "direct" : "page cache";
    return *outs_.emplace(h.stream_id, std::move(w)).first->second;
  }

  const Config& cfg_;
  StreamTracker& tracker_;
  AckFn ack_;
  MetadataFn metadata_;
  std::map<std::uint32_t, std::unique_ptr<hdf5::Writer>> outs_;
  std::map<std::string, std::string> io_;  // each file: "direct" or "page cache"
  std::set<std::uint32_t> dirty_;          // streams written since the last flush
  DeferredAcks held_{ack_};                // frames written since the last flush
  SeriesOutcomes outcomes_;                // how its Stream V2 series (series_) ended
  std::unique_ptr<SeriesSink> series_;
};

}  // namespace numastream
