// Where the HDF5 sink keeps one Stream V2 series (series_sink.hpp): the files of one layout.
// `OneFileSeries`: one NeXus-style file, <path>.part while the series runs, renamed to <path>
// when it is complete. The sink decides what a series lacks; a store writes, records which of
// numastream's messages it holds (what lets a restarted gateway go on) and publishes.
// Internal to the agent.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "base/files.hpp"
#include "store/series_file.hpp"

namespace numastream {

inline bool path_exists(const std::string& p) {
  struct stat sb;
  return ::stat(p.c_str(), &sb) == 0;
}

// A series file's mark that it holds a message whose acknowledgement went out (<file>.acked beside
// it): made before the first such acknowledgement, removed once the file is published or given
// up. HDF5 rewrites a file's metadata in place, and a gateway killed in the middle of a flush can
// leave a file it cannot reopen: without the mark, nothing in it was acknowledged (the sender
// sends it all again), and it is set aside and made anew; with it, the gateway stops, naming it.
inline std::string acked_mark(const std::string& file) { return file + ".acked"; }
inline void make_acked_mark(const std::string& file) {
  const int fd = ::open(acked_mark(file).c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0) {
    throw std::runtime_error("hdf5 sink: create " + acked_mark(file) + ": " + errno_text(errno));
  }
  ::close(fd);
}
inline void remove_acked_mark(const std::string& file) { std::remove(acked_mark(file).c_str()); }
// Renames an unfinished file out of the way (to <file>.damaged, -2, ...); returns the new name.
inline std::string set_aside(const std::string& file) {
  std::string aside = file + ".damaged";
  for (int n = 2; path_exists(aside); ++n) aside = file + ".damaged-" + std::to_string(n);
  if (std::rename(file.c_str(), aside.c_str()) != 0)
    throw std::runtime_error("hdf5 sink: rename " + file + " to " + aside + ": " +
                             errno_text(errno));
  return aside;
}

class SeriesStore {
 public:
  virtual ~SeriesStore() = default;
  // The start message: its fields stored. Returns the fields that could not be (for the log).
  virtual std::vector<std::string> write_start(std::span<const std::byte> message,
                                               std::uint64_t series_id,
                                               const std::string& series_unique_id,
                                               std::uint64_t sequence) = 0;
  virtual void write_image(std::span<const std::byte> message, std::uint64_t image_id,
                           std::uint64_t sequence) = 0;
  virtual void write_end(std::uint64_t sequence) = 0;
  // The image ids written (any channel).
  virtual std::set<std::uint64_t> image_ids() const = 0;
  // Whether image `image_id` is written (any channel).
  virtual bool holds_image(std::uint64_t image_id) const = 0;
  // What is written so far reaches the files, and the record of the messages they hold.
  virtual void flush() = 0;
  // Before the acknowledgement of what the last flush recorded: each file holding a recorded
  // message carries its acked mark.
  virtual void mark_acknowledged() = 0;
  // The series is complete: its files are closed and take their final names.
  virtual void publish() = 0;
  // The series will not be complete: its files are closed, marked with what it lacks.
  virtual void give_up(const std::string& lacks) = 0;
  // What a person opens: the final name once published, else the name it has while unfinished.
  virtual std::string published_name() const = 0;
  virtual std::string unfinished_name() const = 0;
  // Written past the page cache (asked for and allowed by the filesystem).
  virtual bool direct() const = 0;
  // A store reopened from an earlier gateway's files: the messages it holds, the start message's
  // sequence and bytes (empty when it had not come), the end message's sequence.
  virtual std::set<std::uint64_t> sequences_held() const = 0;
  virtual std::optional<std::uint64_t> start_sequence() const = 0;
  virtual std::vector<std::byte> start_message() const = 0;
  virtual std::optional<std::uint64_t> end_sequence() const = 0;
};

// What a candidate name holds for a series (the sink picks the first name that is free, or that
// an earlier gateway of the same stream left for this series).
struct Probe {
  enum class State { free, other, finished, open } state = State::free;
  std::set<std::uint64_t> sequences;  // finished: the messages its files hold
};

class OneFileSeries final : public SeriesStore {
 public:
  OneFileSeries(const std::string& path, std::uint32_t stream_id, bool direct, unsigned mode)
      : path_(path) {
    make_parent_dirs(path, mode);
    file_ = std::make_unique<hdf5::SeriesFile>(path + ".part", stream_id, direct);
  }
  // An earlier gateway's <path>.part, written on.
  static std::unique_ptr<OneFileSeries> reopen(const std::string& path, bool direct) {
    std::unique_ptr<OneFileSeries> s(new OneFileSeries(path));
    s->file_ = hdf5::SeriesFile::reopen(path + ".part", direct);
    s->marked_ = path_exists(acked_mark(path + ".part"));
    return s;
  }
  static Probe probe(const std::string& path, std::uint64_t series_id, const std::string& unique_id,
                     std::uint32_t stream_id) {
    const bool done = path_exists(path), part = path_exists(path + ".part");
    if (!done && !part) return {};
    const auto id = hdf5::SeriesFile::identify(done ? path : path + ".part");
    // Made by a gateway killed before any message of it was flushed there: nothing in it was
    // acknowledged, and the series is made anew at this name.
    if (!id && !done && hdf5::SeriesFile::records_nothing(path + ".part")) return {};
    if (!id || id->series_id != series_id || id->series_unique_id != unique_id ||
        (id->stream_id && *id->stream_id != stream_id)) {
      return {Probe::State::other, {}};
    }
    if (done || id->marked_incomplete) return {Probe::State::finished, id->sequences};
    return {Probe::State::open, {}};
  }

  std::vector<std::string> write_start(std::span<const std::byte> message, std::uint64_t series_id,
                                       const std::string& series_unique_id,
                                       std::uint64_t sequence) override {
    auto skipped = file_->write_start(message, series_id, series_unique_id, sequence);
    file_->record(sequence);
    return skipped;
  }
  void write_image(std::span<const std::byte> message, std::uint64_t image_id,
                   std::uint64_t sequence) override {
    file_->write_image(message, image_id);
    file_->record(sequence);
  }
  void write_end(std::uint64_t sequence) override {
    file_->write_end(sequence);
    file_->record(sequence);
  }
  std::set<std::uint64_t> image_ids() const override {
    std::set<std::uint64_t> ids;
    for (const auto& [channel, written] : file_->images())
      ids.insert(written.begin(), written.end());
    return ids;
  }
  bool holds_image(std::uint64_t image_id) const override {
    for (const auto& [channel, written] : file_->images())
      if (written.count(image_id) > 0) return true;
    return false;
  }
  void flush() override { file_->flush(); }
  void mark_acknowledged() override {
    if (marked_ || !file_->recorded()) return;
    make_acked_mark(path_ + ".part");
    marked_ = true;
  }
  void publish() override {
    file_->close();
    if (std::rename((path_ + ".part").c_str(), path_.c_str()) != 0) {
      throw std::runtime_error("hdf5 sink: rename " + path_ + ".part: " + errno_text(errno));
    }
    remove_acked_mark(path_ + ".part");
  }
  void give_up(const std::string& lacks) override {
    std::string error;
    try {
      file_->mark_missing(lacks);
    } catch (const std::exception& e) {
      error = e.what();
    }
    file_->close();
    remove_acked_mark(path_ + ".part");
    if (!error.empty()) throw std::runtime_error(error);
  }
  std::string published_name() const override { return path_; }
  std::string unfinished_name() const override { return path_ + ".part"; }
  bool direct() const override { return file_->direct(); }
  std::set<std::uint64_t> sequences_held() const override { return file_->sequences_held(); }
  std::optional<std::uint64_t> start_sequence() const override { return file_->start_sequence(); }
  std::vector<std::byte> start_message() const override { return file_->start_message(); }
  std::optional<std::uint64_t> end_sequence() const override { return file_->end_sequence(); }

 private:
  explicit OneFileSeries(std::string path) : path_(std::move(path)) {}
  std::string path_;
  std::unique_ptr<hdf5::SeriesFile> file_;
  bool marked_ = false;  // its acked mark is made
};

}  // namespace numastream
