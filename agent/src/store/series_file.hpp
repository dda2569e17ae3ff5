// One series of a Stream V2 detector as a NeXus/NXmx-style HDF5 file, written as the messages
// come (in any order):
//   /entry                       NXentry; attributes series_id, series_unique_id
//   /entry/data                  NXdata; one dataset per channel ("threshold_1", ...): images x
//                                rows x cols, one image per chunk at its image_id, each chunk the
//                                bytes the detector sent (direct chunk writes; the dataset declares
//                                filter 32008 for bslz4 or 32004 for lz4, as received)
//   /entry/instrument/detector   NXdetector; the start message's fields (numbers, text, arrays,
//                                nested maps as groups: pixel_mask/threshold_1, goniometer/...),
//                                and the start message itself, byte for byte (stream2_start);
//                                start_time, stop_time, real_time: each image's, in seconds (the
//                                image messages' rationals; @start their series_date), by image
//                                (a data file's: by its images; it has only these under the
//                                detector)
//   /entry/numastream            NXcollection; `sequences`: numastream's sequence of every message
//                                the file holds (flushed with it), attributes stream_id,
//                                start_sequence and end_sequence: what lets a restarted gateway
//                                go on writing it
// Only one thread of a process uses HDF5 (see hdf5_io.hpp).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "detector/stream2.hpp"

namespace numastream::hdf5 {

class SeriesFile {
 public:
  // Creates `path` (truncating it) for stream `stream_id`'s series; `direct`: written past the
  // page cache where the filesystem allows (direct_io.hpp).
  SeriesFile(const std::string& path, std::uint32_t stream_id, bool direct = false);
  // A data file of an NXmx series (store/nxmx_master.hpp): images first_image ..
  // first_image + capacity - 1 of the series, at /entry/data/<channel>[image_id - first_image],
  // the first channel also as /entry/data/data (attributes image_nr_low and image_nr_high, from
  // 1, as DECTRIS's data files have); no detector metadata (the master file holds it).
  struct DataPart {
    std::uint64_t series_id = 0;
    std::string series_unique_id;
    std::uint64_t first_image = 0, capacity = 0;
  };
  SeriesFile(const std::string& path, std::uint32_t stream_id, bool direct, const DataPart& part);
  // Opens a series file an earlier gateway left (`path`, a .part) to go on writing it: its
  // channels, the image ids and the sequences it holds. Throws, naming the file and saying it is
  // left as it is, when it does not open.
  static std::unique_ptr<SeriesFile> reopen(const std::string& path, bool direct = false);
  // Which series a file holds, read without writing it; nullopt when it is not a readable series
  // file.
  struct Identity {
    std::uint64_t series_id = 0;
    std::string series_unique_id;
    std::optional<std::uint32_t> stream_id;  // absent in files of earlier versions
    bool marked_incomplete = false;          // /entry has `incomplete`: the series was given up
    std::set<std::uint64_t> sequences;       // the messages it holds
  };
  static std::optional<Identity> identify(const std::string& path);
  // Whether a file is a series file whose record holds no message (a gateway made it and was
  // killed before the first of its messages was flushed there: none was acknowledged).
  static bool records_nothing(const std::string& path);
  ~SeriesFile();
  // Whether the file is written past the page cache (asked for and allowed by its filesystem).
  bool direct() const;
  SeriesFile(const SeriesFile&) = delete;
  SeriesFile& operator=(const SeriesFile&) = delete;

  // The start message: its fields under /entry/instrument/detector, itself as stream2_start.
  // Returns the fields that could not be stored (named for the log).
  std::vector<std::string> write_start(std::span<const std::byte> message, std::uint64_t series_id,
                                       const std::string& series_unique_id, std::uint64_t sequence);
  // Every channel of an image message at `image_id`. Throws, naming the channel, when an image's
  // shape, type or compression differs from the channel's first image.
  void write_image(std::span<const std::byte> message, std::uint64_t image_id);
  // Images written, per channel.
  const std::map<std::string, std::set<std::uint64_t>>& images() const noexcept { return written_; }
  // The end message's sequence, kept with the file (a restarted gateway knows the series' length).
  void write_end(std::uint64_t sequence);
  // A message written (start, image or end), by numastream's sequence: stored at the next flush.
  void record(std::uint64_t sequence) { pending_.push_back(sequence); }
  // A reopened file's: the sequences it held, the start message's sequence and its bytes.
  const std::set<std::uint64_t>& sequences_held() const noexcept { return held_; }
  std::optional<std::uint64_t> start_sequence() const noexcept { return start_sequence_; }
  std::optional<std::uint64_t> end_sequence() const noexcept { return end_sequence_; }
  // Whether the file's record on disk names a message (after a flush, or as reopened).
  bool recorded() const noexcept { return stored_ > 0; }
  const std::vector<std::byte>& start_message() const noexcept { return start_message_; }
  // Marks the file as not complete: /entry attribute `incomplete` says what it lacks (e.g. "image
  // ids 12-40, 77 missing (30 of 100)") or why its detector left it unfinished; what a reader
  // checks before trusting a .part series file.
  void mark_missing(const std::string& missing);
  // What is written so far reaches the file (a process killed after it leaves a file that opens).
  void flush();
  void close();

 private:
  struct Channel {
    long long dset = -1;
    std::vector<std::uint64_t> dims;
    std::string dtype;
    stream2::Compression compression = stream2::Compression::none;
    std::uint64_t extent = 0;
  };
  Channel& channel(const std::string& name, const stream2::Array& a);
  void write_field(const std::string& path, const stream2::Value& v);
  void store_sequences();
  void create(std::uint32_t stream_id, bool direct, bool detector);
  // What reopen() reads back: the file's own record (sequences, the data part, the start
  // message), then each channel (`left`: what the error says of the file when one does not open).
  void read_record();
  void read_channels(const std::string& left);

  SeriesFile() = default;
  std::string creating_name() const;
  void take_name();
  std::string path_;
  long long sequences_ = -1;  // /entry/numastream/sequences
  std::uint64_t stored_ = 0;  // its length
  std::vector<std::uint64_t> pending_;
  std::set<std::uint64_t> held_;
  std::optional<std::uint64_t> start_sequence_, end_sequence_;
  std::vector<std::byte> start_message_;
  long long file_ = -1;
  std::map<std::string, Channel> channels_;
  std::map<std::string, std::set<std::uint64_t>> written_;
  std::optional<DataPart> part_;  // a data file of an NXmx series
};

}  // namespace numastream::hdf5
