// Integrity accounting on the receiving side: which chunks of which stream arrived verified,
// which were duplicates or corrupt, which are missing (and which of those a sender declared
// gone), and whether each stream has ended (an end-of-stream frame on every one of its
// connections). Thread-safe.
//
// What it holds is bounded by its configuration, never by numbers inside frames: at most
// `max_streams` streams, and per stream a window of `window` sequences above the settled floor
// (every sequence below it delivered, delivered earlier, declared missing or reported corrupt).
// A frame that would take it past either is refused (admit*, on_gaps, on_end_of_stream) with the
// reason, and the receiver counts it as malformed.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "data/seqset.hpp"
#include "wire/stream_names.hpp"
#include "wire/wire.hpp"

namespace numastream {

class StreamTracker {
 public:
  enum class Verdict { delivered, duplicate, corrupt };
  static constexpr std::size_t kDefaultMaxStreams = 64;
  // Declared gaps kept per stream (adjacent ones are merged); past this a gap frame is refused.
  static constexpr std::size_t kMaxGaps = wire::kMaxDeclaredGaps;

  explicit StreamTracker(std::size_t max_streams = kDefaultMaxStreams,
                         std::uint64_t window = SeqSet::kDefaultWindow)
      : max_streams_(max_streams), window_(window), names_({}, 2 * max_streams) {}

  // Whether a data frame of `stream` with `seq` may be taken: ok, out_of_window (beyond the
  // stream's window, or at or past its announced end), too_many_streams.
  wire::DecodeError admit(std::uint32_t stream, std::uint64_t seq);
  // Whether a frame of `stream` may be held at all: ok, or too_many_streams.
  wire::DecodeError admit_stream(std::uint32_t stream);
  // A resume frame: the sender says these chunks were acknowledged before (by an earlier
  // instance of this receiver); they count as delivered earlier, not as missing. A stream this
  // receiver has not seen may start at any floor; a known one only moves within its window.
  wire::DecodeError on_resume(std::uint32_t stream, std::uint64_t floor,
                              std::span<const std::uint64_t> seqs);
  // A gap frame: the chunks will never come. They count as lost, are named, and are not waited for.
  // `missing` (if given) gets the parts of `gaps` this instance had not delivered: what is now
  // missing, and will not be delivered after.
  wire::DecodeError on_gaps(std::uint32_t stream, std::span<const wire::Gap> gaps,
                            std::vector<wire::Gap>* missing = nullptr);
  // An end-of-stream frame; refused (contradicts_stream) when its total is below what the stream
  // already holds or unlike the total another connection announced, out_of_window when beyond it.
  wire::DecodeError on_end_of_stream(const wire::Header& h, const wire::EndOfStream& eos);

  // A data frame passed the header checks (before decompression).
  void on_frame(std::uint32_t stream, std::size_t wire_bytes);
  // A chunk was decompressed; `ok` means its checksum matched.
  Verdict on_chunk(std::uint32_t stream, std::uint64_t seq, bool ok, std::size_t raw_bytes);
  // Whether a resume frame reported chunks acknowledged earlier for `stream`.
  bool resumed(std::uint32_t stream) const;
  // The first sequence at or after `seq` that no declared gap of `stream` holds (a sink waiting
  // for a chunk that will never come moves on to it).
  std::uint64_t past_gaps(std::uint32_t stream, std::uint64_t seq) const;
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
    std::uint64_t declared_missing = 0;  // of lost: declared gone by a sender (gap frames)
    std::uint64_t raw_bytes = 0, wire_bytes = 0;
    bool complete = true;  // every stream seen has ended
    bool bounded = false;  // some gap is a bound (a sender's record may be short), not exact
  };
  Totals totals() const;
  // Per stream: counts, completion, the missing sequence ranges (first `max_ranges`) and the
  // declared gaps with their reasons.
  nlohmann::json streams_json(std::size_t max_ranges = 32) const;
  // The last `n` declared gaps over every stream, named for people ("stream 3: chunks 116-145
  // (sender_restarted)"), highest stream and sequence last.
  std::vector<std::string> last_gaps(std::size_t n) const;
  // The declared gaps of a stream, ascending.
  std::vector<wire::Gap> gaps(std::uint32_t stream) const;
  // The EOS totals of a stream, once known.
  std::optional<wire::EndOfStream> end_of_stream(std::uint32_t stream) const;
  // Bytes of sequence bitmaps held now, over every stream (for tests of the bound).
  std::size_t held_bytes() const;
  // Which pipeline and which of its streams each local stream id is (stream_names.hpp).
  StreamNames& names() noexcept { return names_; }
  const StreamNames& names() const noexcept { return names_; }

 private:
  struct Stream {
    explicit Stream(std::uint64_t window) : settled(window), resumed(window) {}
    SeqSet settled;               // delivered, delivered before, declared missing or corrupt
    SeqSet resumed;               // of those, the ones a resume frame settled (delivered before)
    std::vector<wire::Gap> gaps;  // ascending, disjoint: declared and not delivered here
    std::vector<std::uint64_t>
        corrupt_seqs;  // the first kMaxGaps, to name them missing from the output
    std::uint64_t delivered = 0, duplicates = 0, corrupt = 0, unwritten = 0;
    std::uint64_t before = 0;    // acknowledged by an earlier instance (resume)
    std::uint64_t declared = 0;  // in gaps
    std::uint64_t raw_bytes = 0, wire_bytes = 0;
    std::uint64_t highest = 0;  // 1 + highest sequence delivered or corrupt
    bool known = false;         // a frame of it was taken: its floor no longer jumps
    std::set<std::uint16_t> ended;
    std::uint16_t connections = 0;
    std::optional<wire::EndOfStream> eos;
    bool complete() const { return connections > 0 && ended.size() >= connections; }
    std::uint64_t expected() const {
      return eos ? eos->total_chunks : std::max(highest, settled.end());
    }
    std::uint64_t lost() const;
    bool bounded() const;
    // The parts of `g` this instance did not deliver (a chunk a dead sender left in flight may
    // still arrive before its successor's gap frame: it is delivered, not missing).
    std::vector<wire::Gap> missing_part(const wire::Gap& g, std::uint64_t window) const;
  };
  // The stream's record, created if there is room (nullptr when max_streams are held).
  Stream* find_or_add(std::uint32_t stream);
  Stream& must(std::uint32_t stream);

  std::size_t max_streams_;
  std::uint64_t window_;
  mutable std::mutex mu_;
  std::map<std::uint32_t, Stream> streams_;
  std::optional<std::chrono::steady_clock::time_point> last_;
  StreamNames names_;
};

}  // namespace numastream
