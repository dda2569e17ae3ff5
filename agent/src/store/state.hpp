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
  // Replaces the record. Throws naming the path on an I/O error.
  void save(std::uint64_t floor, const std::vector<std::uint64_t>& above);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::uint32_t stream_;
  int lock_fd_ = -1;
};

}  // namespace numastream
