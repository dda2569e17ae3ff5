// A sender's record of what its receiver acknowledged, kept in a directory on the node so that
// the next sender of the same stream (after a drain, a suspension, a replaced gateway) resumes
// where this one stopped, even when the receiver restarted too and remembers nothing.
//
// One sender of a stream at a time: the record's lock is held for the sender's whole life, and a
// new sender waits for the previous one to release it (it writes its final record on the way
// out). The record is replaced atomically (temporary file + rename), so a crash leaves the
// previous record, never a torn one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "wire/wire.hpp"

namespace numastream {

class StreamState {
 public:
  // Takes DIR/stream-ID.lock, waiting up to wait_s for a previous holder. Throws
  // std::runtime_error naming the path when the directory is unusable or the wait times out.
  StreamState(const std::string& dir, std::uint32_t stream, double wait_s);
  ~StreamState();
  StreamState(const StreamState&) = delete;
  StreamState& operator=(const StreamState&) = delete;

  // The acknowledged floor and the sequences above it that an earlier sender recorded; nullopt
  // when there is no record. A record of another stream or an unreadable one throws.
  std::optional<std::pair<std::uint64_t, std::vector<std::uint64_t>>> load() const;
  // The gaps the earlier senders declared (they are re-declared to a receiver that restarted).
  std::vector<wire::Gap> gaps() const;
  // Replaces the record. Throws naming the path on an I/O error.
  void save(std::uint64_t floor, const std::vector<std::uint64_t>& above,
            const std::vector<wire::Gap>& gaps = {});
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::uint32_t stream_;
  int lock_fd_ = -1;
};

// How many chunks the senders of a live source (a detector's endpoint, which cannot replay) took
// from it: DIR/stream-ID.taken, next to the acknowledged record and under its lock. The next
// sender numbers on after them, and declares what the previous one took and never had
// acknowledged as a gap: exactly, when the count is from this boot (it is written to the page
// cache before every chunk enters the pipeline, and survives a kill of the process); as a bound
// when the node restarted since (the count is fsynced in steps of kReserve: the previous sender
// took at most the reserved count).
class TakenRecord {
 public:
  static constexpr std::uint64_t kReserve = 1024;
  struct Earlier {
    std::uint64_t taken = 0;    // chunks the previous senders took (a lower bound unless exact)
    std::uint64_t at_most = 0;  // at most this many (== taken when exact)
    bool exact = true;
  };
  // Opens (creates) DIR/stream-ID.taken. Throws naming the path on an I/O error or a file that
  // is not such a record.
  TakenRecord(const std::string& dir, std::uint32_t stream);
  ~TakenRecord();
  TakenRecord(const TakenRecord&) = delete;
  TakenRecord& operator=(const TakenRecord&) = delete;
  // What the record says the earlier senders took; nullopt when there were none.
  std::optional<Earlier> earlier() const { return earlier_; }
  // `n` chunks are taken now (called before the n-th enters the pipeline). Throws on an I/O error.
  void taken(std::uint64_t n);
  const std::string& path() const { return path_; }

 private:
  void write(bool sync);
  std::string path_;
  int fd_ = -1;
  std::uint64_t taken_ = 0, reserved_ = 0;
  std::string boot_;
  std::optional<Earlier> earlier_;
};

}  // namespace numastream
