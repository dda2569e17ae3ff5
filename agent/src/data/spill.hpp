// Spill: frames kept in order on node-local storage while the pipeline downstream of a sender
// falls behind a source that cannot wait (HStream's spilling, for a detector that cannot pause).
//
// Contract:
//  - first in, first out: read() hands frames back in the order append() took them;
//  - the files under `dir` never hold more than `max_bytes` (whole segment files count, read or
//    not); append() refuses a frame that would pass it, and the caller decides what that means
//    (wait, or count the frame lost);
//  - frames live in segment files (spill-<stream>-<n>.seg) of about max_bytes / 8 each; a segment
//    is deleted as soon as it has been read through, so space comes back while it drains; a
//    frame read out *held* (read(out, &token)) keeps its segment on disk until release(token):
//    for a reader that must not lose it until someone downstream has it (a consumer's spill:
//    until its sink has taken the chunk);
//  - one thread uses an instance (no locking); when it is destroyed empty its files are removed,
//    and frames it still holds stay on disk for the next process of the stream;
//  - an earlier process's frames are discarded, or recovered (a live source's next sender): the
//    records of its segments, oldest first, are read again from the start of each segment (the
//    frames it had read out and sent may come again: the caller skips what was acknowledged),
//    up to the first record that is cut short (a crash mid-write) or that the caller refuses;
//  - an I/O error other than a full disk throws std::system_error naming the file; a full disk
//    (ENOSPC) is a refused append, like the size limit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace numastream {

class SpillStore {
 public:
  // Decides on a frame an earlier process left: its first bytes (at most kRecoverHead) and its
  // size. False refuses it and every frame after it.
  using Recover = std::function<bool(std::span<const std::byte> head, std::size_t size)>;
  static constexpr std::size_t kRecoverHead = 64;
  struct Recovered {
    std::uint64_t frames = 0, bytes = 0;  // kept, to be read first
    std::uint64_t dropped_bytes = 0;      // after a cut or refused record
    std::string why_dropped;              // what ended the recovery early, naming the file
  };

  // Without `recover`, what an earlier process of the stream left is removed.
  SpillStore(std::string dir, std::uint32_t stream, std::uint64_t max_bytes,
             const Recover& recover = {});
  ~SpillStore();
  SpillStore(const SpillStore&) = delete;
  SpillStore& operator=(const SpillStore&) = delete;

  // Appends one frame; false (nothing written) when it would pass max_bytes or the disk is full.
  bool append(std::span<const std::byte> frame);
  // The same for a frame held in pieces (a header, its payload, a trailer): one record.
  bool append(std::span<const std::byte> head, std::span<const std::byte> rest,
              std::span<const std::byte> tail = {});
  // The size of the oldest frame (0 when empty).
  std::size_t next_size() const;
  // Moves the oldest frame into `out` (at least next_size() bytes); its size.
  std::size_t read(std::span<std::byte> out);
  // The same, the frame held: its segment stays on disk (and a next process recovers the frame)
  // until release(*token).
  std::size_t read(std::span<std::byte> out, std::uint64_t* token);
  void release(std::uint64_t token);

  // The last refused append was for want of disk space (ENOSPC, EDQUOT), not max_bytes.
  bool disk_full() const noexcept { return disk_full_; }
  bool empty() const noexcept { return frames_ == 0; }  // nothing left to read (held frames aside)
  std::uint64_t frames() const noexcept { return frames_; }
  std::uint64_t pending_bytes() const noexcept { return pending_; }  // frames not read yet
  std::uint64_t disk_bytes() const noexcept { return disk_; }        // segment files on disk
  std::uint64_t max_bytes() const noexcept { return max_; }
  const std::string& dir() const noexcept { return dir_; }
  const Recovered& recovered() const noexcept { return recovered_; }

 private:
  struct Segment {
    std::string path;
    int fd = -1;
    std::uint64_t write_off = 0;
    std::uint64_t read_off = 0;
    std::uint64_t id = 0;    // its number in the file name
    std::uint64_t held = 0;  // frames read out held, not released
  };
  void open_segment();
  void drop_front();
  // Index in segments_ of the segment the next frame is read from.
  std::size_t reading() const;
  // Drops the read-through segments at the front that hold no frame (the last one: starts it
  // again from its beginning).
  void trim();
  void recover(const std::vector<std::pair<std::uint64_t, std::string>>& earlier,
               const Recover& accept);

  std::string dir_;
  std::uint32_t stream_;
  std::uint64_t max_;
  std::uint64_t segment_bytes_;
  std::deque<Segment> segments_;  // oldest first; the last one is written
  std::uint64_t next_id_ = 0;
  std::uint64_t frames_ = 0;
  std::uint64_t pending_ = 0;
  std::uint64_t disk_ = 0;
  Recovered recovered_;
  bool disk_full_ = false;
};

}  // namespace numastream
