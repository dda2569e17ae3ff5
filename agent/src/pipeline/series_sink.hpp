// The gateway's HDF5 sink for Stream V2 series (a stream whose sender reads a `stream2` source):
// one NeXus/NXmx-style file per series (store/series_file.hpp), each channel's images written as
// the detector compressed them, the start message's fields beside them. Messages are written as
// they come, whatever their order; a series is complete when its start and end messages and every
// message between them (a series' messages are consecutive in the stream) are in the file: then
// <file>.part is renamed to <file>. A series still open when the run ends stays .part and is
// reported incomplete with what it lacks. Internal to the agent.
#pragma once

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "base/error.hpp"
#include "config/config.hpp"
#include "detector/stream2.hpp"
#include "pipeline/nxmx_series.hpp"
#include "pipeline/series_store.hpp"
#include "pipeline/sink.hpp"

namespace numastream {

// How an HDF5 file the sink opened is written, for its log line: "" unless sink.io asked for
// direct I/O.
inline std::string io_note(bool asked, bool direct) {
  if (!asked) return "";
  return direct ? " (direct I/O: past the page cache)"
                : " (its filesystem refuses direct I/O: written through the page cache)";
}

class SeriesSink {
 public:
  // `resumed`: whether a stream's sender reports chunks an earlier gateway acknowledged (then a
  // series file that gateway left is this stream's to go on writing).
  // `direct`: series files written past the page cache where the filesystem allows.
  // `incomplete`: where series that end incomplete are recorded (the owning sink's metrics).
  // `nxmx`: the NXmx layout (a master and data files, nxmx_series.hpp) when its frames_per_file
  // is set, else one file per series.
  SeriesSink(std::string pattern, unsigned mode, bool direct, AckFn ack,
             std::function<bool(std::uint32_t)> resumed, SeriesOutcomes& outcomes,
             NxmxOptions nxmx = {})
      : pattern_(std::move(pattern)),
        mode_(mode),
        direct_(direct),
        nxmx_(std::move(nxmx)),
        ack_(std::move(ack)),
        resumed_(std::move(resumed)),
        outcomes_(outcomes) {}

  void put(Chunk c, StageStats& st) {
    ScopedTimer busy(st.busy_ns);
    const wire::Header& h = c.header;
    const std::span<const std::byte> bytes = c.payload();
    std::string error;
    auto m = stream2::parse(bytes, error);
    if (!m) {
      // The sender parsed it before sending it: this is not what the sender sent.
      throw std::runtime_error("hdf5 sink: message " + std::to_string(h.sequence) + " of stream " +
                               std::to_string(h.stream_id) + " is not Stream V2: " + error);
    }
    const Key key{m->series_id, m->series_unique_id};
    Series* found = series(key, h);
    if (!found) {  // already in a file an earlier gateway of the stream finished
      held_.add(c.via, h.stream_id, h.sequence);
      return;
    }
    Series& s = *found;
    if (!s.seqs.insert(h.sequence).second) {  // a retransmission of a message already written
      held_.add(c.via, h.stream_id, h.sequence);
      if (m->type == stream2::Type::end && !s.end_seq) {  // in a file of an earlier version
        s.end_seq = h.sequence;
        s.incomplete = m->incomplete;
      }
      // An earlier gateway may have written every message and been killed before it published
      // the series: the retransmissions then bring nothing new, and the series ends here.
      end_if_whole(key, s);
      return;
    }
    switch (m->type) {
      case stream2::Type::start:
        s.start_seq = h.sequence;
        s.number_of_images = m->number_of_images;
        for (const auto& skipped :
             s.store->write_start(bytes, m->series_id, m->series_unique_id, h.sequence)) {
          log_line("hdf5 sink: series " + s.name + ": start field " + skipped +
                   " not stored (no HDF5 form)");
        }
        break;
      case stream2::Type::image:
        if (s.store->holds_image(m->image_id)) {
          // The image is in the file but its message is not in the file's record: a gateway
          // killed after writing the image and before recording it, the message now sent
          // again (or a detector that sent an image id twice). Written again in its place,
          // counted once.
          log_line("hdf5 sink: series " + s.name + ": image " + std::to_string(m->image_id) +
                   " (message " + std::to_string(h.sequence) +
                   ") is already in the file: written again in its place");
        } else {
          ++s.images;
        }
        s.store->write_image(bytes, m->image_id, h.sequence);
        break;
      case stream2::Type::end:
        s.end_seq = h.sequence;
        s.incomplete = m->incomplete;
        s.store->write_end(h.sequence);
        break;
    }
    st.chunks++;
    st.bytes_out += bytes.size();
    // Acknowledged once flushed to the file (or the file closed).
    held_.add(c.via, h.stream_id, h.sequence);
    if (held_.full()) flush_and_acknowledge();
    end_if_whole(key, s);
  }

  // Nothing came for a moment: what is written is flushed and acknowledged.
  void idle(StageStats& st) {
    ScopedTimer busy(st.busy_ns);
    flush_and_acknowledge();
  }

  // Series still open: their files stay .part; returns them with what they lack.
  std::vector<std::string> finish() {
    flush_and_acknowledge();
    std::vector<std::string> incomplete = given_up_;
    for (auto& [key, s] : open_) {
      std::string lacks;
      if (!s.start_seq) lacks = "no start message";
      if (!s.end_seq) lacks += std::string(lacks.empty() ? "" : ", ") + "no end message";
      if (s.start_seq && s.end_seq) {
        lacks = std::to_string(*s.end_seq - *s.start_seq + 1 - s.seqs.size()) + " of " +
                std::to_string(*s.end_seq - *s.start_seq + 1) + " messages missing";
      }
      if (const std::string images = missing_images(s); !images.empty()) lacks += "; " + images;
      try {
        s.store->give_up(lacks);
      } catch (const std::exception& e) {
        log_error(std::string("hdf5 sink: ") + e.what());
      }
      incomplete.push_back(s.store->unfinished_name() + " (series " + s.name + ": " + lacks + ", " +
                           std::to_string(s.images) + " images written)");
      done_.push_back({{"series_id", key.first},
                       {"series_unique_id", key.second},
                       {"file", s.store->unfinished_name()},
                       {"images", s.images},
                       {"complete", false},
                       {"lacks", lacks}});
      outcomes_.add(key.first, key.second, lacks);
    }
    open_.clear();
    return incomplete;
  }

  void report(nlohmann::json& summary) const {
    summary["stream2_series"] = done_;
    outcomes_.report(summary);
  }

 private:
  void flush_and_acknowledge() {
    for (auto& [key, s] : open_) {
      s.store->flush();
      s.store->mark_acknowledged();
    }
    held_.release();
  }

  using Key = std::pair<std::uint64_t, std::string>;  // series_id, series_unique_id
  struct Series {
    std::string name;
    std::unique_ptr<SeriesStore> store;
    std::optional<std::uint64_t> start_seq, end_seq;
    std::set<std::uint64_t> seqs;
    std::uint64_t images = 0;
    std::string incomplete;  // why, from the sender's end message, or the image ids missing
    std::optional<std::uint64_t> number_of_images;  // as the start message says
  };

  // The image ids a series lacks, named ("image ids 12-40, 77 missing (30 of 100)"), from the
  // start message's number_of_images and the ids written (any channel); empty when none.
  static std::string missing_images(const Series& s) {
    if (!s.number_of_images) return {};
    const std::set<std::uint64_t> ids = s.store->image_ids();
    const std::uint64_t n = *s.number_of_images;
    std::string out;
    std::uint64_t missing = 0;
    int ranges = 0;
    for (std::uint64_t id = 0; id < n;) {
      auto next = ids.lower_bound(id);
      if (next != ids.end() && *next == id) {
        // Skip the run of ids present.
        while (next != ids.end() && *next == id && id < n) {
          ++next;
          ++id;
        }
        continue;
      }
      const std::uint64_t last = std::min(n, next == ids.end() ? n : *next) - 1;
      missing += last - id + 1;
      if (ranges++ < 16) {
        out += (out.empty() ? "" : ", ") + std::to_string(id) +
               (last > id ? "-" + std::to_string(last) : "");
      }
      id = last + 1;
    }
    if (ranges > 16) out += ", ...";
    const auto beyond = static_cast<std::uint64_t>(std::distance(ids.lower_bound(n), ids.end()));
    if (missing == 0 && beyond == 0) return {};
    std::string text;
    if (missing > 0) {
      text = "image ids " + out + " missing (" + std::to_string(missing) + " of " +
             std::to_string(n) + ")";
    }
    if (beyond > 0) {
      text += (text.empty() ? "" : "; ") + std::to_string(beyond) +
              " images with ids past number_of_images " + std::to_string(n);
    }
    return text;
  }

  // The files of a series id: the sink path with {series} replaced by the series id (or the id
  // added before the extension), then "-2", "-3", ... for a series id seen again (a detector
  // restarted, a replay). Each candidate in turn until `pick` returns true.
  template <typename Pick>
  std::string first_candidate(std::uint64_t series_id, Pick pick) const {
    std::string p = stream_path(pattern_, StreamNames::Name{});
    const std::string id = std::to_string(series_id);
    if (auto pos = p.find("{series}"); pos != std::string::npos) {
      p.replace(pos, 8, id);
    } else {
      auto dot = p.rfind('.');
      if (dot == std::string::npos || p.find('/', dot) != std::string::npos) dot = p.size();
      p.insert(dot, "_series_" + id);
    }
    std::string candidate = p;
    for (int n = 2; !pick(candidate); ++n) {
      auto dot = p.rfind('.');
      if (dot == std::string::npos || p.find('/', dot) != std::string::npos) dot = p.size();
      candidate = p.substr(0, dot) + "-" + std::to_string(n) + p.substr(dot);
    }
    return candidate;
  }

  // The open series of a message; a new one for a series this gateway has not seen. An earlier
  // gateway's unfinished files of the series (same series ids, same stream) are reopened and
  // written on. When the stream is resumed (its sender reports chunks an earlier gateway
  // acknowledged), a message already in a file it finished (published, or given up) is a
  // retransmission: nullptr.
  Series* series(const Key& key, const wire::Header& h) {
    auto it = open_.find(key);
    if (it != open_.end()) return &it->second;
    const bool resumed = resumed_ && resumed_(h.stream_id);
    bool reopen = false;
    bool retransmission = false;
    const std::string path = first_candidate(key.first, [&](const std::string& c) {
      const Probe p = nxmx() ? NxmxSeries::probe(c, key.first, key.second, h.stream_id)
                             : OneFileSeries::probe(c, key.first, key.second, h.stream_id);
      if (p.state == Probe::State::free) return true;
      if (p.state == Probe::State::other) return false;
      if (p.state == Probe::State::finished) {
        retransmission = resumed && p.sequences.count(h.sequence) > 0;
        return retransmission;
      }
      // Unfinished, of this series and stream: a gateway killed while writing it. Written on
      // even when it acknowledged nothing (the sender sends everything again, or, if it died
      // too, declares missing what the file may still hold).
      reopen = true;
      return true;
    });
    if (retransmission) {
      log_line("hdf5 sink: message " + std::to_string(h.sequence) + " of series " +
               std::to_string(key.first) + " is already in " +
               (nxmx() ? NxmxSeries::master_of(path) + "'s files"
                       : path + (path_exists(path) ? "" : ".part")) +
               " (an earlier gateway's): acknowledged again");
      return nullptr;
    }
    Series s;
    s.name = std::to_string(key.first) + (key.second.empty() ? "" : " (" + key.second + ")");
    if (reopen && !nxmx()) {
      try {
        s.store = OneFileSeries::reopen(path, direct_);
      } catch (const std::exception& e) {
        // A write torn by the kill left a file HDF5 cannot go on with. Without its acked mark
        // nothing in it was acknowledged: it is set aside, and the series made anew at its
        // name. With it, it may hold acknowledged messages: stop, naming it.
        if (path_exists(acked_mark(path + ".part"))) throw;
        const std::string aside = set_aside(path + ".part");
        log_warn("hdf5 sink: series " + s.name + ": " + path + ".part cannot be reopened (" +
                 e.what() + "); no message in it was acknowledged: moved to " + aside +
                 ", the series written anew");
        reopen = false;
      }
    } else if (reopen) {
      s.store = NxmxSeries::reopen(path, direct_);
    }
    if (reopen) {
      const std::set<std::uint64_t> held = s.store->sequences_held();
      s.seqs = held;
      s.start_seq = s.store->start_sequence();
      s.end_seq = s.store->end_sequence();
      const std::vector<std::byte> start = s.store->start_message();
      std::string error;
      if (auto m = stream2::parse(start, error); m && !start.empty())
        s.number_of_images = m->number_of_images;
      s.images = s.store->image_ids().size();
      log_line("hdf5 sink: series " + s.name + " resumed in " + s.store->unfinished_name() +
               ", written by an earlier gateway (" + std::to_string(s.seqs.size()) + " messages, " +
               std::to_string(s.images) + " images)" + io_note(direct_, s.store->direct()));
    } else {
      if (nxmx()) {
        s.store = std::make_unique<NxmxSeries>(path, h.stream_id, key.first, key.second, direct_,
                                               mode_, nxmx_);
      } else {
        s.store = std::make_unique<OneFileSeries>(path, h.stream_id, direct_, mode_);
      }
      log_line("hdf5 sink: series " + s.name + " -> " + s.store->published_name() +
               io_note(direct_, s.store->direct()));
    }
    return &open_.emplace(key, std::move(s)).first->second;
  }

  // Once every message numastream carried of a series is in its files, the series ends:
  // published, or given up when the detector's own numbering says an image is missing (frames a
  // detector queued for a sender that died never got a sequence). `s` is gone after.
  void end_if_whole(const Key& key, Series& s) {
    if (!s.start_seq || !s.end_seq || s.seqs.size() != *s.end_seq - *s.start_seq + 1) return;
    if (s.incomplete.empty()) s.incomplete = missing_images(s);
    if (s.incomplete.empty()) {
      publish(key);
    } else {
      give_up(key);
    }
    flush_and_acknowledge();  // its file is closed: what it holds is in it
  }

  // A series its detector left unfinished: the file stays .part, reported with why.
  void give_up(const Key& key) {
    Series& s = open_.at(key);
    s.store->give_up(s.incomplete);
    log_warn("hdf5 sink: series " + s.name + " is INCOMPLETE (" + s.incomplete + "): " +
             s.store->unfinished_name() + " holds its " + std::to_string(s.images) + " images");
    outcomes_.add(key.first, key.second, s.incomplete);
    given_up_.push_back(s.store->unfinished_name() + " (series " + s.name + ": " + s.incomplete +
                        ", " + std::to_string(s.images) + " images written)");
    done_.push_back({{"series_id", key.first},
                     {"series_unique_id", key.second},
                     {"file", s.store->unfinished_name()},
                     {"images", s.images},
                     {"complete", false},
                     {"lacks", s.incomplete}});
    open_.erase(key);
  }

  void publish(const Key& key) {
    Series& s = open_.at(key);
    s.store->publish();
    log_line("hdf5 sink: series " + s.name + " complete: " + s.store->published_name() + " (" +
             std::to_string(s.images) + " images)");
    outcomes_.completed();
    done_.push_back({{"series_id", key.first},
                     {"series_unique_id", key.second},
                     {"file", s.store->published_name()},
                     {"images", s.images},
                     {"complete", true}});
    open_.erase(key);
  }

  bool nxmx() const { return nxmx_.frames_per_file > 0; }

  std::string pattern_;
  unsigned mode_;
  bool direct_;
  NxmxOptions nxmx_;
  AckFn ack_;
  std::function<bool(std::uint32_t)> resumed_;
  DeferredAcks held_{ack_};  // written, not yet flushed: acknowledged by the next flush
  std::map<Key, Series> open_;
  nlohmann::json done_ = nlohmann::json::array();
  std::vector<std::string> given_up_;
  SeriesOutcomes& outcomes_;  // the sink's: its metrics read it from another thread
};

}  // namespace numastream
