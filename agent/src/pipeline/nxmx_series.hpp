// The HDF5 sink's NXmx layout (sink.layout "nxmx"): a series as a master file and data files of
// at most frames_per_file images each, named as DECTRIS's file writer names them beside the
// master:
//   <name>_master.h5         store/nxmx_master.hpp: the metadata, links to every data file; there
//                            from the series' first message (with the start message when that
//                            comes first), rewritten whole when the start or end message comes and
//                            when the series is complete (end_time) or given up (`incomplete`)
//   <name>_data_000001.h5    images 0 .. N-1 (SeriesFile data parts); <file>.part while it is
//                            written, renamed once it holds every one of its images and closed:
//                            a reader opens the master while the series runs and reads every
//                            data file it finds by its final name
// A restarted gateway reads the master and the data files back (their records of numastream's
// sequences) and goes on. Internal to the agent.
#pragma once

#include <dirent.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "base/log.hpp"
#include "pipeline/series_store.hpp"
#include "store/nxmx_master.hpp"
#include "store/series_file.hpp"

namespace numastream {

struct NxmxOptions {
  std::uint64_t frames_per_file = 0;  // 0: the one-file layout
  std::string instrument, source, sample;
};

class NxmxSeries final : public SeriesStore {
 public:
  // `path`: the series' name from the sink's pattern ("/data/12.h5"): its master is
  // /data/12_master.h5, its data files /data/12_data_000001.h5, ...
  NxmxSeries(const std::string& path, std::uint32_t stream_id, std::uint64_t series_id,
             const std::string& series_unique_id, bool direct, unsigned mode,
             const NxmxOptions& options)
      : prefix_(prefix_of(path)), direct_(direct) {
    make_parent_dirs(path, mode);
    m_.series_id = series_id;
    m_.series_unique_id = series_unique_id;
    m_.stream_id = stream_id;
    m_.frames_per_file = options.frames_per_file;
    m_.data_prefix = base_name(prefix_);
    m_.instrument = options.instrument;
    m_.source = options.source;
    m_.sample = options.sample;
    m_.start_time = utc_now();
    // The master is written by the series' first message: whole with the start message when that
    // comes first (a reader never sees it without the detector's metadata then).
  }

  static std::string master_of(const std::string& path) { return prefix_of(path) + "_master.h5"; }

  static Probe probe(const std::string& path, std::uint64_t series_id, const std::string& unique_id,
                     std::uint32_t stream_id) {
    const std::string prefix = prefix_of(path);
    const std::string master = prefix + "_master.h5";
    if (!path_exists(master))
      return data_files(prefix).empty() ? Probe{} : Probe{Probe::State::other, {}};
    const auto m = hdf5::read_master(master);
    if (!m || m->series_id != series_id || m->series_unique_id != unique_id ||
        m->stream_id != stream_id) {
      return {Probe::State::other, {}};
    }
    if (m->end_time.empty() && m->incomplete.empty()) return {Probe::State::open, {}};
    Probe p{Probe::State::finished, {}};
    if (m->start_sequence) p.sequences.insert(*m->start_sequence);
    if (m->end_sequence) p.sequences.insert(*m->end_sequence);
    for (const auto& [k, file] : data_files(prefix)) {
      if (const auto id = hdf5::SeriesFile::identify(file))
        p.sequences.insert(id->sequences.begin(), id->sequences.end());
    }
    return p;
  }

  // An earlier gateway's series, gone on with: its master, its published data files (whole by
  // definition) and its unfinished ones (reopened).
  static std::unique_ptr<NxmxSeries> reopen(const std::string& path, bool direct) {
    const std::string prefix = prefix_of(path);
    auto m = hdf5::read_master(prefix + "_master.h5");
    if (!m) {
      throw std::runtime_error(
          prefix +
          "_master.h5: cannot be resumed (not an NXmx master numastream wrote). It and "
          "its data files hold messages an earlier gateway acknowledged and are left as they "
          "are: move them aside to write the series anew");
    }
    std::unique_ptr<NxmxSeries> s(new NxmxSeries(prefix, direct));
    s->m_ = std::move(*m);
    s->saved_ = true;
    if (s->m_.start_sequence) s->held_.insert(*s->m_.start_sequence);
    if (s->m_.end_sequence) s->held_.insert(*s->m_.end_sequence);
    s->learn_number_of_images();
    for (const auto& [k, file] : data_files(prefix)) {
      if (file.size() > 5 && file.compare(file.size() - 5, 5, ".part") == 0) {
        std::unique_ptr<hdf5::SeriesFile> f;
        try {
          f = hdf5::SeriesFile::reopen(file, direct);
        } catch (const std::exception& e) {
          // Torn by the kill (see acked_mark): without its mark no image in it was
          // acknowledged; set aside, its images come again.
          if (path_exists(acked_mark(file))) throw;
          const std::string aside = set_aside(file);
          log_warn("hdf5 sink: " + file + " cannot be reopened (" + e.what() +
                   "); no image in it was acknowledged: moved to " + aside);
          continue;
        }
        if (path_exists(acked_mark(file))) s->marked_.insert(k);
        s->held_.insert(f->sequences_held().begin(), f->sequences_held().end());
        for (const auto& [channel, ids] : f->images()) s->ids_.insert(ids.begin(), ids.end());
        s->open_.emplace(k, std::move(f));
      } else {
        if (const auto id = hdf5::SeriesFile::identify(file))
          s->held_.insert(id->sequences.begin(), id->sequences.end());
        const std::uint64_t first = (k - 1) * s->m_.frames_per_file;
        for (std::uint64_t i = first; i < first + s->capacity(k); ++i) s->ids_.insert(i);
        s->published_.insert(k);
      }
    }
    return s;
  }

  std::vector<std::string> write_start(std::span<const std::byte> message, std::uint64_t,
                                       const std::string&, std::uint64_t sequence) override {
    std::vector<std::string> skipped;
    std::string error;
    if (!stream2::walk(
            message, [](const std::string&, const stream2::Value&) {}, skipped, error)) {
      throw std::runtime_error(master() + ": the start message: " + error);
    }
    m_.start.assign(message.begin(), message.end());
    m_.start_sequence = sequence;
    held_.insert(sequence);
    learn_number_of_images();
    save();
    // The last data file's size is known now: one waiting only for it is whole.
    for (auto it = open_.begin(); it != open_.end();) it = publish_if_whole(it);
    return skipped;
  }

  void write_image(std::span<const std::byte> message, std::uint64_t image_id,
                   std::uint64_t sequence) override {
    const std::uint64_t k = hdf5::data_file_of(image_id, m_.frames_per_file);
    if (published_.count(k)) {
      // A detector that sent an image id twice: the first is in a file a reader may have open.
      log_warn("hdf5 sink: " + master() + ": image " + std::to_string(image_id) +
               " again (message " + std::to_string(sequence) + "): its data file " +
               hdf5::data_file_name(prefix_, k) +
               " is complete and published; this copy is not written");
      return;
    }
    if (!saved_) save();  // the master before any data file: what a restarted gateway looks for
    auto it = open_.find(k);
    if (it == open_.end()) {
      hdf5::SeriesFile::DataPart part;
      part.series_id = m_.series_id;
      part.series_unique_id = m_.series_unique_id;
      part.first_image = (k - 1) * m_.frames_per_file;
      part.capacity = m_.frames_per_file;
      it = open_
               .emplace(
                   k, std::make_unique<hdf5::SeriesFile>(hdf5::data_file_name(prefix_, k) + ".part",
                                                         m_.stream_id, direct_, part))
               .first;
      direct_used_ = it->second->direct();
    }
    it->second->write_image(message, image_id);
    it->second->record(sequence);
    held_.insert(sequence);
    ids_.insert(image_id);
    publish_if_whole(it);
  }

  void write_end(std::uint64_t sequence) override {
    m_.end_sequence = sequence;
    held_.insert(sequence);
    save();
  }

  std::set<std::uint64_t> image_ids() const override { return ids_; }
  bool holds_image(std::uint64_t image_id) const override { return ids_.count(image_id) > 0; }
  void flush() override {
    for (auto& [k, f] : open_) f->flush();
  }
  void mark_acknowledged() override {
    for (const auto& [k, f] : open_) {
      if (marked_.count(k) || !f->recorded()) continue;
      make_acked_mark(hdf5::data_file_name(prefix_, k) + ".part");
      marked_.insert(k);
    }
  }
  void publish() override {
    for (auto it = open_.begin(); it != open_.end();) it = publish_if_whole(it);
    if (!open_.empty()) {
      throw std::runtime_error(master() + ": data file " +
                               hdf5::data_file_name(prefix_, open_.begin()->first) +
                               " lacks images of a series taken for complete");
    }
    m_.end_time = utc_now();
    save();
  }
  void give_up(const std::string& lacks) override {
    std::string error;
    for (auto& [k, f] : open_) {
      try {
        f->mark_missing(lacks);
        f->close();
      } catch (const std::exception& e) {
        if (error.empty()) error = e.what();
      }
    }
    for (const auto& [k, f] : open_) {
      m_.unfinished.insert(k);
      remove_acked_mark(hdf5::data_file_name(prefix_, k) + ".part");
    }
    open_.clear();
    m_.incomplete = lacks;
    save();
    if (!error.empty()) throw std::runtime_error(error);
  }
  std::string published_name() const override { return master(); }
  std::string unfinished_name() const override { return master(); }
  bool direct() const override { return direct_used_; }
  std::set<std::uint64_t> sequences_held() const override { return held_; }
  std::optional<std::uint64_t> start_sequence() const override { return m_.start_sequence; }
  std::vector<std::byte> start_message() const override { return m_.start; }
  std::optional<std::uint64_t> end_sequence() const override { return m_.end_sequence; }

 private:
  NxmxSeries(std::string prefix, bool direct) : prefix_(std::move(prefix)), direct_(direct) {}

  // "/data/12.h5" -> "/data/12"
  static std::string prefix_of(const std::string& path) {
    const auto slash = path.rfind('/');
    const auto dot = path.rfind('.');
    if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return path;
    return path.substr(0, dot);
  }
  static std::string base_name(const std::string& path) {
    const auto slash = path.rfind('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
  }
  // The data files of `prefix` on disk (published or .part), by their number.
  static std::map<std::uint64_t, std::string> data_files(const std::string& prefix) {
    std::map<std::uint64_t, std::string> out;
    const auto slash = prefix.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : prefix.substr(0, slash);
    const std::string stem = base_name(prefix) + "_data_";
    DIR* d = ::opendir(dir.c_str());
    if (!d) return out;
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.compare(0, stem.size(), stem) != 0) continue;
      char* end = nullptr;
      const unsigned long long k = std::strtoull(name.c_str() + stem.size(), &end, 10);
      const std::string rest = end;
      if (k == 0 || (rest != ".h5" && rest != ".h5.part")) continue;
      const std::string file = (slash == std::string::npos ? "" : dir + "/") + name;
      // A published file wins over a .part left beside it (a rename interrupted cannot leave both).
      if (rest == ".h5" || !out.count(k)) out[k] = file;
    }
    ::closedir(d);
    return out;
  }

  std::string master() const { return prefix_ + "_master.h5"; }
  void save() {
    hdf5::write_master(master(), m_);
    saved_ = true;
  }
  void learn_number_of_images() {
    std::string error;
    if (m_.start.empty()) return;
    if (auto m = stream2::parse(m_.start, error)) number_of_images_ = m->number_of_images;
  }
  // The images data file k holds when whole.
  std::uint64_t capacity(std::uint64_t k) const {
    const std::uint64_t first = (k - 1) * m_.frames_per_file;
    if (!number_of_images_) return m_.frames_per_file;
    return *number_of_images_ <= first ? 0
                                       : std::min(m_.frames_per_file, *number_of_images_ - first);
  }
  using Open = std::map<std::uint64_t, std::unique_ptr<hdf5::SeriesFile>>::iterator;
  // Closes and publishes data file it->first when it holds each of its images; the next one.
  Open publish_if_whole(Open it) {
    const std::uint64_t k = it->first;
    const std::uint64_t first = (k - 1) * m_.frames_per_file, n = capacity(k);
    if (n == 0 || std::distance(ids_.lower_bound(first), ids_.lower_bound(first + n)) !=
                      static_cast<long>(n)) {
      return std::next(it);
    }
    it->second->close();
    const std::string name = hdf5::data_file_name(prefix_, k);
    if (std::rename((name + ".part").c_str(), name.c_str()) != 0) {
      throw std::runtime_error("hdf5 sink: rename " + name + ".part: " + errno_text(errno));
    }
    published_.insert(k);
    remove_acked_mark(name + ".part");
    marked_.erase(k);
    return open_.erase(it);
  }

  std::string prefix_;
  bool direct_ = false, direct_used_ = false;
  bool saved_ = false;  // the master is on disk
  hdf5::NxmxMaster m_;
  std::optional<std::uint64_t> number_of_images_;
  std::map<std::uint64_t, std::unique_ptr<hdf5::SeriesFile>>
      open_;                           // data files being written (.part)
  std::set<std::uint64_t> published_;  // data files whole and renamed
  std::set<std::uint64_t> ids_;        // image ids written
  std::set<std::uint64_t> held_;       // numastream sequences in the files
  std::set<std::uint64_t> marked_;     // open data files whose acked mark is made
};

}  // namespace numastream
