// Integrity accounting on the receiving side: which chunks of which stream arrived verified,
// which were duplicates or corrupt, which are missing, and whether each stream has ended (an
// end-of-stream frame on every one of its connections). Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <vector>

#include <nlohmann/json.hpp>

#include "wire/wire.hpp"

namespace numastream {

class StreamTracker {
 public:
  enum class Verdict { delivered, duplicate, corrupt };

  // A data frame passed the header checks (before decompression).
  void on_frame(std::uint32_t stream, std::size_t wire_bytes);
  // A chunk was decompressed; `ok` means its checksum matched.
  Verdict on_chunk(std::uint32_t stream, std::uint64_t seq, bool ok, std::size_t raw_bytes);
  void on_end_of_stream(const wire::Header& h, const wire::EndOfStream& eos);
  // A resume frame: the sender says these chunks were acknowledged before (by an earlier
  // instance of this receiver); they count as delivered earlier, not as missing.
  void on_resume(std::uint32_t stream, std::uint64_t floor, std::span<const std::uint64_t> seqs);
  // Whether a resume frame reported chunks acknowledged earlier for `stream`.
  bool resumed(std::uint32_t stream) const;
  // A delivered chunk that the sink could not keep (e.g. it arrived after the file sink gave up
  // waiting for it); it then counts as lost.
  void on_unwritten(std::uint32_t stream, std::uint64_t seq);

  // Streams that received an end-of-stream frame on every connection.
  int complete_streams() const;
  bool started() const;
  std::chrono::steady_clock::time_point last_activity() const;

  struct Totals {
    std::uint64_t delivered = 0, duplicates = 0, corrupt = 0, lost = 0, unwritten = 0;
    std::uint64_t delivered_before = 0;  // acknowledged by an earlier instance
    std::uint64_t raw_bytes = 0, wire_bytes = 0;
    bool complete = true;  // every stream seen has ended
  };
  Totals totals() const;
  // Per stream: counts, completion and the missing sequence ranges (first `max_ranges`).
  nlohmann::json streams_json(std::size_t max_ranges = 32) const;
  // The EOS totals of a stream, once known.
  std::optional<wire::EndOfStream> end_of_stream(std::uint32_t stream) const;

 private:
  struct Stream {
    std::vector<std::uint64_t> seen;  // bitmap of delivered sequence numbers
    std::uint64_t delivered = 0, duplicates = 0, corrupt = 0, unwritten = 0;
    std::uint64_t before = 0;  // acknowledged by an earlier instance (resume)
    std::uint64_t raw_bytes = 0, wire_bytes = 0;
    std::uint64_t highest = 0;  // 1 + highest sequence seen
    std::set<std::uint16_t> ended;
    std::uint16_t connections = 0;
    std::optional<wire::EndOfStream> eos;
    bool complete() const { return connections > 0 && ended.size() >= connections; }
    bool has(std::uint64_t seq) const {
      std::size_t w = seq / 64;
      return w < seen.size() && (seen[w] >> (seq % 64)) & 1u;
    }
    std::uint64_t expected() const { return eos ? eos->total_chunks : highest; }
    std::uint64_t lost() const;
  };
  mutable std::mutex mu_;
  std::map<std::uint32_t, Stream> streams_;
  std::optional<std::chrono::steady_clock::time_point> last_;
};

}  // namespace numastream
